"""Host files given to -w/--nodelist and -x/--exclude: a value with a "/" names a file that sbatch,
salloc and srun read themselves (proc_args.c `verify_node_list` -> `slurm_read_hostfile`, the same
in 22.05 and 24.11) and send its hosts, so the job_submit hook sees host names; the CLI adapters
read it likewise before a decision."""

from __future__ import annotations

from slurm_hetero.core.errors import HeteroError
from slurm_hetero.core.readfile import read_text
from slurm_hetero.submit.sbatch import int32, strtol

MAX_HOSTFILE_BYTES = 1 << 20  # Slurm reads any size; the hook reads far fewer host names


def hostfile_hosts(text: str, path: str) -> str:
    """The hosts of a host file's text, comma-joined, as `slurm_read_hostfile` reads them: one or
    more comma-separated names (or hostlist expressions) a line, "#" to the line's end a comment
    ("\\#" a literal "#"), blank lines skipped, `name*N` the host N times (once here: a set; N as atoi
    reads it, from the "*" to the comma: `a* 2` is `a` twice and `a*2 b` drops `b`; none at all when
    N is negative or past a long, and `name*0` a name as written), then names split at blanks (as
    slurmctld's hostlist reads "a # comment", sent as "a "); a line that starts with neither a
    letter nor a digit, or no host at all, is sbatch's error."""
    hosts: list[str] = []
    for number, raw in enumerate(text.split("\n"), 1):
        line = _uncommented(raw)
        if not line:
            continue
        if not (line[0].isascii() and line[0].isalnum()):
            raise HeteroError(f"Invalid hostfile {path} contents on line {number}")
        for piece in line.split(","):
            base, star, times = piece.partition("*")
            count = int32(strtol(times)[0] or 0) if star else 0  # atoi: blanks first, a long saturates
            if count >= 0:  # pushed `count` times: a negative count, never; 0 keeps the piece as written
                hosts += (base if count else piece).split()  # slurmctld's hostlist splits at blanks
    if not hosts:
        raise HeteroError(f"{path}: Hostlist is empty!")
    return ",".join(hosts)


def _uncommented(line: str) -> str:
    """The line up to its first "#" that no backslash escapes (the escaping backslash dropped)."""
    out: list[str] = []
    for char in line:
        if char == "#":
            if out and out[-1] == "\\":
                out[-1] = "#"
                continue
            break
        out.append(char)
    return "".join(out)


def read_hosts(option: str, value: str | None) -> str | None:
    """`value` of -w/-x (`option`, for the error) with a host file read as the client reads it:
    its hosts comma-joined; other values as given. A file that cannot be read ends the submission,
    as sbatch's own error does ("slurm_allocate_resources error opening file FILE")."""
    if value is None or "/" not in value:
        return value
    try:
        return hostfile_hosts(
            read_text(value, MAX_HOSTFILE_BYTES, "host file", HeteroError, "replace"), value
        )
    except HeteroError as e:
        raise HeteroError(f"{option}: {e} (sbatch, salloc and srun read the file and end there)") from None
