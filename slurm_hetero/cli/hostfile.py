"""Host files given to -w/--nodelist and -x/--exclude: a value with a "/" names a file that sbatch,
salloc and srun read themselves (proc_args.c `verify_node_list`) and send its hosts, so the
job_submit hook sees host names."""

from __future__ import annotations

from slurm_hetero.core.errors import HeteroError
from slurm_hetero.core.readfile import read_bytes
from slurm_hetero.submit.hook import hostfile_hosts

MAX_HOSTFILE_BYTES = 1 << 20  # Slurm reads any size; the hook reads far fewer host names


def read_hosts(option: str, value: str | None) -> str | None:
    """`value` of -w/-x (`option`) with a host file read as the client reads it (its hosts
    comma-joined); a file that cannot be read ends the submission, as in sbatch."""
    if value is None or "/" not in value:
        return value
    try:
        return hostfile_hosts(read_bytes(value, MAX_HOSTFILE_BYTES, "host file"), value)
    except HeteroError as e:
        raise HeteroError(f"{option}: {e} (sbatch, salloc and srun read the file and end there)") from None
