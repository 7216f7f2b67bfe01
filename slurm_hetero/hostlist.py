"""Slurm hostlists (`gpu-[001-512]`), through ClusterShell's NodeSet. The only ClusterShell import."""

from __future__ import annotations

from collections.abc import Iterable

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from slurm_hetero.errors import InventoryError


def fold(names: Iterable[str]) -> str:
    """Fold host names into one hostlist expression (`n[1-3,7]`)."""
    try:
        return str(NodeSet.fromlist(list(names)))
    except NodeSetParseError as e:
        raise InventoryError(f"bad host name {e.part!r}: {e}") from e


def expand(spec: str) -> list[str]:
    """Expand a hostlist expression into host names, in order."""
    try:
        return list(NodeSet(spec))
    except NodeSetParseError as e:
        raise InventoryError(f"bad hostlist {spec!r} near {e.part!r}") from e


def count(spec: str) -> int:
    """How many hosts a hostlist expression names, without expanding it."""
    try:
        return len(NodeSet(spec))
    except NodeSetParseError as e:
        raise InventoryError(f"bad hostlist {spec!r} near {e.part!r}") from e
