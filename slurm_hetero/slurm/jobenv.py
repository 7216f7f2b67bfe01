"""Slurm's task and job environment, read in one place. Pure: the caller passes `os.environ`.

`read_task_env` is lenient (the TaskProlog must never fail a task: only a value Slurm never writes
is a `JobEnvError`); `parse_job_env` is strict (the launcher: a missing or malformed essential
variable is a `JobEnvError` naming it). Each value comes from the first of its variables (the
tuples below) set to a non-blank value: step before job, HET_GROUP before PACK_GROUP.

Heterogeneous jobs on Slurm 22.05 (../shared/slurm-lab/slurm-local.md section 6, captured in
tests/fixtures/slurm_env/): no variable names a task's component; the node lists are sorted by name
while SLURM_NODEID follows component order, so nodes come from the per-component lists;
SLURM_JOB_GPUS is component 0's in every task; a het srun (`srun A : B`) sets only *_PACK_GROUP_k.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from slurm_hetero.core import hostlist
from slurm_hetero.core.errors import HeteroError, JobEnvError
from slurm_hetero.slurm.syntax import MAX_HOSTS

_REPEAT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
_INDEX = re.compile(r"^[0-9]{1,10}$")  # Slurm's ids, counts and ranks are 32-bit
_NUMBER = "a number of at most 10 digits"
_JOB_ID_WORDS = f"a job id ({_NUMBER})"
_GPU_INDEX = re.compile(r"[0-9]{1,6}")  # bounded: int() of 5,000 digits raises
MAX_INDEXES = 4096  # GPUs one task can be given
MAX_HET_COMPONENTS = 128  # components of one heterogeneous job (Slurm's MAX_HET_JOB_COMPONENTS)

# Where Slurm puts this task's GPU indices (positions in gres.conf order), most specific first.
GPU_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES")
# The step's GPUs on this node, whatever the task binding (SLURM_STEP_GPUS may list the task's own)
GPUS_ON_NODE = "SLURM_GPUS_ON_NODE"
# What Slurm's gres/gpu exports for every GPU type.
SLURM_VISIBLE = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
# Which of them a device's gres.conf `Flags=` lets Slurm set (gres_gpu.c; ZE_AFFINITY_MASK, the
# intel_gpu_env one, is that vendor's own variable).
SLURM_VISIBLE_OF_FLAG = {
    "nvidia_gpu_env": ("CUDA_VISIBLE_DEVICES",),
    "amd_gpu_env": ("ROCR_VISIBLE_DEVICES",),
    "opencl_env": ("GPU_DEVICE_ORDINAL",),
}

_STEP_ID = ("SLURM_STEP_ID", "SLURM_STEPID")
_JOB_ID = ("SLURM_JOB_ID", "SLURM_JOBID")
_TASKS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
_NODELIST = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
_TASKS_PER_NODE = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
_HET_SIZE = ("SLURM_HET_SIZE", "SLURM_PACK_SIZE")
_SRUN = "run under srun (one task per device)"


@dataclass(frozen=True)
class TaskDevices:
    """What Slurm bound on this task's node: GPU indices (gres.conf order), the variable naming them
    and the visible-device variables Slurm set."""

    gpu_indexes: tuple[int, ...] = ()
    visible: Mapping[str, str] = field(default_factory=dict)
    source: str | None = None
    on_node: int | None = None  # SLURM_GPUS_ON_NODE: the step's GPUs on this node (None: not set)


@dataclass(frozen=True)
class TaskEnv:
    """This task as the TaskProlog sees it; every field may be missing."""

    node_name: str | None
    devices: TaskDevices
    shards_on_node: int | None  # SLURM_SHARDS_ON_NODE; None when absent or not a number


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
    step_id: int = 0
    component_job_ids: tuple[str, ...] = ()  # each het component's job id; (job_id,) outside
    devices: TaskDevices = TaskDevices()

    @property
    def node_index(self) -> int:
        return self.nodes.index(self.node_name)

    @property
    def component_steps(self) -> list[str]:
        """`JOBID.STEPID` of this step in every component (what scancel takes to end it)."""
        return [f"{job}.{self.step_id}" for job in self.component_job_ids if job]

    @cached_property
    def first_ranks(self) -> tuple[int, ...]:
        """Each node's first rank (cached: asked per node)."""
        return (0, *itertools.accumulate(self.tasks_per_node))


# -- single variables -----------------------------------------------------------------------------


def first_set(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    for name in names:
        if value := env.get(name, "").strip():
            return name, value
    return None


def _required(env: Mapping[str, str], *names: str) -> tuple[str, str]:
    found = first_set(env, *names)
    if found is None:
        also = f" (or {', '.join(names[1:])})" if names[1:] else ""
        raise JobEnvError(f"{names[0]}{also} is not set: {_SRUN}")
    return found


def _checked(found: tuple[str, str], what: str = _NUMBER) -> str:
    name, value = found
    if not _INDEX.match(value):
        raise JobEnvError(f"{name}={shown(value)} is not {what}")
    return value


def shown(value: str, limit: int = 60) -> str:
    """A variable's value for a message: quoted, cut after `limit` characters."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def _nodes(name: str, value: str) -> list[str]:
    try:
        return hostlist.expand(value)
    except HeteroError as e:
        raise JobEnvError(f"{name}: {e}") from e


def expand_tasks_per_node(spec: str, limit: int = MAX_HOSTS) -> list[int]:
    """`2,1(x2)` -> [2, 1, 1] (SLURM_TASKS_PER_NODE), refused before it passes `limit` nodes."""
    counts: list[int] = []
    for part in spec.split(","):
        m = _REPEAT.match(part.strip())
        if m is None or len(m.group(1)) > 10 or len(m.group(2) or "") > 10:
            raise JobEnvError(f"cannot read tasks per node {shown(spec)}")
        repeat = int(m.group(2) or 1)
        if len(counts) + repeat > limit:
            raise JobEnvError(f"tasks per node {shown(spec)} names more nodes than the step's {limit}")
        counts += [int(m.group(1))] * repeat
    return counts


# -- heterogeneous components ---------------------------------------------------------------------


def het_size(env: Mapping[str, str]) -> int:
    """Components of a heterogeneous job; 1 outside one (at most MAX_HET_COMPONENTS)."""
    found = first_set(env, *_HET_SIZE)
    size = max(int(_checked(found)), 1) if found else 1
    if found and size > MAX_HET_COMPONENTS:
        raise JobEnvError(
            f"{found[0]}={size} is more het components than the {MAX_HET_COMPONENTS} Slurm allows"
        )
    return size


def _component(name: str, k: int) -> tuple[str, str]:
    return f"{name}_HET_GROUP_{k}", f"{name}_PACK_GROUP_{k}"


def component_nodelist(env: Mapping[str, str], k: int) -> list[str] | None:
    """Component k's nodes: *_HET_GROUP_k after sbatch/salloc, only *_PACK_GROUP_k under a het srun."""
    found = first_set(env, *_component("SLURM_JOB_NODELIST", k))
    return None if found is None else _nodes(*found)


def component_job_ids(env: Mapping[str, str], job_id: str) -> tuple[str, ...]:
    """Every component's job id; `(job_id,)` outside het jobs or when a component's is missing."""
    size = het_size(env)
    found = [first_set(env, *_component("SLURM_JOB_ID", k)) for k in range(size)] if size > 1 else []
    ids = [_checked(f, _JOB_ID_WORDS) for f in found if f is not None]
    return tuple(ids) if ids and len(ids) == size else (job_id,)


# -- this task's devices --------------------------------------------------------------------------


def _gpu_list(name: str, value: str) -> tuple[int, ...] | None:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if len(items) <= MAX_INDEXES and all(_GPU_INDEX.fullmatch(v) for v in items):
        indexes = tuple(int(v) for v in items)
        if len(set(indexes)) < len(indexes):  # Slurm never binds a GPU twice: two ranks would share it
            raise JobEnvError(f"{name}={shown(value)} names a GPU twice")
        return indexes or None  # `,` names nothing: the next variable applies
    if name == "CUDA_VISIBLE_DEVICES":
        return None  # UUIDs, MIG names: not positions in gres.conf
    raise JobEnvError(f"{name}={shown(value)} is not a list of GPU indices")


def _job_gpus_apply(env: Mapping[str, str]) -> bool:
    """SLURM_JOB_GPUS is this node's outside het jobs, and in them only on component 0's nodes."""
    if het_size(env) <= 1:
        return True
    node, first_nodes = first_set(env, "SLURMD_NODENAME"), component_nodelist(env, 0)
    return node is not None and first_nodes is not None and node[1] in first_nodes


def task_devices(env: Mapping[str, str]) -> TaskDevices:
    """This task's GPU indices (the first of `GPU_VARIABLES` naming some) and visible variables."""
    visible = {name: value for name in SLURM_VISIBLE if (value := env.get(name, "").strip())}
    on_node = first_set(env, GPUS_ON_NODE)
    count = int(on_node[1]) if on_node and _INDEX.match(on_node[1]) else None
    for name in GPU_VARIABLES:
        found = first_set(env, name)
        if found is None or (name == "SLURM_JOB_GPUS" and not _job_gpus_apply(env)):
            continue
        if (indexes := _gpu_list(*found)) is not None:
            return TaskDevices(indexes, visible, name, count)
    return TaskDevices((), visible, None, count)


def read_task_env(env: Mapping[str, str]) -> TaskEnv:
    node = first_set(env, "SLURMD_NODENAME")
    shards = first_set(env, "SLURM_SHARDS_ON_NODE")
    return TaskEnv(
        node_name=node[1] if node else None,
        devices=task_devices(env),
        shards_on_node=int(shards[1]) if shards and _INDEX.match(shards[1]) else None,
    )


# -- the step's shape (launcher) ------------------------------------------------------------------


def _tasks_by_node(env: Mapping[str, str]) -> dict[str, int]:
    """The step's tasks per node (SLURM_STEP_TASKS_PER_NODE follows the name-sorted node list)."""
    nodes = _nodes(*_required(env, *_NODELIST))
    tasks = expand_tasks_per_node(_required(env, *_TASKS_PER_NODE)[1], len(nodes))
    if len(nodes) != len(tasks):
        raise JobEnvError(f"{len(nodes)} nodes {nodes} but tasks per node {tasks}")
    return dict(zip(nodes, tasks))


def _shape(env: Mapping[str, str]) -> tuple[list[str], list[int], list[int]]:
    """Nodes in SLURM_NODEID order, their task counts and het components; a step may run on some
    components (`srun --het-group=1`), not on part of one."""
    by_node = _tasks_by_node(env)
    size = het_size(env)
    if size <= 1:
        return list(by_node), list(by_node.values()), [0] * len(by_node)
    nodes: list[str] = []
    groups: list[int] = []
    for k in range(size):
        component = component_nodelist(env, k)
        if not component:
            raise JobEnvError(f"no node list for het component {k} (SLURM_JOB_NODELIST_HET_GROUP_{k})")
        if not any(node in by_node for node in component):
            continue  # a component this step does not run on
        for node in component:
            if node in nodes:
                raise JobEnvError(
                    f"node {node} is in two het components; launch one task per device per node"
                )
            nodes.append(node)
            groups.append(k)
    missing = [n for n in nodes if n not in by_node]
    if missing or not nodes:
        raise JobEnvError(
            f"het components name nodes {missing} that are not in the step; use --het-group=all"
            if missing
            else f"no het component holds the step's nodes {list(by_node)}"
        )
    return nodes, [by_node[n] for n in nodes], groups


def parse_job_env(env: Mapping[str, str]) -> JobEnv:
    """The step's shape from a task's environment, cross-checked (each node's ranks a block)."""
    rank, world, local_rank = (
        int(_checked(_required(env, *n))) for n in (("SLURM_PROCID",), _TASKS, ("SLURM_LOCALID",))
    )
    node_name = _required(env, "SLURMD_NODENAME")[1]
    job_id = _checked(_required(env, *_JOB_ID), _JOB_ID_WORDS)
    step_id = int(_checked(_required(env, *_STEP_ID)))
    nodes, tasks, groups = _shape(env)
    ids = component_job_ids(env, job_id)  # every component's, or one id: keep those the step runs on
    if sum(tasks) != world:
        raise JobEnvError(
            f"step shape does not add up: nodes {nodes}, tasks per node {tasks}, {world} tasks "
            "(in heterogeneous jobs run srun over every component: --het-group=all)"
        )
    job_env = JobEnv(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        node_name=node_name,
        nodes=tuple(nodes),
        tasks_per_node=tuple(tasks),
        het_groups=tuple(groups),
        job_id=job_id,
        step_id=step_id,
        component_job_ids=ids if len(ids) <= 1 else tuple(job for k, job in enumerate(ids) if k in groups),
        devices=task_devices(env),
    )
    if job_env.node_name not in job_env.nodes:
        raise JobEnvError(f"this node {job_env.node_name!r} is not in the step's nodes {list(job_env.nodes)}")
    first_rank = job_env.first_ranks[job_env.node_index]
    if job_env.rank != first_rank + job_env.local_rank:
        raise JobEnvError(
            f"rank {job_env.rank} on {job_env.node_name} is not block-distributed (expected "
            f"{first_rank + job_env.local_rank}); launch with srun --distribution=block"
        )
    return job_env
