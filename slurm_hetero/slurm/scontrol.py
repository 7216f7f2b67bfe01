"""What Slurm already knows about a node's GPUs: `scontrol show node NAME -d -o`.

The launcher needs each node's device types; when no inventory file is installed it reads them
from Slurm itself, so `srun slurm-hetero launch -- CMD` needs no file beyond what the cluster has.
`parse_show_node(text)` is pure (tested on real captures: Slurm 17.11, 21.08 and this project's
22.05 dev cluster, one-line and multi-line forms); `show_nodes(names)` is the one caller, through
`proc.run`.

A node's `Gres=` lists `name[:type]:count[(S:sockets)]` entries separated by commas (commas inside
the parentheses belong to the socket list): `gpu:a100:4(S:0-1),gpumem:320G,shard:l40s:8`. Only
`gpu` entries count (every accelerator is GRES `gpu`, told apart by `Type=`); `Gres=(null)` is a
node without GPUs; `gpu:2` (no type) gives type "".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_hetero import hostlist, proc
from slurm_hetero.errors import HeteroError

_NODE = re.compile(r"(?:^|\s)NodeName=(\S+)")
_GRES = re.compile(r"(?:^|\s)Gres=(\S*)")


class ScontrolError(HeteroError):
    """`scontrol show node` said something we cannot read."""


@dataclass(frozen=True)
class NodeGres:
    """One node's GPUs as Slurm configured them: (type, count) per `gpu` entry, in order."""

    name: str
    gpus: tuple[tuple[str, int], ...]

    @property
    def count(self) -> int:
        return sum(n for _, n in self.gpus)


def split_gres(value: str) -> list[str]:
    """`gpu:a100:2(S:0,1),gpumem:80G` -> ['gpu:a100:2(S:0,1)', 'gpumem:80G'] (commas inside
    parentheses kept)."""
    items, depth, current = [], 0, ""
    for ch in value:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    return [i for i in (*items, current) if i]


def gpu_entries(value: str) -> tuple[tuple[str, int], ...]:
    """The `gpu` entries of one `Gres=` value as (type, count)."""
    if value in ("", "(null)", "N/A"):
        return ()
    out = []
    for item in split_gres(value):
        parts = item.split("(", 1)[0].split(":")
        if parts[0] != "gpu":
            continue
        if len(parts) == 2 and parts[1].isdigit():
            out.append(("", int(parts[1])))
        elif len(parts) == 3 and parts[2].isdigit():
            out.append((parts[1], int(parts[2])))
        elif len(parts) == 2:
            out.append((parts[1], 1))
        else:
            raise ScontrolError(f"cannot read GRES entry {item!r} in Gres={value}")
    return tuple(out)


def _records(text: str) -> list[str]:
    """One string per node record (the one-line `-o` form, or the indented multi-line form)."""
    records: list[str] = []
    for line in text.splitlines():
        if _NODE.search(line):  # NodeName= opens a record (captures may indent it)
            records.append(line)
        elif records:
            records[-1] += " " + line
    return records


def parse_show_node(text: str) -> list[NodeGres]:
    """Every node of `scontrol show node [-d] [-o]` output with its GPUs."""
    out = []
    for record in _records(text):
        name = _NODE.search(record)
        gres = _GRES.search(record)
        assert name is not None
        out.append(NodeGres(name.group(1), gpu_entries(gres.group(1) if gres else "")))
    return out


def show_nodes(names: Sequence[str], timeout: float = 30.0) -> dict[str, NodeGres]:
    """The GPUs of `names`, from one `scontrol show node LIST -d -o` call."""
    text = proc.run(["scontrol", "show", "node", hostlist.fold(names), "-d", "-o"], timeout=timeout)
    return {n.name: n for n in parse_show_node(text)}
