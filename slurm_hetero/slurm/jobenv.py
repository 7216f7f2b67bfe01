"""Slurm's task environment -> where this task sits in the step (pure; the caller passes os.environ).

Handles heterogeneous jobs on Slurm 22.05, whose traps are measured in
../shared/slurm-lab/slurm-local.md section 6: there is no per-task "het component" variable;
SLURM_JOB_NODELIST/SLURM_STEP_NODELIST are sorted by name while SLURM_NODEID follows component
order; SLURM_JOB_GPUS is inherited from component 0 (use SLURM_STEP_GPUS). Tasks are numbered
component by component, and within a step we require block distribution (each node's tasks have
consecutive ranks), which every rank checks against its own SLURMD_NODENAME.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_hetero import hostlist
from slurm_hetero.errors import HeteroError

_REPEAT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


class JobEnvError(HeteroError):
    """The task environment is not a Slurm step we can lay out."""


@dataclass(frozen=True)
class JobEnv:
    """This task and the step's shape: nodes in SLURM_NODEID order with their task counts."""

    rank: int
    world_size: int
    local_rank: int
    node_name: str
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    het_groups: tuple[int, ...]  # component of each node (all 0 outside heterogeneous jobs)
    job_id: str
    step_gpus: tuple[int, ...]
    launch_addr: str | None

    @property
    def node_index(self) -> int:
        return self.nodes.index(self.node_name)

    @property
    def local_world_size(self) -> int:
        return self.tasks_per_node[self.node_index]

    def first_rank_of_node(self, index: int) -> int:
        return sum(self.tasks_per_node[:index])


def expand_tasks_per_node(spec: str) -> list[int]:
    """`2,1(x2)` -> [2, 1, 1] (SLURM_TASKS_PER_NODE syntax)."""
    counts: list[int] = []
    for part in spec.split(","):
        m = _REPEAT.match(part.strip())
        if m is None:
            raise JobEnvError(f"cannot read tasks per node {spec!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except KeyError:
        raise JobEnvError(f"{name} is not set: run under srun (one task per device)") from None
    except ValueError:
        raise JobEnvError(f"{name}={env[name]!r} is not a number") from None


def _group_nodelist(env: Mapping[str, str], k: int) -> list[str]:
    """Component k's nodes: *_HET_GROUP_k after sbatch/salloc, only *_PACK_GROUP_k under a het srun."""
    spec = env.get(f"SLURM_JOB_NODELIST_HET_GROUP_{k}") or env.get(f"SLURM_JOB_NODELIST_PACK_GROUP_{k}", "")
    if not spec:
        raise JobEnvError(f"no node list for het component {k} (SLURM_JOB_NODELIST_HET_GROUP_{k})")
    return hostlist.expand(spec)


def _tasks_by_node(env: Mapping[str, str]) -> dict[str, int]:
    """The step's tasks per node. SLURM_STEP_TASKS_PER_NODE follows the (name-sorted) step node
    list, in heterogeneous steps too (measured on 22.05: `1(x2),2` for a100n1,ascendn1,l40sn1)."""
    nodes = hostlist.expand(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
    tasks = expand_tasks_per_node(
        env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1")
    )
    if len(nodes) != len(tasks):
        raise JobEnvError(f"{len(nodes)} nodes {nodes} but tasks per node {tasks}")
    return dict(zip(nodes, tasks))


def _shape(env: Mapping[str, str]) -> tuple[list[str], list[int], list[int]]:
    """Nodes in SLURM_NODEID order (component by component in het jobs), their task counts and
    components."""
    by_node = _tasks_by_node(env)
    het_size = int(env.get("SLURM_HET_SIZE") or env.get("SLURM_PACK_SIZE") or 0)
    if het_size <= 1:
        return list(by_node), list(by_node.values()), [0] * len(by_node)
    nodes, groups = [], []
    for k in range(het_size):
        for node in _group_nodelist(env, k):
            if node in nodes:
                raise JobEnvError(
                    f"node {node} is in two het components; launch one task per device per node"
                )
            nodes.append(node)
            groups.append(k)
    missing = [n for n in nodes if n not in by_node]
    if missing:
        raise JobEnvError(
            f"het components name nodes {missing} that are not in the step; use --het-group=all"
        )
    return nodes, [by_node[n] for n in nodes], groups


def parse_job_env(env: Mapping[str, str]) -> JobEnv:
    """Read and cross-check the step's shape from a task's environment."""
    rank = _int(env, "SLURM_PROCID")
    world = _int(env, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS")
    nodes, tasks, groups = _shape(env)
    if len(nodes) != len(tasks) or sum(tasks) != world:
        raise JobEnvError(
            f"step shape does not add up: nodes {nodes}, tasks per node {tasks}, {world} tasks "
            "(in heterogeneous jobs run srun over every component: --het-group=all)"
        )
    job_env = JobEnv(
        rank=rank,
        world_size=world,
        local_rank=_int(env, "SLURM_LOCALID"),
        node_name=env.get("SLURMD_NODENAME", ""),
        nodes=tuple(nodes),
        tasks_per_node=tuple(tasks),
        het_groups=tuple(groups),
        job_id=env.get("SLURM_JOB_ID", ""),
        step_gpus=tuple(int(g) for g in env.get("SLURM_STEP_GPUS", "").split(",") if g.strip().isdigit()),
        launch_addr=env.get("SLURM_LAUNCH_NODE_IPADDR"),
    )
    _check_block_distribution(job_env)
    return job_env


def _check_block_distribution(job_env: JobEnv) -> None:
    if job_env.node_name not in job_env.nodes:
        raise JobEnvError(f"this node {job_env.node_name!r} is not in the step's nodes {list(job_env.nodes)}")
    first = job_env.first_rank_of_node(job_env.node_index)
    if job_env.rank != first + job_env.local_rank:
        raise JobEnvError(
            f"rank {job_env.rank} on {job_env.node_name} is not block-distributed (expected "
            f"{first + job_env.local_rank}); launch with srun --distribution=block"
        )
