"""The hosts and device files that gres.conf or slurm.conf `NodeName=` lines declare (what
`render.removal` compares before a render replaces them). Pure. Keys are case-insensitive as in
Slurm (`Nodename=`)."""

from __future__ import annotations

import re

from slurm_hetero.core import hostlist
from slurm_hetero.core.errors import GresConfError, InventoryError
from slurm_hetero.slurm import syntax

_NODE_NAME_KEY = re.compile(r"^[ \t]*NodeName=([^\s#]*)", re.IGNORECASE | re.MULTILINE)
_FILE_KEY = re.compile(r"[ \t]File=([^\s#]+)", re.IGNORECASE)


def _node_lines(text: str, limit: int) -> tuple[set[str], list[tuple[re.Match[str], list[str]]]]:
    """Every host the `NodeName=` lines name, and each line with its hosts (each distinct value
    expanded once: linear in the lines); GresConfError when a value is malformed or the lines
    name more than `limit` hosts."""
    every: set[str] = set()
    expanded: dict[str, list[str]] = {}
    lines = []
    for match in _NODE_NAME_KEY.finditer(text):
        spec = match[1]
        if spec.lower() in syntax.RESERVED_NODE_NAMES:
            continue
        if spec not in expanded:
            try:
                syntax.hostlist_size(spec, limit)
                expanded[spec] = hostlist.expand(spec, limit)
            except (ValueError, InventoryError) as e:
                line_no = text.count("\n", 0, match.start()) + 1
                raise GresConfError(f"line {line_no}: NodeName={syntax.text(spec)}: {e}") from None
            every.update(expanded[spec])
            if len(every) > limit:
                raise GresConfError(f"the NodeName= lines name more than {limit} hosts")
        lines.append((match, expanded[spec]))
    return every, lines


def declared_nodes(text: str, limit: int = syntax.MAX_HOSTS) -> set[str]:
    """The hosts that the `NodeName=` lines of a gres.conf or a slurm.conf (node lines) name."""
    return _node_lines(text, limit)[0]


def declared_devices(text: str, limit: int = syntax.MAX_HOSTS) -> dict[str, list[tuple[str, ...]]]:
    """The device files that the `NodeName=` lines of a gres.conf declare, per host: one tuple per
    line naming the host, shared between the hosts of a line (lines without File=, such as gpumem,
    gpucore or a node's shard count, declare none; per-device shard lines name a gpu line's file
    again)."""
    devices: dict[str, list[tuple[str, ...]]] = {}
    files: dict[str, tuple[str, ...]] = {}
    for match, hosts in _node_lines(text, limit)[1]:
        end = text.find("\n", match.end())
        file = _FILE_KEY.search(text[match.end() : len(text) if end < 0 else end].partition("#")[0])
        if file is None:
            continue
        if file[1] not in files:
            try:
                files[file[1]] = tuple(hostlist.expand(file[1], syntax.MAX_DEVICES_PER_NODE))
            except InventoryError as e:
                line_no = text.count("\n", 0, match.start()) + 1
                raise GresConfError(f"line {line_no}: {e}") from None
        for host in hosts:
            devices.setdefault(host, []).append(files[file[1]])
    return devices
