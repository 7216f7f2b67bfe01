"""Slurm's node records through its CLIs: `scontrol show node -o`, `sinfo`, `scontrol update`.

The parsers are pure; the callers go through `proc.run`. Works on every Slurm from 21.08 (`key=value`
fields whose values may hold spaces, as `OS=` and `Reason=` do). Python 3.9: it runs on compute nodes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_hetero.core import hostlist, proc
from slurm_hetero.core.errors import ScontrolError, ToolError

# a field starts at a run of key characters followed by `=`, after a space or at the line start
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:.]*)=")
_GRES_ITEM_END = re.compile(r",(?![^(]*\))")  # a comma outside a `(S:0,1)` socket list
DRAIN_PREFIX = "slurm-hetero:"
# the state words on which Slurm starts no job step (drained, down, failing, powered off, not responding)
SRUN_BLOCKED = frozenset("DRAIN DRAINED DRAINING DOWN FAIL FAILING POWERED_DOWN NOT_RESPONDING".split())


def is_our_reason(reason: str) -> bool:
    """A drain reason `health` wrote: exactly `slurm-hetero: ...` (`drain` writes no other), so an
    admin's ` slurm-hetero: ...` (a leading blank, kept by Slurm and by `parse_fields`) is not ours."""
    return reason.startswith(f"{DRAIN_PREFIX} ")


def parse_fields(line: str) -> dict[str, str]:
    """`NodeName=n1 OS=Linux 5.15 #1 SMP Reason=bad gpu [root@t]` -> fields (values keep their
    spaces, a leading one too: `is_our_reason`)."""
    marks = list(_FIELD.finditer(line))
    fields: dict[str, str] = {}
    for mark, following in zip(marks, [*marks[1:], None]):
        end = following.start() if following else len(line)
        fields[mark.group(1)] = line[mark.end() : end].rstrip()
    return fields


@dataclass(frozen=True)
class SlurmNodeRecord:
    """What slurmctld knows of one node: its state words and reason, and its configured facts."""

    name: str
    state: str
    reason: str = ""
    cpus: int | None = None
    sockets: int | None = None
    cores_per_socket: int | None = None
    threads_per_core: int | None = None
    real_memory_mib: int | None = None
    partition: str = ""  # the first partition the node is in ("" when none)

    @property
    def states(self) -> set[str]:
        """`IDLE+DRAIN` -> {"IDLE", "DRAIN"}; a trailing `*` (not responding) is its own word."""
        words = set(self.state.rstrip("*").upper().split("+"))
        return words | ({"NOT_RESPONDING"} if self.state.endswith("*") else set())

    @property
    def unreachable_by_srun(self) -> bool:
        return bool(self.states & SRUN_BLOCKED)

    @property
    def drained_by_us(self) -> bool:
        """Drained now, with our reason. Slurm 24.11 keeps showing the reason of a resumed node
        (State=IDLE, Reason=slurm-hetero: ...): that node is ours no longer, and a new fault drains it."""
        return is_our_reason(self.reason) and "DRAIN" in self.states


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "", "N/A") else None
    except ValueError:
        return None


def _records(text: str) -> list[dict[str, str]]:
    """The fields of each node: `-o` lines, or the multi-line form joined (a record starts at NodeName=)."""
    records: list[str] = []
    for line in text.splitlines():
        if line.strip().startswith("NodeName="):
            records.append(line.strip())
        elif records and line.strip():
            records[-1] += " " + line.strip()
    return [fields for fields in map(parse_fields, records) if "NodeName" in fields]


def parse_node_records(text: str) -> list[SlurmNodeRecord]:
    """`scontrol show node [-o]` output -> records."""
    return [
        SlurmNodeRecord(
            name=fields["NodeName"],
            state=fields.get("State", ""),
            reason=fields.get("Reason", "").split(" [")[0] if fields.get("Reason") != "(null)" else "",
            cpus=_int(fields.get("CPUTot")),
            sockets=_int(fields.get("Sockets")),
            cores_per_socket=_int(fields.get("CoresPerSocket")),
            threads_per_core=_int(fields.get("ThreadsPerCore")),
            real_memory_mib=_int(fields.get("RealMemory")),
            partition=fields.get("Partitions", "").split(",")[0].strip(),
        )
        for fields in _records(text)
    ]


def show_nodes(names: Sequence[str] = (), timeout: float = 30.0) -> list[SlurmNodeRecord]:
    """slurmctld's records of `names` (hostlists are fine), or of every node; none when it knows
    none of them (scontrol exits 1, 22.05 and 24.11); ToolError when Slurm cannot be asked."""
    argv = ["scontrol", "show", "node", "-o", *([",".join(names)] if names else [])]
    try:
        return parse_node_records(proc.run(argv, timeout=timeout))
    except ToolError as e:
        if names and e.rc == 1 and (not e.stderr_tail.strip() or " not found" in e.stderr_tail):
            return []
        raise


def show_node(name: str) -> SlurmNodeRecord | None:
    """The record of one node; None when slurmctld does not know it (`show_nodes`)."""
    return next((r for r in show_nodes([name], timeout=10.0) if r.name == name), None)


def drain(node: str, reason: str, dry_run: bool = False) -> list[str]:
    """Drain `node` with `reason` (prefixed `slurm-hetero:`); the argv, run unless `dry_run`."""
    text = reason if is_our_reason(reason) else f"{DRAIN_PREFIX} {reason}"
    return _update(node, dry_run, "state=drain", f"reason={text}")


def resume(node: str, dry_run: bool = False) -> list[str]:
    """Return a node to service; the argv, run unless `dry_run`."""
    return _update(node, dry_run, "state=resume")


def _update(node: str, dry_run: bool, *fields: str) -> list[str]:
    argv = ["scontrol", "update", f"nodename={node}", *fields]
    if not dry_run:
        proc.run(argv, timeout=30.0)
    return argv


# -- GPUs as Slurm configured them (the launcher's source of device types without an inventory) ---


@dataclass(frozen=True)
class NodeGres:
    """One node's GPUs as Slurm configured them: (type, count) per `gpu` entry of its `Gres=`."""

    name: str
    gpus: tuple[tuple[str, int], ...]


def gpu_entries(value: str) -> tuple[tuple[str, int], ...]:
    """The `gpu` entries of one `Gres=` value (`gpu:a100:4(S:0-1),gpumem:320G`) as (type, count);
    `gpu:2` has type "", `(null)` none."""
    if value in ("", "(null)", "N/A"):
        return ()
    out = []
    for item in filter(None, _GRES_ITEM_END.split(value)):
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


def parse_show_node(text: str) -> list[NodeGres]:
    """Every node of `scontrol show node [-d] [-o]` output with its GPUs."""
    return [
        NodeGres(
            fields["NodeName"].split()[0],
            gpu_entries(fields.get("Gres", "").split()[0] if fields.get("Gres") else ""),
        )
        for fields in _records(text)
    ]


def show_node_gres(names: Sequence[str], timeout: float = 30.0) -> dict[str, NodeGres]:
    """The GPUs of `names` (every node when empty), from one `scontrol show node LIST -d -o` call."""
    which = [hostlist.fold(names)] if names else []
    text = proc.run(["scontrol", "show", "node", *which, "-d", "-o"], timeout=timeout)
    return {n.name: n for n in parse_show_node(text)}
