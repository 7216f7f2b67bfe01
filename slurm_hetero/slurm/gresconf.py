"""The hosts and device files that gres.conf or slurm.conf `NodeName=` lines declare (what
`render.removal` compares before a render replaces them). Pure. Keys are case-insensitive as in
Slurm (`Nodename=`)."""

from __future__ import annotations

import re

from slurm_hetero.core import hostlist
from slurm_hetero.core.errors import GresConfError, InventoryError
from slurm_hetero.slurm import syntax

_NODE_NAME_KEY = re.compile(r"^[ \t]*NodeName=([^\s#]*)", re.IGNORECASE | re.MULTILINE)


def declared_nodes(text: str, limit: int = syntax.MAX_HOSTS) -> set[str]:
    """The hosts that the `NodeName=` lines of a gres.conf or a slurm.conf (node lines) name,
    hostlists expanded (each distinct value once: linear in the lines); GresConfError when a value
    is malformed or the file names more than `limit` hosts."""
    hosts: set[str] = set()
    seen: set[str] = set()
    for match in _NODE_NAME_KEY.finditer(text):
        spec = match[1]
        if spec in seen or spec.lower() in syntax.RESERVED_NODE_NAMES:
            continue
        seen.add(spec)
        try:
            syntax.hostlist_size(spec, limit)
            hosts.update(hostlist.expand(spec, limit) if spec else ())
        except (ValueError, InventoryError) as e:
            line_no = text.count("\n", 0, match.start()) + 1
            raise GresConfError(f"line {line_no}: NodeName={syntax.text(spec)}: {e}") from None
        if len(hosts) > limit:
            raise GresConfError(f"the NodeName= lines name more than {limit} hosts")
    return hosts


_FILE_KEY = re.compile(r"[ \t]File=([^\s#]+)", re.IGNORECASE)


def declared_devices(text: str, limit: int = syntax.MAX_HOSTS) -> dict[str, list[tuple[str, ...]]]:
    """The device files that the `NodeName=` lines of a gres.conf declare, per host: one tuple per
    line naming the host, shared between the hosts of a line (lines without File=, such as gpumem,
    gpucore or a node's shard count, declare none; per-device shard lines name a gpu line's file
    again). Linear in the lines; GresConfError as declared_nodes."""
    devices: dict[str, list[tuple[str, ...]]] = {}
    hosts: dict[str, list[str]] = {}
    files: dict[str, tuple[str, ...]] = {}
    for match in _NODE_NAME_KEY.finditer(text):
        spec = match[1]
        end = text.find("\n", match.end())
        line = text[match.end() : len(text) if end < 0 else end].partition("#")[0]
        file = _FILE_KEY.search(line)
        if file is None or spec.lower() in syntax.RESERVED_NODE_NAMES:
            continue
        try:
            if spec not in hosts:
                syntax.hostlist_size(spec, limit)
                hosts[spec] = hostlist.expand(spec, limit)
            if file[1] not in files:
                files[file[1]] = tuple(hostlist.expand(file[1], syntax.MAX_DEVICES_PER_NODE))
        except (ValueError, InventoryError) as e:
            line_no = text.count("\n", 0, match.start()) + 1
            raise GresConfError(f"line {line_no}: {e}") from None
        for host in hosts[spec]:
            devices.setdefault(host, []).append(files[file[1]])
        if len(devices) > limit:
            raise GresConfError(f"the NodeName= lines name more than {limit} hosts")
    return devices
