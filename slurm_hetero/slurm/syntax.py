"""Values as Slurm's config syntax takes them: the one validation of every value that reaches a
config line (slurm.conf, gres.conf) or a log line. Pure.

Each checker returns the value (or what it stands for) or raises `ValueError` with a short
reason; callers add where the value came from (`inventory.py` names the file and key path).
The inventory schema (`schemas/inventory.schema.json`) states the same patterns and bounds for
outside readers; `inventory.py` compiles it with the patterns below, and a unit test keeps the
shipped file equal to them.

Bounds: they keep every input small enough that nothing downstream (hostlist expansion, Cores=
expansion, Links= rows, Slurm's own uint16 CPU counts) can take unbounded time or memory.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Sequence

# ---------------------------------------------------------------------------------- bounds

MAX_HOSTS = 131_072  # hosts one inventory may name (hostlists expanded)
MAX_DEVICES_PER_NODE = 65_536
MAX_LINK_CELLS = 1 << 22  # devices with links x devices on the node: the size of its Links= rows
MAX_CPU_ID = 65_535  # Slurm counts CPUs and cores in uint16
MAX_CPU_IDS = 1 << 17  # ids one Cores= list may name before folding
MAX_NODE_MEMORY_MIB = 1 << 32  # 4 PiB of RealMemory
MAX_INDEX = 65_535  # device index (/dev/davinciN) and link peer
MAX_NUMA = 4_095
MAX_LINK_COUNT = 1_024
MAX_CPUS = 65_535  # CPUs, Sockets, CoresPerSocket, ThreadsPerCore (uint16 in slurm.conf)
MAX_HOST_NAME = 128
MAX_HOSTLIST = 4_096  # characters of one NodeName= hostlist expression
MAX_RANGE_DIGITS = 9  # digits of one number in a hostlist range

# --------------------------------------------------------------------------------- patterns

# A plain host name, as slurm.conf NodeName= takes it (and DNS would).
HOST_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
# A hostlist record name: host names, `prefix[1-4,7]suffix` ranges, joined by commas.
NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-\[\],]*$"
# gres.conf File=: an absolute path of plain characters (folded into File=/dev/x[0-7] ranges).
DEVICE_FILE = r"^/[A-Za-z0-9_.\-/]+$"
GRES_TYPE = r"^[a-z0-9][a-z0-9_\-.]*$"
VENDOR = r"^[a-z][a-z0-9_]*$"
FEATURE = r"^[A-Za-z0-9_.\-]+$"
LINK_KIND = r"^[a-z0-9_\-]+$"
CPU_LIST = r"^[0-9]{1,5}(-[0-9]{1,5})?(,[0-9]{1,5}(-[0-9]{1,5})?)*$"
WORD = r"^[A-Za-z0-9_.:\-]+$"  # ids: tool ids, NIC names
VERSION = r"^[A-Za-z0-9_.:+\-]+$"  # driver and runtime versions (6.9.0-rc5+)
TEXT = r"^[^\x00-\x1f\x7f]*$"  # free text that may reach a log line: one line, no control characters


def _whole(pattern: str) -> re.Pattern[str]:
    """The schema's `^...$` as Python matches it: `$` also matches before a final newline in
    Python, so it becomes `\\Z` (as fastjsonschema does with the schema)."""
    return re.compile(pattern.removesuffix("$") + r"\Z")


_HOST_NAME, _NODE_NAME, _DEVICE_FILE = _whole(HOST_NAME), _whole(NODE_NAME), _whole(DEVICE_FILE)
_CPU_LIST = _whole(CPU_LIST)
# The inventory schema's patterns and bounds, by (definition, property[, "items"]): applied to
# `schemas/inventory.schema.json` when it is compiled, and equal to what that file states.
MAX_DEVICE_MIB = 1024**3  # as units.MAX_MIB: the largest gpumem a request may name
_SHORT, _LONG = 64, 256
INVENTORY_RULES: dict[tuple[str, ...], dict[str, object]] = {
    ("top", "nodes"): {"minItems": 1, "maxItems": MAX_HOSTS},  # an empty inventory would wipe slurm.conf
    ("node", "name"): {"pattern": NODE_NAME, "maxLength": MAX_HOSTLIST},
    ("node", "cpus"): {"minimum": 1, "maximum": MAX_CPUS},
    ("node", "sockets"): {"minimum": 1, "maximum": MAX_CPUS},
    ("node", "cores_per_socket"): {"minimum": 1, "maximum": MAX_CPUS},
    ("node", "threads_per_core"): {"minimum": 1, "maximum": MAX_CPUS},
    ("node", "real_memory_mib"): {"minimum": 1, "maximum": MAX_NODE_MEMORY_MIB},
    ("node", "features"): {"maxItems": _LONG},
    ("node", "features", "items"): {"pattern": FEATURE, "maxLength": _SHORT},
    ("node", "nics"): {"maxItems": _LONG},
    ("node", "devices"): {"maxItems": MAX_DEVICES_PER_NODE},
    ("nic", "name"): {"pattern": WORD, "maxLength": _SHORT},
    ("nic", "numa_node"): {"minimum": 0, "maximum": MAX_NUMA},
    ("link", "peer"): {"minimum": 0, "maximum": MAX_INDEX},
    ("link", "kind"): {"pattern": LINK_KIND, "maxLength": _SHORT},
    ("link", "count"): {"minimum": 1, "maximum": MAX_LINK_COUNT},
    ("device", "vendor"): {"pattern": VENDOR, "maxLength": _SHORT},
    ("device", "model"): {"pattern": TEXT, "minLength": 1, "maxLength": _LONG},
    ("device", "type"): {"pattern": GRES_TYPE, "maxLength": _SHORT},
    ("device", "index"): {"minimum": 0, "maximum": MAX_INDEX},
    ("device", "file"): {"pattern": DEVICE_FILE, "maxLength": 1024},
    ("device", "memory_mib"): {"minimum": 1, "maximum": MAX_DEVICE_MIB},
    ("device", "numa_node"): {"minimum": 0, "maximum": MAX_NUMA},
    ("device", "cores"): {"pattern": CPU_LIST, "maxLength": 4096},
    ("device", "uuid"): {"pattern": TEXT, "maxLength": _LONG},
    ("device", "pci_bus_id"): {"pattern": WORD, "maxLength": _SHORT},
    ("device", "tool_id"): {"pattern": WORD, "maxLength": _SHORT},
    ("device", "links"): {"maxItems": MAX_LINK_COUNT},
    ("device", "health_reason"): {"pattern": TEXT, "maxLength": 1024},
    ("device", "driver_version"): {"pattern": VERSION, "maxLength": _SHORT},
    ("device", "runtime_version"): {"pattern": VERSION, "maxLength": _SHORT},
    ("device", "partition_mode"): {"pattern": TEXT, "maxLength": _SHORT},
}
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


# ----------------------------------------------------------------------------- node names


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
    """A host to connect to (MASTER_ADDR): a DNS name of letters, digits, '-', '_', '.', or an
    IPv4/IPv6 literal; nothing a shell, an env file or a log line would read as more (newline, NUL,
    spaces, quotes, `;`, `$`, ...)."""
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
    """`value` as a whole number when it is ASCII digits only (at most `max_digits`), else None.
    The one check of numbers users type: Python's int() and str.isdigit() also take other
    scripts' digits ('٢', fullwidth '２'), and int() underscores and spaces; Slurm, Lua's `%d`
    and the job_submit hook take none of them."""
    if not value or not value.isascii() or not value.isdigit() or len(value) > max_digits:
        return None
    return int(value)


def _range_count(body: str, where: str) -> int:
    total = 0
    for part in body.split(","):
        first, dash, last = part.partition("-")
        for number in (first, last) if dash else (first,):
            if whole_number(number, MAX_RANGE_DIGITS) is None:
                raise ValueError(f"bad range {part!r} in {where} (want N or N-M, at most 9 digits)")
        low, high = int(first), int(last or first)
        if low > high:
            raise ValueError(f"reversed range {part!r} in {where} (write {last}-{first})")
        total += high - low + 1
    return total


def hostlist_count(spec: str, limit: int = MAX_HOSTS) -> int:
    """How many hosts a NodeName hostlist (`gpu-[001-512],login1`) names, without expanding it;
    ValueError when it is malformed or names more than `limit` hosts."""
    if not spec or len(spec) > MAX_HOSTLIST or not _NODE_NAME.match(spec):
        raise ValueError(
            f"{text(spec)} is not a node name or hostlist (letters, digits, '-', '_', '.', "
            f"ranges in [], at most {MAX_HOSTLIST} characters)"
        )
    for item in split_top(spec):
        if not item or not item[0].isalnum():
            raise ValueError(f"empty or bracket-first name in hostlist {spec!r}")
        if "[" not in item:
            host_name(item)
    return hostlist_size(spec, limit)


def hostlist_size(spec: str, limit: int = MAX_HOSTS) -> int:
    """How many names any hostlist-style expression (node names, `File=/dev/nvidia[0-3]`) stands
    for, counted without expanding it; ValueError when brackets or ranges are malformed or it
    names more than `limit`."""
    total = 0
    for item in split_top(spec):
        names = 1
        for body in _BRACKETS.findall(item):
            names *= _range_count(body, repr(spec))
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


# ----------------------------------------------------------------------------- device values


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
    """gres.conf Cores= / CPU affinity `0-15,32-47` -> sorted distinct ids; ValueError when the
    list is malformed, reversed (`7-0`), beyond Slurm's CPU ids or too long."""
    if not _CPU_LIST.match(cpu_list):
        raise ValueError(f"CPU list {text(cpu_list)} is not N[-M][,N[-M]...] with ids up to {MAX_CPU_ID}")
    ids: set[int] = set()
    total = 0
    for part in cpu_list.split(","):
        first, _, last = part.partition("-")
        low, high = int(first), int(last or first)
        if low > high:
            raise ValueError(f"reversed CPU range {part!r} (write {last}-{first})")
        if high > MAX_CPU_ID:
            raise ValueError(f"CPU id {high} is beyond Slurm's {MAX_CPU_ID}")
        total += high - low + 1
        if total > MAX_CPU_IDS:
            raise ValueError(f"CPU list {cpu_list[:40]!r}... names more than {MAX_CPU_IDS} ids")
        ids.update(range(low, high + 1))
    return sorted(ids)


def ranges(ids: Sequence[int], stepped: bool = False) -> str:
    """Sorted distinct ids -> `0-3,8` (linear). `stepped`, for people to read rather than Slurm:
    three or more evenly spaced ids also fold, as `8-20:4` (the step of Slurm's `--array`), so a
    stage of every fourth rank of 40,000 is one short field."""
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


# ----------------------------------------------------------------------------- output values


def feature(label: str) -> str:
    """A Slurm-safe node feature name (anything but letters, digits, `_` and `.` becomes `_`)."""
    return _FEATURE_BAD.sub("_", label)


def comment(value: object, limit: int = 200) -> str:
    """A value for a config comment line (`# ... from NAME`): as is when it is one short line of
    printable text, else `text(value)`. A newline there would start a config line of its own."""
    raw = str(value)
    return raw if len(raw) <= limit and raw.isprintable() else text(raw, limit)


def text(value: object, limit: int = 120) -> str:
    """Any value as one safe line for a log, an error message or a config comment: quoted,
    control characters and backslashes escaped, at most `limit` characters of it kept."""
    raw = str(value)
    return repr(raw[:limit]) + ("..." if len(raw) > limit else "")
