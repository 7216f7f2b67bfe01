"""What runs on compute nodes (discover, health, task-prolog, launch) must run on Python 3.9, the
system Python of openEuler 22.03 and RHEL 9. The console script imports every command, so the
whole package is checked with vermin (`enum.StrEnum`, `match`, `datetime.UTC`, `zip(strict=)`,
runtime `X | Y`... are 3.10+); slurm_hetero.compat holds the 3.11 StrEnum behind a version check."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "slurm_hetero"


def test_package_runs_on_python_3_9() -> None:
    vermin = shutil.which("vermin")
    command = [vermin] if vermin else [sys.executable, "-m", "vermin"]
    try:
        done = subprocess.run(
            [*command, "--target=3.9-", "--no-tips", "--violations", "--eval-annotations", str(PACKAGE)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except FileNotFoundError:
        pytest.skip("vermin not installed (pip install -e .[dev])")
    if "No module named vermin" in done.stderr:
        pytest.skip("vermin not installed (pip install -e .[dev])")
    assert done.returncode == 0, done.stdout + done.stderr


def test_requires_python_says_3_9() -> None:
    text = (PACKAGE.parent / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.9"' in text and "pyslurm" not in text
    assert (PACKAGE.parent / "LICENSE").read_text().lstrip().startswith("Apache License")
