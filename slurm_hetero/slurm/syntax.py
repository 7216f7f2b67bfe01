"""Values as Slurm's config syntax takes them. Pure."""

from __future__ import annotations

import re

_FEATURE_BAD = re.compile(r"[^A-Za-z0-9_.]")


def feature(label: str) -> str:
    """A Slurm-safe node feature name (anything but letters, digits, `_` and `.` becomes `_`)."""
    return _FEATURE_BAD.sub("_", label)


def gres_size(mib: int) -> str:
    """A memory size as Slurm counts it (`320G`, `23374M`)."""
    return f"{mib // 1024}G" if mib % 1024 == 0 else f"{mib}M"
