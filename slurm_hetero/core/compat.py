"""What the suite uses from Python releases newer than 3.9 (openEuler 22.03 and RHEL 9 ship 3.9):
compute nodes run discover, health, task-prolog and launch with the system Python."""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum  # novermin (3.11+ only, guarded)
else:

    class StrEnum(str, Enum):
        """`enum.StrEnum` of 3.11: members are strings and print as their value."""

        def __str__(self) -> str:
            return str(self.value)


__all__ = ["StrEnum"]
