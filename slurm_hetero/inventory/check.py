"""Inventory consistency that the JSON Schema cannot express. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Any

from slurm_hetero.core import hostlist
from slurm_hetero.core.errors import InventoryError
from slurm_hetero.core.model import NodeInventory
from slurm_hetero.slurm import syntax


def check_device_syntax(raw: Mapping[str, Any], where: str) -> None:
    """What the schema's patterns cannot say about one schema-valid device record."""
    try:
        syntax.device_file(raw["file"])
        if raw.get("type") is not None:
            syntax.gres_type(raw["type"])
        if raw.get("cores") is not None:
            syntax.cpu_ids(raw["cores"])
    except ValueError as e:
        raise InventoryError(f"{where}: {e}") from None


def check_node(node: NodeInventory, source: str) -> None:
    """One record per device index and file; links to devices of the node that link back."""
    if not node.devices:
        raise InventoryError(f"{source}: node {node.name} has no devices; remove it or rediscover it")
    keys = [(d.vendor, d.index) for d in node.devices]
    named: dict[str, list[Any]] = {"index": keys, "file": [d.file for d in node.devices]}
    for what, values in named.items():
        if len(set(values)) != len(values):
            dup = sorted({v for v in values if values.count(v) > 1})
            raise InventoryError(f"{source}: node {node.name}: device {what} listed twice: {dup}")
    _check_links(node, set(keys), source)
    _check_cpus(node, source)


def _check_cpus(node: NodeInventory, source: str) -> None:
    """CPUs= must be a count slurmctld accepts, else it resets it to a figure nobody wrote."""
    s, c, t = node.sockets, node.cores_per_socket, node.threads_per_core
    if node.cpus is None or s is None or c is None or t is None:
        return
    if node.cpus not in (s, s * c, s * c * t):
        raise InventoryError(
            f"{source}: node {node.name}: cpus {node.cpus} matches none of sockets ({s}), sockets x "
            f"cores_per_socket ({s * c}) or that x threads_per_core ({s * c * t}); slurmctld would reset "
            "it: fix the figures"
        )


def _check_links(node: NodeInventory, keys: Set[tuple[str, int]], source: str) -> None:
    """A link is one cable seen from both ends, of one kind and count (every real capture is
    symmetric; a copy cut short is not)."""
    linked = [d for d in node.devices if d.links]
    if len(linked) * len(node.devices) > syntax.MAX_LINK_CELLS:
        raise InventoryError(
            f"{source}: node {node.name}: {len(linked)} of {len(node.devices)} devices have links; "
            f"gres.conf Links= rows would hold more than {syntax.MAX_LINK_CELLS} entries"
        )
    ends = {(d.vendor, d.index): {link.peer: link for link in d.links} for d in linked}
    for device in linked:
        peers = [link.peer for link in device.links]
        if len(set(peers)) != len(peers):
            twice = next(p for p in peers if peers.count(p) > 1)
            raise InventoryError(
                f"{source}: node {node.name}: {device.vendor} device {device.index} lists its link to "
                f"device {twice} twice; keep one entry per peer"
            )
        for link in device.links:
            if link.peer == device.index:
                raise InventoryError(
                    f"{source}: node {node.name}: {device.vendor} device {device.index} links to itself"
                )
            back = ends.get((device.vendor, link.peer), {}).get(device.index)
            if back is None or (back.kind, back.count) != (link.kind, link.count):
                if (device.vendor, link.peer) not in keys:
                    there = "is not on the node"
                elif back:
                    there = f"lists {back.count} {back.kind} link(s) back"
                else:
                    there = f"lists no link back to device {device.index}"
                raise InventoryError(
                    f"{source}: node {node.name}: {device.vendor} device {device.index} lists "
                    f"{link.count} {link.kind} link(s) to device {link.peer}, but device {link.peer} "
                    f"{there}; links go both ways: fix both devices (cut short?) or rediscover the node"
                )


def check_hosts(nodes: Sequence[NodeInventory], source: str) -> None:
    """Every node name is a NodeName or hostlist, and names its hosts once (`syntax.MAX_HOSTS` in all)."""
    seen: dict[str, int] = {}
    total = 0
    for position, node in enumerate(nodes):
        try:
            count = syntax.hostlist_count(node.name, syntax.MAX_HOSTS - total)
        except ValueError as e:
            if total and "names more than" in str(e):  # the earlier records used up the bound
                e = ValueError(f"the inventory names more than {syntax.MAX_HOSTS} hosts in all")
            raise InventoryError(f"{source}: node {syntax.text(node.name)}: {e}") from None
        total += count
        hosts = hostlist.expand(node.name) if count > 1 or "[" in node.name else [node.name]
        if len(set(hosts)) != len(hosts) or len(hosts) != count:  # NodeSet folds `n[1-2],n[2-3]`
            raise InventoryError(f"{source}: node record {node.name!r} names a host twice")
        for host in hosts:
            first = seen.setdefault(host, position)
            if first != position:
                records = (
                    f"in records {nodes[first].name!r} and {node.name!r}"
                    if nodes[first].name != node.name
                    else f"by two records {node.name!r}"
                )
                raise InventoryError(
                    f"{source}: node {host} is named {records}; slurmctld refuses a duplicated "
                    "NodeName: keep one record per node"
                )
