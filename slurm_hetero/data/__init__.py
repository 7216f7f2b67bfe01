"""Package data. Files that live elsewhere in the checkout (job_submit/, docs/launch.md) reach a
wheel here through pyproject's force-include."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def bundled(name: str, checkout_path: str) -> str:
    """Data file `name` as packaged, else the checkout's `checkout_path`; OSError when neither."""
    packaged = resources.files(__name__).joinpath(name)
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    return (CHECKOUT / checkout_path).read_text(encoding="utf-8")
