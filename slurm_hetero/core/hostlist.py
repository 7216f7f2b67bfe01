"""Slurm hostlists (`gpu-[001-512]`), through ClusterShell's NodeSet. The only ClusterShell import."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ClusterShell.NodeSet import NodeSet, NodeSetBase, NodeSetParseError
from ClusterShell.RangeSet import RangeSet

from slurm_hetero.core.errors import InventoryError
from slurm_hetero.slurm.syntax import MAX_HOSTS, hostlist_size

_SIMPLE = re.compile(r"([A-Za-z0-9_.\-/]*[A-Za-z_.\-/])?([0-9]+)")  # fullmatch


def _simple_groups(names: Iterable[str]) -> tuple[dict[tuple[str, int], list[int]], list[str]]:
    """Split plain names (`prefix` + number) by prefix and padding; the rest are returned as is."""
    groups: dict[tuple[str, int], list[int]] = {}
    other: list[str] = []
    for name in names:
        m = _SIMPLE.fullmatch(name)
        if m is None:
            other.append(name)
            continue
        digits = m.group(2)
        pad = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups.setdefault((m.group(1) or "", pad), []).append(int(digits))
    return groups, other


def _rangeset(numbers: list[int], pad: int) -> RangeSet:
    ranges = RangeSet()
    numbers = sorted(set(numbers))
    start = prev = numbers[0]
    for n in numbers[1:] + [None]:  # type: ignore[list-item]
        if n is not None and n == prev + 1:
            prev = n
            continue
        ranges.add_range(start, prev + 1, pad=pad)
        if n is not None:
            start = prev = n
    return ranges


def fold(names: Iterable[str]) -> str:
    """Fold host names into one hostlist expression (`n[1-3,7]`).

    Plain `prefix<number>` names are folded on their last number without parsing each name
    (10,000 names in milliseconds); anything else goes through NodeSet's full parser.
    """
    groups, other = _simple_groups(names)
    try:
        result = NodeSet.fromlist(other) if other else NodeSet()
        for (prefix, pad), numbers in groups.items():
            result.update(NodeSetBase(prefix.replace("%", "%%") + "%s", _rangeset(numbers, pad)))
        return str(result)
    except NodeSetParseError as e:
        raise InventoryError(f"bad host name {e.part!r}: {e}") from e


def expand(spec: str, limit: int = MAX_HOSTS) -> list[str]:
    """Expand a hostlist expression into host names, in order. The expression is checked (and
    its size counted) before NodeSet builds it, so `gpu[1-100000000]` fails at once."""
    if "[" not in spec and "," not in spec:
        return [spec] if spec else []
    count(spec, limit)
    try:
        return list(NodeSet(spec))
    except NodeSetParseError as e:
        raise InventoryError(f"bad hostlist {spec!r} near {e.part!r}") from e


def count(spec: str, limit: int = MAX_HOSTS) -> int:
    """How many hosts a hostlist expression names, without expanding it (InventoryError when it
    is malformed or names more than `limit` hosts)."""
    try:
        return hostlist_size(spec, limit)
    except ValueError as e:
        raise InventoryError(str(e)) from None
