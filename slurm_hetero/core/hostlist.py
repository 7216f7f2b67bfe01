"""Slurm hostlists (`gpu-[001-512]`), through ClusterShell's NodeSet. The only ClusterShell import."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ClusterShell.NodeSet import NodeSet, NodeSetBase, NodeSetParseError
from ClusterShell.RangeSet import RangeSet

from slurm_hetero.core.errors import InventoryError
from slurm_hetero.slurm.syntax import MAX_HOSTS, hostlist_size

_SIMPLE = re.compile(r"([A-Za-z0-9_.\-/]*[A-Za-z_.\-/])?([0-9]+)")  # fullmatch


def fold(names: Iterable[str]) -> str:
    """Fold host names into one hostlist; plain `prefix<number>` names skip NodeSet's slow parser."""
    numbers: dict[str, list[str]] = {}  # prefix -> its numbers as written (`007` keeps its padding)
    other: list[str] = []
    for name in names:
        m = _SIMPLE.fullmatch(name)
        if m is None:
            other.append(name)
        else:
            numbers.setdefault(m.group(1) or "", []).append(m.group(2))
    try:
        result = NodeSet.fromlist(other) if other else NodeSet()
        for prefix, digits in numbers.items():
            indexes = RangeSet()
            indexes.update(digits)  # RangeSet holds its indexes as these strings
            result.update(NodeSetBase(prefix.replace("%", "%%") + "%s", indexes))
        return str(result)
    except NodeSetParseError as e:
        raise InventoryError(f"bad host name {e.part!r}: {e}") from e


def expand(spec: str, limit: int = MAX_HOSTS) -> list[str]:
    """Host names of a hostlist, in order; counted first, so `gpu[1-100000000]` fails at once."""
    if "[" not in spec and "," not in spec:
        return [spec] if spec else []
    count(spec, limit)
    try:
        return list(NodeSet(spec))
    except NodeSetParseError as e:
        raise InventoryError(f"bad hostlist {spec!r} near {e.part!r}") from e


def count(spec: str, limit: int = MAX_HOSTS) -> int:
    """How many hosts a hostlist names, without expanding it (InventoryError past `limit`)."""
    try:
        return hostlist_size(spec, limit)
    except ValueError as e:
        raise InventoryError(str(e)) from None
