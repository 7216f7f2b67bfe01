"""The job_desc of a job as the job_submit hook sees it (`Job`), and how the Python side reaches
the hook: `hook` runs job_submit.lua itself through lupa (the one request decision, DESIGN.md "One
request decision"), `tables` compiles the cluster's table it reads, `sbatch` models what sbatch
sends for command-line options."""

from __future__ import annotations

from dataclasses import dataclass

NO_VAL = 4294967294  # Slurm's unset 32-bit count, as job_submit.lua reads it


@dataclass(frozen=True)
class Job:
    """The job_desc fields the hook reads and writes (None: unset)."""

    tres_per_node: str | None = None
    tres_per_job: str | None = None
    tres_per_task: str | None = None
    tres_per_socket: str | None = None
    partition: str | None = None
    features: str | None = None
    admin_comment: str | None = None
    submit_uid: int | None = None
    user_id: int | None = None
    min_nodes: int | None = None  # -N
    num_tasks: int | None = None  # -n
    ntasks_per_node: int | None = None  # --ntasks-per-node
    max_nodes: int | None = None  # -N's upper bound (-N N: N)
    cpus_per_task: int | None = None  # -c
    min_cpus: int | None = None  # sbatch's tasks x -c, 32 bits: what -c's 16 bits lose (-O: the nodes)
    pn_min_cpus: int | None = None  # --mincpus, raised to -c
    cpus_per_tres: str | None = None  # --cpus-per-gpu: `gres:gpu:N`
    mem_per_tres: str | None = None  # --mem-per-gpu (MiB): `gres:gpu:N`
    min_mem_per_node: int | None = None  # --mem (MiB)
    min_mem_per_cpu: int | None = None  # --mem-per-cpu (MiB)
    req_nodes: str | None = None  # -w / --nodelist
    exc_nodes: str | None = None  # -x / --exclude
    het_job_id: int | None = None  # an edit's job record: its het job's id (0 / None: not heterogeneous)


# what sbatch sends for command-line options (re-exported: `request explain` and the tests start there)
from slurm_hetero.submit.sbatch import job_from_options, sbatch_counts  # noqa: E402,F401
