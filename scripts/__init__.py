"""Developer scripts; `scripts.devcluster` is importable for the tests (the rest are executables)."""
