"""Values as Slurm's config syntax takes them: the one validation of every value that reaches a
config line (slurm.conf, gres.conf) or a log line. Pure.

Each checker returns the value or raises `ValueError` with a short reason; callers say where the
value came from. The inventory schema holds the same patterns and bounds (a unit test checks
them); the bounds keep hostlist, Cores= and Links= expansion small.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Iterator, Sequence

MAX_HOSTS = 131_072  # hosts one inventory may name (hostlists expanded)
MAX_DEVICES_PER_NODE = 65_536
MAX_LINK_CELLS = 1 << 22  # devices with links x devices on the node: the size of its Links= rows
MAX_CPU_ID = 65_535  # Slurm counts CPUs and cores in uint16
MAX_CPU_IDS = 1 << 17  # ids one Cores= list may name before folding
MAX_INDEX = 65_535  # device index (/dev/davinciN) and link peer
MAX_HOST_NAME = 128
MAX_HOSTLIST = 4_096  # characters of one NodeName= hostlist expression
MAX_RANGE_DIGITS = 9  # digits of one number in a hostlist range

# A plain host name, as slurm.conf NodeName= takes it (and DNS would).
HOST_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
# gres.conf File=: an absolute path of plain characters (folded into File=/dev/x[0-7] ranges).
DEVICE_FILE = r"^/[A-Za-z0-9_.\-/]+$"
CPU_LIST = r"^[0-9]{1,5}(-[0-9]{1,5})?(,[0-9]{1,5}(-[0-9]{1,5})?)*$"


def _whole(pattern: str) -> re.Pattern[str]:
    """The schema's `^...$` with `\\Z`: Python's `$` also matches before a final newline."""
    return re.compile(pattern.removesuffix("$") + r"\Z")


_HOST_NAME, _DEVICE_FILE = _whole(HOST_NAME), _whole(DEVICE_FILE)
_CPU_LIST = _whole(CPU_LIST)
RESERVED_NODE_NAMES = {"default", "all"}  # NodeName=DEFAULT sets defaults; ALL names every node
# GRES names on our nodes (gres render's count GRES and Slurm's sharing GRES): a device Type= of the
# same name would render `Gres=gpu:gpumem:1` beside `gpumem:80G` and a clashing feature
RESERVED_GRES_TYPES = ("gpu", "gpumem", "gpucore", "shard", "mps")


def gres_type(name: str) -> str:
    """A device type (Type= of Name=gpu); ValueError for one of Slurm's or our GRES names."""
    if name.lower() in RESERVED_GRES_TYPES:
        raise ValueError(
            f"type {name!r} is a GRES name on these nodes ({', '.join(RESERVED_GRES_TYPES)}); "
            "give the device type another name"
        )
    return name


_FEATURE_BAD = re.compile(r"[^A-Za-z0-9_.]")
_BRACKETS = re.compile(r"\[([^\[\]]*)\]")


def host_name(name: str) -> str:
    """One host's NodeName (not a hostlist)."""
    if not name or len(name) > MAX_HOST_NAME or not _HOST_NAME.match(name):
        raise ValueError(
            f"{text(name)} is not a host name (letters, digits, '-', '_', '.'; "
            f"at most {MAX_HOST_NAME} characters, starting with a letter or digit)"
        )
    if name.lower() in RESERVED_NODE_NAMES:
        raise ValueError(f"{name!r} is reserved in slurm.conf (NodeName={name.upper()} means something else)")
    return name


MAX_ADDRESS = 253  # a DNS name
MAX_DNS_LABEL = 63  # one name between dots (the resolver's IDNA codec refuses longer or empty ones)


def address(value: str) -> str:
    """A host to connect to (MASTER_ADDR): a DNS name or an IP literal, nothing a shell, an env
    file or a log line would read as more."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    labels = value[:-1].split(".") if value.endswith(".") else value.split(".")
    if (
        not value
        or len(value) > MAX_ADDRESS
        or not _HOST_NAME.match(value)
        or not all(1 <= len(label) <= MAX_DNS_LABEL for label in labels)
    ):
        raise ValueError(
            f"{text(value)} is not a host name or IP address (letters, digits, '-', '_', '.'; "
            f"at most {MAX_ADDRESS} characters, {MAX_DNS_LABEL} between dots)"
        )
    return value


MAX_NUMBER_DIGITS = 18  # a whole number on the command line or in a spec: below 2**63


def whole_number(value: str, max_digits: int = MAX_NUMBER_DIGITS) -> int | None:
    """`value` as a whole number when it is at most `max_digits` ASCII digits, else None. Python's
    int() also takes other scripts' digits ('٢'), underscores and spaces; Slurm and the hook do not."""
    if not value or not value.isascii() or not value.isdigit() or len(value) > max_digits:
        return None
    return int(value)


def _spans(body: str, where: str) -> Iterator[tuple[int, int]]:
    """(low, high) of each `N` or `N-M` of a comma-separated list."""
    for part in body.split(","):
        first, dash, last = part.partition("-")
        for number in (first, last) if dash else (first,):
            if whole_number(number, MAX_RANGE_DIGITS) is None:
                raise ValueError(f"bad range {part!r} in {where} (want N or N-M, at most 9 digits)")
        low, high = int(first), int(last or first)
        if low > high:
            raise ValueError(f"reversed range {part!r} in {where} (write {last}-{first})")
        yield low, high


def hostlist_count(spec: str, limit: int = MAX_HOSTS) -> int:
    """How many hosts a NodeName hostlist names, without expanding it (characters: the schema's)."""
    for item in split_top(spec):
        if not item or not item[0].isalnum():
            raise ValueError(f"empty or bracket-first name in hostlist {spec!r}")
        if "[" not in item:
            host_name(item)
    return hostlist_size(spec, limit)


def hostlist_size(spec: str, limit: int = MAX_HOSTS) -> int:
    """How many names a hostlist-style expression (`File=/dev/nvidia[0-3]` too) stands for."""
    total = 0
    for item in split_top(spec):
        names = 1
        for body in _BRACKETS.findall(item):
            names *= sum(high - low + 1 for low, high in _spans(body, repr(spec)))
            if names > limit:
                break
        total += names
        if total > limit:
            raise ValueError(f"hostlist {spec!r} names more than {limit} hosts")
    return total if spec else 0


def split_top(spec: str) -> list[str]:
    """Split on commas outside brackets (`a[1,3],b` -> `a[1,3]`, `b`)."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(spec):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested brackets in hostlist {spec!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced brackets in hostlist {spec!r}")
        elif char == "," and depth == 0:
            items.append(spec[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced brackets in hostlist {spec!r}")
    return items + [spec[start:]]


def device_file(path: str) -> str:
    """gres.conf File=: absolute, plain characters, written one way (`/dev//nvidia0` and
    `/dev/./nvidia0` are refused: the same device under two spellings would be counted twice)."""
    if len(path) > 1024 or not _DEVICE_FILE.match(path):
        raise ValueError(
            f"device file {text(path)} must be an absolute path of letters, digits, '_', '.', '-' and '/'"
        )
    if "//" not in path and "/." not in path and not path.endswith("/"):
        return path  # already normal (the common case: skip normpath)
    normal = posixpath.normpath(path)
    if normal != path:
        raise ValueError(f"device file {path!r} is not in normal form; write {normal!r}")
    return path


def cpu_ids(cpu_list: str) -> list[int]:
    """gres.conf Cores= / CPU affinity `0-15,32-47` -> sorted distinct ids."""
    if not _CPU_LIST.match(cpu_list):
        raise ValueError(f"CPU list {text(cpu_list)} is not N[-M][,N[-M]...] with ids up to {MAX_CPU_ID}")
    ids: set[int] = set()
    total = 0
    for low, high in _spans(cpu_list, f"CPU list {text(cpu_list)}"):
        if high > MAX_CPU_ID:
            raise ValueError(f"CPU id {high} is beyond Slurm's {MAX_CPU_ID}")
        total += high - low + 1
        if total > MAX_CPU_IDS:
            raise ValueError(f"CPU list {cpu_list[:40]!r}... names more than {MAX_CPU_IDS} ids")
        ids.update(range(low, high + 1))
    return sorted(ids)


def ranges(ids: Sequence[int], stepped: bool = False) -> str:
    """Sorted distinct ids -> `0-3,8`. `stepped`, for people rather than Slurm: three or more
    evenly spaced ids also fold, as `8-20:4` (the step of Slurm's `--array`)."""
    out: list[str] = []
    i = 0
    while i < len(ids):
        step = ids[i + 1] - ids[i] if stepped and i + 1 < len(ids) else 1
        end = i + 1
        while end < len(ids) and ids[end] - ids[end - 1] == step:
            end += 1
        if step != 1 and end - i < 3:
            end = i + 1
        first, last = ids[i], ids[end - 1]
        out.append(str(first) if end == i + 1 else f"{first}-{last}" + (f":{step}" if step != 1 else ""))
        i = end
    return ",".join(out)


def feature(label: str) -> str:
    """A Slurm-safe node feature name (anything but letters, digits, `_` and `.` becomes `_`)."""
    return _FEATURE_BAD.sub("_", label)


def comment(value: object, limit: int = 200) -> str:
    """A value for a config comment line: as is when one short printable line, else `text(value)`
    (a newline would start a config line of its own)."""
    raw = str(value)
    return raw if len(raw) <= limit and raw.isprintable() else text(raw, limit)


def text(value: object, limit: int = 120) -> str:
    """Any value as one safe line for a log, an error message or a config comment."""
    raw = str(value)
    return repr(raw[:limit]) + ("..." if len(raw) > limit else "")
