"""The job_desc that sbatch sends for command-line options, per Slurm release. Pure.

`request explain` and the real-Slurm fuzz start from options, the hook from the job_desc; the two
agree only if this is what sbatch really sends. Measured with a probe job_submit.lua printing the
fields, on 22.05 and 24.11 (docs/submit-protocol.md has the table):

- sbatch refuses `--gpus-per-task` without `--gpus` or `-n`, unless `-N` is given (then
  num_tasks = nodes x tasks per node) or, on 22.05 only, `--ntasks-per-node`;
- 22.05 turns `--ntasks-per-node` without `-n` into num_tasks = (nodes or 1) x tasks per node;
  24.11 does so only for `--gpus-per-task`;
- more nodes than tasks: both lower min_nodes to the task count (`-N3 -n2` has min_nodes 2);
- 24.11 sets min_nodes to ceil(tasks / tasks per node) when `-N` is not given;
- 24.11 writes `--gpus-per-task=N` as `gres/gpu=N` (the `=` form), `--gpus` as `gres/gpu:N`;
- `--gpus-per-node` comes first in tres_per_node, before the `--gres` items;
- sbatch refuses typed and untyped gpu counts together (in any of --gres and --gpus*),
  per-node counts that are not a multiple of --gpus-per-task, --gpus not a multiple of the
  per-node count, and --gpus below -N
  (`gpu_refusal`, seen in the fuzz).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slurm_hetero.engine.score import ceil_div
from slurm_hetero.errors import RequestError
from slurm_hetero.units import UNITS

if TYPE_CHECKING:
    from slurm_hetero.submit import Job

# The prefix each release's sbatch puts on TRES items (measured on 22.05 and 24.11).
RELEASE_PREFIX = {"22.05": "gres:", "24.11": "gres/"}
# sbatch's own refusal of --gpus-per-task without a task count (its text, per release)
GPUS_PER_TASK_REFUSAL = {
    "22.05": "--gpus-per-task used without either --gpus or -n/--ntasks is not allowed.",
    "24.11": "--gpus-per-task or --tres-per-task used without either --gpus or -n/--ntasks is not allowed.",
}


def _gpu_option(spec: str) -> tuple[str | None, int]:
    """(type or None, count) of a gpu item or --gpus* value: `a100:2` ("a100", 2), `2` (None, 2)."""
    tokens = spec.split(":")
    count = int(tokens[-1]) if tokens[-1].isdigit() else 1
    named = tokens[:-1] if tokens[-1].isdigit() else tokens
    return (":".join(named) or None), count


def _records(
    gres: str | None, gpus: str | None, gpus_per_node: str | None, gpus_per_task: str | None
) -> dict[str | None, dict[str, int]]:
    """sbatch checks each gpu type's counts on its own (untyped first), then the mix."""
    specs = [("node", item[4:]) for item in (gres or "").split(",") if item.startswith("gpu:")]
    specs += [
        (scope, spec)
        for scope, spec in (("node", gpus_per_node), ("task", gpus_per_task), ("job", gpus))
        if spec
    ]
    records: dict[str | None, dict[str, int]] = {}
    for scope, spec in specs:
        name, count = _gpu_option(spec)
        records.setdefault(name, {}).setdefault(scope, count)
    return dict(sorted(records.items(), key=lambda kv: kv[0] is not None))


def gpu_ensure(
    gres: str | None, gpus: str | None, gpus_per_node: str | None, gpus_per_task: str | None
) -> str | None:
    """sbatch's first GPU checks, before the task count (`Failed to ensure ...`), else None."""
    for counts in _records(gres, gpus, gpus_per_node, gpus_per_task).values():
        node, task, job = counts.get("node"), counts.get("task"), counts.get("job")
        if job and node and job < node:
            return "Failed to ensure --gpus >= --gres=gpu/--gpus-per-node >= --gpus-per-socket"
        if task and node and task > node:
            return "Failed to ensure --gpus >= --gpus-per-task"
    return None


def gpu_refusal(
    gres: str | None,
    gpus: str | None,
    gpus_per_node: str | None,
    gpus_per_task: str | None,
    min_nodes: int | None,
    max_nodes: int | None = None,
    ntasks_per_node: int | None = None,
) -> str | None:
    """sbatch's GPU checks after the task count (its words, 22.05 and 24.11), else None: each
    type's counts in turn (the order seen in the fuzz where several apply), then typed and untyped
    together. min_nodes as sent (-N lowered to the tasks; 24.11's derived), max_nodes -N's."""
    records = _records(gres, gpus, gpus_per_node, gpus_per_task)
    for counts in records.values():
        node, task, job = counts.get("node"), counts.get("task"), counts.get("job")
        if job and node and job % node:
            return "--gpus is not multiple of --gres=gpu/--gpus-per-node"
        required = job // node if job and node else None
        if required and ((min_nodes and required < min_nodes) or (max_nodes and required > max_nodes)):
            return (
                f"Based on --gpu and --gres=gpu/--gpus-per-node required nodes ({required}) "
                f"doesn't fall between min_nodes ({min_nodes}) and max_nodes ({max_nodes}) boundaries"
            )
        if job and min_nodes and job < min_nodes:
            return "--gpus < -N"
        if node and task and node % task:
            return "--gres=gpu/--gpus-per-node not multiple of --gpus-per-task"
        if node and task and ntasks_per_node and node // task != ntasks_per_node:
            return (
                "Based on --gres=gpu/--gpus-per-node and --gpus-per-task requested number of tasks per node "
                "differ from --ntasks-per-node"
            )
    if None in records and len(records) > 1:
        return "Invalid GRES specification (with and without type identification)"
    return None


def _gres_items(spec: str, prefix: str) -> list[str]:
    """`--gres=gpu:a100:1,gpumem:90G` as sbatch stores it: `gres:gpu:a100:1,gres:gpumem:90G`."""
    return [s if s.startswith(("gres:", "gres/")) else f"{prefix}{s}" for s in spec.split(",")]


def _release(slurm_release: str) -> str:
    if slurm_release not in RELEASE_PREFIX:
        raise ValueError(f"unknown Slurm release {slurm_release}; known: {', '.join(RELEASE_PREFIX)}")
    return slurm_release


def sbatch_counts(
    nodes: int | None,
    ntasks: int | None,
    ntasks_per_node: int | None,
    per_task: bool,
    job_total: bool,
    slurm_release: str = "22.05",
) -> tuple[int | None, int | None, int | None]:
    """(min_nodes, num_tasks, ntasks_per_node) as sbatch of the release sends them (None: unset),
    for -N, -n, --ntasks-per-node, with or without --gpus-per-task (`per_task`) and --gpus
    (`job_total`). RequestError with sbatch's own words where sbatch refuses the options."""
    new_release = _release(slurm_release) != "22.05"
    if per_task and not ntasks and not job_total:
        if nodes:
            ntasks = nodes * (ntasks_per_node or 1)
        elif ntasks_per_node and not new_release:
            ntasks = ntasks_per_node
        else:
            raise RequestError("sbatch", GPUS_PER_TASK_REFUSAL[slurm_release])
    if not ntasks and ntasks_per_node and not new_release:
        ntasks = (nodes or 1) * ntasks_per_node
    if nodes and ntasks and ntasks < nodes:
        nodes = ntasks
    if new_release and not nodes and ntasks and ntasks_per_node:
        nodes = ceil_div(ntasks, ntasks_per_node)
    return nodes, ntasks, ntasks_per_node


def mebibytes(text: str | None) -> int | None:
    """sbatch's --mem* value in MiB (`16000`, `10G`; a bare number is MiB), None when not given."""
    if not text:
        return None
    suffix = text[-1].upper() if text[-1].isalpha() else "M"
    digits = text[:-1] if text[-1].isalpha() else text
    if not digits.isdigit() or suffix not in UNITS:
        raise RequestError("sbatch", f"invalid memory value {text}")
    return int(digits) * UNITS[suffix]


def _per_task(prefix: str, cpus_per_task: int | None, gpu: str | None) -> str | None:
    """tres_per_task: after 22.05 sbatch puts `-c N` there too, as `cpu=N` before the rest
    (measured on 24.11: `-N1 -c 9` is stored as TresPerTask=cpu=9; slurm_opt.c
    slurm_option_update_tres_per_task prepends it)."""
    if prefix == "gres/" and cpus_per_task:
        return f"cpu={cpus_per_task}" + (f",{gpu}" if gpu else "")
    return gpu


def job_from_options(
    gres: str | None = None,
    gpus: str | None = None,
    gpus_per_node: str | None = None,
    gpus_per_task: str | None = None,
    partition: str | None = None,
    constraint: str | None = None,
    uid: int | None = None,
    slurm_release: str = "22.05",
    nodes: int | None = None,
    ntasks: int | None = None,
    ntasks_per_node: int | None = None,
    cpus_per_task: int | None = None,
    cpus_per_gpu: str | None = None,
    mem_per_gpu: str | None = None,
    mem: str | None = None,
    mem_per_cpu: str | None = None,
    nodelist: str | None = None,
    exclude: str | None = None,
) -> Job:
    """The job_desc that sbatch of `slurm_release` (22.05 or 24.11) would send for these options
    (-c, --cpus-per-gpu, --mem-per-gpu, --mem, --mem-per-cpu, -w, -x as well: read by the hook's
    node checks); RequestError where sbatch itself refuses them."""
    from slurm_hetero.submit import Job  # late: slurm_hetero.submit imports this module

    pre = RELEASE_PREFIX[_release(slurm_release)]
    ensure = gpu_ensure(gres, gpus, gpus_per_node, gpus_per_task)
    if ensure:
        raise RequestError("sbatch", ensure)
    min_nodes, num_tasks, per_node = sbatch_counts(  # then sbatch's task-count check
        nodes, ntasks, ntasks_per_node, bool(gpus_per_task), bool(gpus), slurm_release
    )
    max_nodes = min_nodes if nodes else None  # -N N is min and max; without it max is unset
    refusal = gpu_refusal(gres, gpus, gpus_per_node, gpus_per_task, min_nodes, max_nodes, per_node)
    if refusal:
        raise RequestError("sbatch", refusal)
    # sbatch puts --gpus-per-node before the --gres items
    per_node_items = ([f"{pre}gpu:{gpus_per_node}"] if gpus_per_node else []) + (
        _gres_items(gres, pre) if gres else []
    )
    task_sep = "=" if pre == "gres/" and gpus_per_task and ":" not in gpus_per_task else ":"
    return Job(
        tres_per_node=",".join(per_node_items) or None,
        tres_per_job=f"{pre}gpu:{gpus}" if gpus else None,
        tres_per_task=_per_task(
            pre, cpus_per_task, f"{pre}gpu{task_sep}{gpus_per_task}" if gpus_per_task else None
        ),
        partition=partition,
        features=constraint,
        submit_uid=uid,
        user_id=uid,
        min_nodes=min_nodes,
        num_tasks=num_tasks,
        ntasks_per_node=per_node,
        max_nodes=max_nodes,
        cpus_per_task=cpus_per_task,
        cpus_per_tres=f"{pre}gpu:{cpus_per_gpu}" if cpus_per_gpu else None,
        mem_per_tres=f"{pre}gpu:{mebibytes(mem_per_gpu)}" if mem_per_gpu else None,
        min_mem_per_node=mebibytes(mem),
        min_mem_per_cpu=mebibytes(mem_per_cpu),
        req_nodes=nodelist,
        exc_nodes=exclude,
    )
