"""`discover --nodes HOSTLIST | --all`: one discover JSON line from each of many nodes.

`srun` first (no ssh keys needed), one step per partition. Slurm refuses steps on drained or down
nodes (exactly those whose GPUs changed) and srun gives up on busy ones after `--immediate`; those
go over ClusterShell's ssh workers.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from slurm_hetero.core import hostlist, proc
from slurm_hetero.core.errors import HeteroError, InventoryError, ToolError
from slurm_hetero.slurm.scontrol import SlurmNodeRecord, show_nodes

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
IMMEDIATE_S = 60  # srun --immediate


@dataclass
class FanoutResult:
    lines: dict[str, str] = field(default_factory=dict)  # node -> its discover JSON line
    failed: dict[str, str] = field(default_factory=dict)  # node -> why it gave none
    srun_notes: dict[str, str] = field(default_factory=dict)  # node -> why srun gave none (then ssh)


def split_targets(records: Sequence[SlurmNodeRecord]) -> tuple[dict[str, list[str]], list[str]]:
    """Nodes srun can reach, by partition, and the nodes only ssh can (drained, down, ...)."""
    by_partition: dict[str, list[str]] = {}
    ssh: list[str] = []
    for record in records:
        if record.unreachable_by_srun or not record.partition:
            ssh.append(record.name)
        else:
            by_partition.setdefault(record.partition, []).append(record.name)
    return by_partition, ssh


def _node_of(line: str) -> str | None:
    try:
        return str(json.loads(line)["nodes"][0]["name"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def collect_lines(output: str, result: FanoutResult) -> None:
    """Every `discover --json` line of `output`, by its node."""
    for line in output.splitlines():
        name = _node_of(line.strip()) if line.strip().startswith("{") else None
        if name:
            result.lines[name] = line.strip()
            result.failed.pop(name, None)


def srun_argv(partition: str, nodes: Sequence[str], command: Sequence[str]) -> list[str]:
    return [
        "srun",
        f"--partition={partition}",
        f"--nodelist={hostlist.fold(nodes)}",
        f"--nodes={len(nodes)}",
        "--ntasks-per-node=1",
        f"--immediate={IMMEDIATE_S}",
        "--job-name=slurm-hetero-discover",
        *command,
    ]


def run_srun(by_partition: dict[str, list[str]], command: Sequence[str], result: FanoutResult) -> list[str]:
    """Discover through srun; returns the nodes it gave no line for."""
    left: list[str] = []
    for partition, nodes in sorted(by_partition.items()):
        errors: list[str] = []
        try:
            output = proc.run(srun_argv(partition, nodes, command), timeout=600.0)
        except ToolError as e:
            logger.info("srun on %s failed, trying ssh: %s", hostlist.fold(nodes), e)
            output, errors = "", e.stderr_tail.strip().splitlines() or [str(e)]
        collect_lines(output, result)
        for node in nodes:
            if node not in result.lines:
                left.append(node)
                result.srun_notes[node] = _srun_cause(node, errors)
    return left


def _srun_cause(node: str, errors: list[str]) -> str:
    """srun's line about `node`, else its last one."""
    if not errors:
        return "srun gave no inventory line"
    mine = [line for line in errors if re.search(rf"(?:^|\s){re.escape(node)}:", line)]
    return f"srun failed: {(mine or errors)[-1][:160]}"


def run_ssh(nodes: Sequence[str], command: Sequence[str], result: FanoutResult, timeout: float) -> None:
    """Discover over ClusterShell's ssh workers (`%h` in the command is each node's name)."""
    if not nodes:
        return
    from ClusterShell.Task import task_self

    task = task_self()
    task.shell(
        " ".join(shlex.quote(a) if a != "%h" else a for a in command), nodes=",".join(nodes), timeout=timeout
    )
    task.run()
    why: dict[str, str] = {}
    for buffer, keys in task.iter_buffers():
        text = bytes(buffer).decode("utf-8", "replace")
        for key in keys:
            collect_lines(text, result)
            last = text.strip().splitlines()[-1][:160] if text.strip() else "no output"
            why[str(key)] = last if last.startswith("ssh:") else f"ssh: {last}"
    for rc, keys in task.iter_retcodes():
        for key in keys:
            why.setdefault(str(key), f"ssh: exit {rc}")
    for key in task.iter_keys_timeout():
        why[str(key)] = f"ssh: no answer within {timeout:g}s"
    for node in nodes:
        if node not in result.lines:
            result.failed[node] = why.get(node, "ssh: no output")


def terminal_progress(done: int, total: int) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\rdiscover: {done}/{total} nodes" + ("\n" if done == total else ""))
        sys.stderr.flush()


def fan_out(
    spec: str | None,
    remote: Sequence[str],
    ssh_timeout: float = 120.0,
    progress: Progress = terminal_progress,
) -> FanoutResult:
    """Discover on the nodes of `spec` (None: every node Slurm knows)."""
    if spec:
        try:
            hostlist.count(spec)
        except InventoryError as e:
            raise InventoryError(f"--nodes: {e}") from None
    records = show_nodes([spec] if spec else [])  # Slurm cannot be asked: its ToolError, exit 3
    if not records:
        raise HeteroError(f"Slurm knows no node in {spec!r}" if spec else "Slurm lists no nodes")
    by_partition, ssh = split_targets(records)
    result = FanoutResult(failed={r.name: "no answer" for r in records})
    total = len(records)
    srun_command = [*remote, "discover", "--json"]
    ssh += run_srun(by_partition, srun_command, result)
    progress(len(result.lines), total)
    run_ssh(ssh, [*remote, "discover", "--json", "--node", "%h"], result, ssh_timeout)
    progress(len(result.lines), total)
    for node, why in result.srun_notes.items():
        if node in result.failed:
            result.failed[node] = f"{why}; then {result.failed[node]}"
    return result
