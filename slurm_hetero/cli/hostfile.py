"""Host files given to -w/--nodelist and -x/--exclude: a value with a "/" names a file that sbatch,
salloc and srun read themselves (proc_args.c `verify_node_list` -> `slurm_read_hostfile`, the same
in 22.05 and 24.11) and send its hosts, so the job_submit hook sees host names; the CLI adapters
read it likewise before a decision."""

from __future__ import annotations

import itertools

from slurm_hetero.core.errors import HeteroError
from slurm_hetero.core.readfile import read_bytes
from slurm_hetero.submit.sbatch import int32, strtol

MAX_HOSTFILE_BYTES = 1 << 20  # Slurm reads any size; the hook reads far fewer host names
BUFFER_SIZE = 1024  # slurm_read_hostfile's fgets buffer: a line is read in pieces of 1,023 bytes


def hostfile_hosts(data: bytes, path: str) -> str:
    """The hosts of a host file as `slurm_read_hostfile` sends them: pushed in order and folded
    (`ranged`; slurmctld, and the hook, then split names at blanks). Its C, byte for byte:
    - a line is read in pieces of at most 1,023 bytes; a piece ends at a NUL; "#" starts a comment
      ("\\#" a literal "#");
    - a full piece is cut after its last comma, the rest carried to the next piece (no comma: "Line
      N, of hostfile F too long"), so a comment past byte 1,023 of its line is read as hosts;
    - a line that starts with neither an ASCII letter nor a digit is an error, empty lines skipped;
    - comma-separated names, `name*N` the host atoi(N) times, from the "*" to the comma (`a* 2` is
      `a` twice, `a*2 b` is `a`); N of 0, or none, keeps the name as written;
    - no host at all is "Hostlist is empty!"."""
    hosts: list[tuple[str, int]] = []  # (name, times pushed)
    carried, number = b"", 0
    for chunk in _pieces(data):
        line = _uncommented(chunk)
        if len(line) == BUFFER_SIZE - 1:  # the buffer filled: keep what follows the last comma
            comma = line.rfind(b",")
            if comma < 0:
                raise HeteroError(f"Line {number}, of hostfile {path} too long")
            line, rest = line[:comma], line[comma + 1 :]
        else:
            number, rest = number + 1, b""
        text, carried = carried + line, rest
        if not text:
            continue
        if not (text[:1].isalpha() or text[:1].isdigit()):  # bytes: ASCII only, as C's isalpha
            raise HeteroError(f"Invalid hostfile {path} contents on line {number}")
        for piece in filter(None, text.split(b",")):
            base, star, times = piece.partition(b"*")
            count = int32(strtol(times.decode("latin-1"))[0] or 0) if star else 0  # atoi
            if count >= 0:  # pushed `count` times: a negative count, never; 0 keeps the piece as written
                hosts.append(((base if count else piece).decode("utf-8", "replace"), max(count, 1)))
    if not hosts:
        raise HeteroError(f"{path}: Hostlist is empty!")
    return ranged(hosts)


MAX_PUSHED = 1 << 16  # pushes of one name folded one by one; beyond, a host file of no use to the hook


def ranged(hosts: list[tuple[str, int]]) -> str:
    """`hostlist_ranged_string` of names pushed in order ((name, times)): a name's trailing digits
    are its number, a push of the next number of the last range's prefix and width extends it, and
    neighbouring ranges of one prefix and width share brackets: a100n1 three times is
    "a100n[1,1,1]", a100n1 and a100n2 "a100n[1-2]"; a name without digits stands alone."""
    ranges: list[tuple[str, int, int, int]] = []  # (prefix, width, low, high); width -1: no number
    for name, times in hosts:
        digits = len(name) - len(name.rstrip("0123456789"))
        prefix, width = name[: len(name) - digits], digits if digits else -1
        number = int(name[len(prefix) :]) if digits else 0
        for _ in range(min(times, MAX_PUSHED)):
            if ranges and width >= 0 and ranges[-1][:2] == (prefix, width) and ranges[-1][3] == number - 1:
                ranges[-1] = (prefix, width, ranges[-1][2], number)
            else:
                ranges.append((prefix, width, number, number))
    out: list[str] = []
    for (prefix, width), group in itertools.groupby(ranges, key=lambda r: (r[0], r[1])):
        items = list(group)
        if width == -1:
            out += [str(prefix)] * len(items)
            continue
        spans = [f"{lo:0{width}d}" + (f"-{hi:0{width}d}" if hi != lo else "") for _, _, lo, hi in items]
        single = len(items) == 1 and items[0][2] == items[0][3]
        out.append(f"{prefix}{spans[0]}" if single else f"{prefix}[{','.join(spans)}]")
    return ",".join(out)


def _pieces(data: bytes) -> list[bytes]:
    """What fgets returns from `data` with BUFFER_SIZE: up to and with a newline, at most 1,023 bytes."""
    out, at = [], 0
    while at < len(data):
        newline = data.find(b"\n", at, at + BUFFER_SIZE - 1)
        end = at + BUFFER_SIZE - 1 if newline < 0 else newline + 1
        out.append(data[at:end])
        at = end
    return out


def _uncommented(chunk: bytes) -> bytes:
    """The piece up to its NUL, newline or first "#" that no backslash escapes, as its loop leaves
    it: an escaping backslash is dropped by moving the rest left one byte, which leaves the last
    byte twice (cut by the newline that follows, or kept at the file's end)."""
    line = bytearray(chunk.split(b"\0", 1)[0])
    size, i = len(line), 0
    while i < size:
        if line[i] == ord("\n"):
            return bytes(line[:i])
        if line[i] == ord("#"):
            if i == 0 or line[i - 1] != ord("\\"):
                return bytes(line[:i])
            line[i - 1 : size - 1] = line[i:size]
            size -= 1
        i += 1
    return bytes(line)


def read_hosts(option: str, value: str | None) -> str | None:
    """`value` of -w/-x (`option`, for the error) with a host file read as the client reads it:
    its hosts comma-joined; other values as given. A file that cannot be read ends the submission,
    as sbatch's own error does ("slurm_allocate_resources error opening file FILE")."""
    if value is None or "/" not in value:
        return value
    try:
        return hostfile_hosts(read_bytes(value, MAX_HOSTFILE_BYTES, "host file"), value)
    except HeteroError as e:
        raise HeteroError(f"{option}: {e} (sbatch, salloc and srun read the file and end there)") from None
