"""A render never drops nodes silently. A truncated inventory that is still valid YAML (a copy cut
short, an editor's half save) renders a slurm.conf without the nodes it lost, and slurmctld then
forgets them and their jobs; so the set writer refuses a render that drops `NodeName=` hosts named
by the files on disk, unless the admin says the removal is meant (`gres render --allow-removal`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from slurm_hetero.errors import OutputError
from slurm_hetero.slurm.gresconf import GresConfError, declared_nodes

ALLOW_FLAG = "--allow-removal"
SHOWN = 5  # dropped hosts named in a message; the rest are counted


def _declared(texts: Iterable[tuple[Path, str | None]]) -> set[str]:
    hosts: set[str] = set()
    for path, text in texts:
        if text is None:
            continue
        try:
            hosts |= declared_nodes(text)
        except GresConfError as e:
            raise OutputError(
                f"{path}: cannot tell which nodes it names ({e}), so cannot tell whether this render "
                f"drops any; check the file, or pass {ALLOW_FLAG} to replace it; nothing changed"
            ) from None
    return hosts


def _natural(name: str) -> list[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def dropped_nodes(current: Mapping[Path, str | None], new: Mapping[Path, str]) -> list[str]:
    """The hosts that the files on disk (`current`, None: absent) name in `NodeName=` lines and
    the new set names nowhere, in natural order."""
    kept = _declared(new.items())
    return sorted(_declared(current.items()) - kept, key=_natural)


def describe(dropped: list[str]) -> str:
    """`3 nodes (a1, a2, b7)`, at most SHOWN names and `and N more`."""
    names = ", ".join(dropped[:SHOWN]) + (f" and {len(dropped) - SHOWN} more" if len(dropped) > SHOWN else "")
    return f"{len(dropped)} node{'s' if len(dropped) != 1 else ''} ({names})"


def guard(new: Mapping[Path, str], where: Path) -> Callable[[Mapping[Path, str | None]], None]:
    """The set writer's guard (`write_atomic(..., guard=)`): refuses a set that drops nodes."""

    def check(current: Mapping[Path, str | None]) -> None:
        dropped = dropped_nodes(current, new)
        if dropped:
            raise OutputError(
                f"{where}: this render would remove {describe(dropped)} that the files there name; "
                f"the inventory lacks them (cut short?). Pass {ALLOW_FLAG} if the removal is meant; "
                "nothing changed"
            )

    return check
