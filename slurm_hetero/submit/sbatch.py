"""The job_desc that sbatch sends for command-line options, per Slurm release, and its own
refusals with its words. Pure. `request explain` and the real-Slurm fuzz start from options, the
hook from the job_desc: they agree only if this is what sbatch really sends (measured with a probe
job_submit.lua on 22.05 and 24.11; docs/submit-protocol.md "What sbatch sends" has the table)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from slurm_hetero.core.errors import InventoryError, RequestError
from slurm_hetero.core.hostlist import expand, fold
from slurm_hetero.core.units import UNITS
from slurm_hetero.slurm.sbatchargs import MEMORY
from slurm_hetero.slurm.syntax import hostlist_size, whole_number
from slurm_hetero.submit import NO_VAL, Job  # defined before slurm_hetero.submit imports this module

if TYPE_CHECKING:
    from slurm_hetero.engine.score import ClusterModel

# The prefix each release's sbatch puts on TRES items (measured on 22.05 and 24.11).
RELEASE_PREFIX = {"22.05": "gres:", "24.11": "gres/"}
# sbatch's own refusal of --gpus-per-task without a task count (its text, per release)
GPUS_PER_TASK_REFUSAL = {
    "22.05": "--gpus-per-task used without either --gpus or -n/--ntasks is not allowed.",
    "24.11": "--gpus-per-task or --tres-per-task used without either --gpus or -n/--ntasks is not allowed.",
}

# sbatch's refusal of --gpus-per-socket (a non-zero count) without --sockets-per-node (or -B S)
GPUS_PER_SOCKET_REFUSAL = "--gpus-per-socket option requires --sockets-per-node specification"

# sbatch's refusals of what it reads in the TRES fields (slurm_strerror of the code, per release)
INVALID_GRES = "Invalid generic resource (gres) specification"
INVALID_TRES = "Invalid Trackable RESource (TRES) specification"
BASE_GRES = ("gpu", "gpumem", "gpucore")  # GresTypes as `gres render` writes it (+ shard when shared)
_ULLONG_MAX = 2**64 - 1
_SUFFIXES = {"", "k", "kib", "kb", "m", "mib", "mb", "g", "gib", "gb", "t", "tib", "tb", "p", "pib", "pb"}
_STRTOULL = re.compile(r"[ \t\n\v\f\r]*([+-]?)([0-9]*)")


def gres_names(model: ClusterModel) -> frozenset[str]:
    """The GRES names the rendered slurm.conf declares (GresTypes) for this cluster."""
    shared = any(facts.shares for facts in model.types.values())
    return frozenset(BASE_GRES + (("shard",) if shared else ()))


def _count(text: str, leading_digit: bool) -> int | None:
    """A GRES count as Slurm's _is_valid_number reads it (strtoull, k..p suffix), or None; 24.11
    (`leading_digit`) wants a digit first."""
    if leading_digit and not text[:1].isdigit():
        return None
    found = _STRTOULL.match(text)
    sign, digits = found.groups() if found else ("", "")
    rest = text[found.end() :] if found and digits else text
    value = _c_int(digits or "0")
    if value > _ULLONG_MAX:
        return None  # strtoull saturates (ERANGE) to ULLONG_MAX, which Slurm refuses
    value = (2**64 - value) % 2**64 if sign == "-" else value
    return None if value == _ULLONG_MAX or rest.lower() not in _SUFFIXES else value


def _item_22_05(body: str, names: frozenset[str] | None) -> str | None:
    """22.05's reading of one item after `gres:`: NAME, NAME:COUNT|TYPE, NAME:TYPE:COUNT."""
    name, *rest = body.split(":", 2)
    if not all(rest) or (len(rest) == 2 and _count(rest[1], False) is None):
        return INVALID_GRES
    zero = len(rest) and _count(rest[-1], False) == 0
    return None if zero or names is None or name in names else INVALID_GRES


def _item_24_11(body: str, names: frozenset[str] | None) -> str | None:
    """24.11's reading of one item after `gres/`: NAME[:TYPE][=COUNT|:COUNT] (the last = or :)."""
    name, typed, value = body, False, 1
    at = body.rfind("=") if "=" in body else body.rfind(":")
    if at >= 0:
        name, count = body[:at], body[at + 1 :]
        number = _count(count, True) if count else None
        if number is None and (not count or body[at] == "="):
            return INVALID_TRES
        typed, value = number is None, 1 if number is None else number
    if ":" in name:
        if typed:
            return INVALID_TRES
        name = name.split(":", 1)[0]
    if not name:  # the client lets it through; slurmctld refuses it (measured: `--gres=:gpumem:20G`)
        return INVALID_TRES
    return None if value == 0 or names is None or name in names else INVALID_GRES


def gres_refusal(field: str | None, slurm_release: str, names: frozenset[str] | None) -> str | None:
    """sbatch's refusal of a TRES field as it sends it, else None; `names`: GresTypes (None: any)."""
    marker, read = ("gres:", _item_22_05) if slurm_release == "22.05" else ("gres", _item_24_11)
    rest = field or ""
    while rest:
        at = rest.find(marker)
        if at < 0:
            break
        rest = rest[at + len(marker) :]
        if marker == "gres" and rest.startswith("/"):
            rest = rest[1:]
        body, _, rest = rest.partition(",")
        if body and (refusal := read(body, names)):
            return refusal
    return None


def _gpu_option(spec: str) -> tuple[str | None, int]:
    """(type or None, count) of a gpu item or --gpus* value: `a100:2` ("a100", 2), `2` (None, 2)."""
    tokens = spec.split(":")
    number = whole_number(tokens[-1], 4000)  # ASCII digits: `²` names a type, as the hook reads it
    named = tokens[:-1] if number is not None else tokens
    return (":".join(named) or None), 1 if number is None else number


def _records(
    gres: str | None, gpus: str | None, gpus_per_node: str | None, gpus_per_task: str | None
) -> dict[str | None, tuple[int | None, int | None, int | None]]:
    """Each gpu type's (per node, per task, per job) counts, untyped first, as sbatch checks them."""
    specs = [("node", item[4:]) for item in (gres or "").split(",") if item.startswith("gpu:")]
    specs += [  # each comma item of a --gpus* value is an item of its own (xfmt_tres)
        (scope, item)
        for scope, spec in (("node", gpus_per_node), ("task", gpus_per_task), ("job", gpus))
        for item in (spec or "").split(",")
        if item
    ]
    records: dict[str | None, dict[str, int]] = {}
    for scope, spec in specs:
        name, count = _gpu_option(spec)
        records.setdefault(name, {}).setdefault(scope, count)
    ordered = sorted(records.items(), key=lambda kv: kv[0] is not None)
    return {name: (c.get("node"), c.get("task"), c.get("job")) for name, c in ordered}


def gpu_ensure(
    gres: str | None, gpus: str | None, gpus_per_node: str | None, gpus_per_task: str | None
) -> str | None:
    """sbatch's first GPU checks, before the task count (`Failed to ensure ...`), else None."""
    for node, task, job in _records(gres, gpus, gpus_per_node, gpus_per_task).values():
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
    """sbatch's GPU checks after the task count, else None; min_nodes as sent, max_nodes -N's."""
    records = _records(gres, gpus, gpus_per_node, gpus_per_task)
    for node, task, job in records.values():
        if job and node and job % node:
            return "--gpus is not multiple of --gres=gpu/--gpus-per-node"
        required = job // node if job and node else None
        if required and ((min_nodes and required < min_nodes) or (max_nodes and required > max_nodes)):
            return (
                f"Based on --gpu and --gres=gpu/--gpus-per-node required nodes ({required}) "
                f"doesn't fall between min_nodes ({min_nodes}) and max_nodes "
                f"({NO_VAL if max_nodes is None else max_nodes}) boundaries"  # unset: sbatch prints NO_VAL
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


_STRTOL = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")
_LONG = 2**63


def _strtol(text: str) -> tuple[int | None, str]:
    """C's strtol(text, &end, 10): (value clamped to a long, or None without digits; the rest)."""
    found = _STRTOL.match(text)
    if not found:
        return None, text
    return max(-_LONG, min(_LONG - 1, _c_int(found.group(0)))), text[found.end() :]


def _c_int(number: str) -> int:
    """int() of a signed digit string, saturated at +-2^64 as C saturates (int() refuses 4,300 digits)."""
    number = number.strip()
    if len(number.lstrip("+-").lstrip("0")) > 20:
        return -(2**64) if number.startswith("-") else 2**64
    return int(number)


def _signed(value: int, bits: int = 32) -> int:
    """C's cast to a signed `bits`-bit integer (and its wrapping arithmetic): the low bits, signed."""
    return (value + 2 ** (bits - 1)) % 2**bits - 2 ** (bits - 1)


def _nodes(text: str, slurm_release: str) -> tuple[int, str]:
    """Slurm's str_to_nodes: a count with an optional k/m (x1024) suffix, as an int (22.05 casts,
    24.11 gives -1 outside 0..INT_MAX); -1 without digits; and what follows."""
    value, rest = _strtol(text)
    if value is None:
        return -1, text
    for suffix, factor in (("kK", 1024), ("mM", 1024 * 1024)):
        if rest[:1] and rest[0] in suffix:
            value, rest = value * factor, rest[1:]
    if slurm_release != "22.05":
        return (value if 0 <= value < 2**31 else -1), rest
    return _signed(value), rest


def node_range(text: str, slurm_release: str = "22.05") -> tuple[int, int]:
    """`-N TEXT` as sbatch reads it (verify_node_count): (min_nodes, max_nodes), a count N being
    N-N; RequestError with sbatch's words where it refuses (`-N -1` is 1-1, `-N 0` is sent as 0)."""

    def refuse(what: str) -> RequestError:
        return RequestError("sbatch", f'"{what}" is not a valid node count')

    def count(part: str) -> int:
        value, rest = _nodes(part, slurm_release)
        if rest.strip():
            raise refuse(part)
        return value

    if slurm_release != "22.05" and ("," in text or ":" in text):  # 24.11's job sizes
        sizes = []
        for token in filter(None, re.split(r"[,:-]", text)):
            value, rest = _strtol(token)
            if value is None or rest:
                raise refuse(token)
            sizes.append(value)
        if not sizes:
            raise refuse(text)
        low, high = min(sizes), max(sizes)
    elif "-" in text:
        low, high = (count(part) for part in text.split("-", 1))
        low = 1 if low < 0 else low
    else:
        low = high = count(text)
        if low < 0:
            raise refuse(text)
    if high and high < low:
        raise RequestError("sbatch", f"Maximum node count {high} is less than minimum node count {low}")
    if low < 0 or high < 0:
        raise RequestError("sbatch", f"invalid number of nodes (-N {low}-{high})")
    return low, high


def task_count(option: str, text: str, slurm_release: str = "22.05") -> int:
    """`-n`/`--ntasks-per-node` TEXT as sbatch reads it (parse_int); RequestError with its words."""
    value, rest = _strtol(text)
    if value is None or rest or value <= 0:
        raise RequestError("sbatch", f'Invalid numeric value "{text}" for {option}.')
    if slurm_release == "22.05" and value == _LONG - 1:
        raise RequestError("sbatch", f"Numeric argument ({value}) to big for {option}.")
    if slurm_release != "22.05" and value >= 2**31 - 1:
        raise RequestError("sbatch", f"Numeric argument ({value}) too large for {option}.")
    count = _signed(value)  # 22.05 keeps parse_int's int: past 2^31 it wraps, and its checks see that
    if option == "--ntasks" and count < 0:
        raise RequestError("sbatch", f"invalid number of tasks (-n {count})")
    if option == "--cpus-per-task" and count <= 0:
        raise RequestError("sbatch", f"invalid number of cpus per task (-c {count})")
    return count


def _gres_items(spec: str, prefix: str) -> list[str]:
    """`--gres=gpu:a100:1,gpumem:90G` as sbatch stores it: `gres:gpu:a100:1,gres:gpumem:90G`
    (Slurm's gres_prepend_tres_type: every item prefixed, then a doubled prefix made single, so
    22.05 keeps `gres:gpumem:20G` but sends `gres:gres/gpumem:20G`, 24.11 the other way round)."""
    text = prefix + spec.replace(",", "," + prefix)
    return text.replace(prefix + prefix, prefix).split(",")


def sbatch_counts(
    nodes: int | None,
    ntasks: int | None,
    ntasks_per_node: int | None,
    per_task: bool,
    job_total: bool,
    slurm_release: str = "22.05",
    ranged: bool = False,
    cpus: bool = False,
    hosts_named: bool = False,
) -> tuple[int | None, int | None, int | None]:
    """(min_nodes, num_tasks, ntasks_per_node) as sbatch of the release sends them (None: unset),
    for -N, -n, --ntasks-per-node, with or without --gpus-per-task (`per_task`) and --gpus
    (`job_total`); `ranged`: -N MIN-MAX, `cpus`: -c given (22.05 derives no task count for
    --gpus-per-task from a range, nor from -N alone with -c); `hosts_named`: -w given (24.11 then
    derives no node count from -n and --ntasks-per-node). RequestError with sbatch's own words
    where it refuses the options."""
    new_release = slurm_release != "22.05"
    if per_task and not ntasks and not job_total:
        if new_release and nodes and not ranged and (ntasks_per_node or not cpus):  # 24.11 fuzz
            ntasks = nodes * (ntasks_per_node or 1)
        elif not new_release and not ranged and (ntasks_per_node or (nodes and not cpus)):
            ntasks = (nodes or 1) * (ntasks_per_node or 1)  # 22.05: -N alone only without -c
        else:
            raise RequestError("sbatch", GPUS_PER_TASK_REFUSAL[slurm_release])
    if not ntasks and ntasks_per_node and not new_release and not ranged:
        ntasks = (nodes or 1) * ntasks_per_node
    if nodes and ntasks and ntasks < nodes:
        nodes = ntasks
    if new_release and not nodes and ntasks and ntasks_per_node and not hosts_named:
        nodes = -(-ntasks // ntasks_per_node)
    return nodes, ntasks, ntasks_per_node


def _gpu_items(prefix: str, spec: str | None) -> list[str]:
    """A --gpus* value as sbatch sends it: each comma item its own `PREFIXgpu:ITEM` (xfmt_tres)."""
    return [f"{prefix}gpu:{item}" for item in (spec or "").split(",") if item]


def _per_task_24_11(spec: str | None) -> str | None:
    """24.11's --gpus-per-task: `gres/gpu[:TYPE]=N` (N by strtol; a count of 0 is not sent)."""
    if not spec:
        return None
    at = min((i for i in (spec.find(":"), spec.find("=")) if i >= 0), default=-1)
    typed, rest = (f":{spec[:at]}", spec[at + 1 :]) if at >= 0 else ("", spec)
    count = _strtol(rest)[0] or 0
    return f"gres/gpu{typed}={count}" if count else None


NO_VAL64 = 2**64 - 2
MEM_PER_CPU = 2**63  # the flag bit of job_desc's pn_min_memory


def mebibytes(text: str | None, option: str = "--mem") -> int | None:
    """A --mem* value in MiB as sbatch's str_to_mbytes makes it (proc_args.c): strtoll, K (rounded
    up), M, G or T with an optional B, scaled in a signed 64 bits that wraps; RequestError where
    sbatch refuses it."""
    if not text:
        return None
    refused = RequestError("sbatch", f"Invalid {option} specification")
    found = _STRTOL.match(text)
    number = _c_int(found.group(0)) if found else -1
    if not 0 <= number < _LONG:  # none, negative, or strtoll's ERANGE
        raise refused
    rest = text[found.end() :] if found else ""
    suffix = rest[:1].upper()
    if rest[1:] not in ("", "B", "b") or suffix not in ("", "K", "M", "G", "T"):
        raise refused
    if suffix == "K":
        value = int(_signed(number + 1023, 64) / 1024)  # C division truncates toward zero
    else:
        value = _signed(number * UNITS[suffix], 64)
    value %= 2**64
    if value == NO_VAL64:
        raise refused
    return value


def _memory_fields(mem: str | None, mem_per_cpu: str | None) -> tuple[int | None, int | None]:
    """(min_mem_per_node, min_mem_per_cpu) as the hook reads them (job_submit_lua.c): sbatch sends
    either as pn_min_memory, --mem-per-cpu with the MEM_PER_CPU bit set."""
    per_node, per_cpu = mebibytes(mem), mebibytes(mem_per_cpu, "--mem-per-cpu")
    memory = per_node if per_node is not None else (None if per_cpu is None else per_cpu | MEM_PER_CPU)
    if memory is None or memory == NO_VAL64:
        return None, None
    return (None, memory - MEM_PER_CPU) if memory & MEM_PER_CPU else (memory, None)


# The sbatch options a decision reads (long names), each a `job_from_options` key with `_` for `-`.
OPTIONS = tuple(
    """gres gpus gpus-per-node gpus-per-task gpus-per-socket partition constraint nodes ntasks
    ntasks-per-node cpus-per-task cpus-per-gpu mem-per-gpu mem mem-per-cpu nodelist exclude
    sockets-per-node mincpus overcommit""".split()
)
# sbatch's refusal of two of them together (slurm_opt.c _validate_memory_options)
MEMORY_EXCLUSIVE = "--mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive."


def texts_of(values: Mapping[str, str | None]) -> dict[str, str]:
    """`job_from_options`'s options from sbatch's (long name -> last value)."""
    given = {name: values.get(name) for name in OPTIONS}
    if "overcommit" in values:  # a flag: given is all it says
        given["overcommit"] = "yes"
    node_info = values.get("extra-node-info")  # -B S[:C[:T]] sets the sockets per node too
    if given["sockets-per-node"] is None and node_info and node_info.split(":")[0]:
        given["sockets-per-node"] = node_info.split(":")[0]
    return {name.replace("-", "_"): text for name, text in given.items() if text is not None}


def het_sent(components: Sequence[Mapping[str, str]], slurm_release: str = "22.05") -> list[dict[str, str]]:
    """Each het component's options as sbatch sends its job_desc: every -x, and the other
    components' -w nodes, are each component's exc_nodes (components never share a node)."""
    if len(components) < 2:
        return [dict(c) for c in components]
    if slurm_release == "22.05":
        components = [_shrunk_hosts(c) for c in components]
    excluded = [c["exclude"] for c in components if c.get("exclude")]
    # --mem is not reset between components (slurm_opt.c: no reset_each_pass): the last one given
    # reaches a component without its own --mem*
    given = [c["mem"] for c in components if c.get("mem") is not None]
    mem = given[-1] if given else None
    sent = []
    for i, options in enumerate(components):
        others = [c["nodelist"] for j, c in enumerate(components) if j != i and c.get("nodelist")]
        nodes = ",".join(excluded + others)
        mem = options.get("mem", mem)
        carried = {"mem": mem} if mem is not None and not _other_mem(options) else {}
        sent.append({**options, **carried, "exclude": nodes} if nodes else {**options, **carried})
    return sent


def _shrunk_hosts(options: Mapping[str, str]) -> Mapping[str, str]:
    """22.05's -w under an explicit -n of fewer tasks than hosts: sbatch sorts the hosts
    (hostlist_uniq) and pops the last until each is a task ("setting nnodes to N")."""
    nodelist, ntasks = options.get("nodelist"), options.get("ntasks")
    if not nodelist or ntasks is None:
        return options
    try:
        tasks, hosts = task_count("--ntasks", ntasks), expand(nodelist)
    except (RequestError, InventoryError):
        return options  # sbatch or slurmctld refuses it before the hook
    return {**options, "nodelist": fold(hosts[:tasks])} if 0 < tasks < len(hosts) else options


def _other_mem(options: Mapping[str, str]) -> bool:
    """Whether a component gives --mem-per-cpu or --mem-per-gpu."""
    return options.get("mem_per_cpu") is not None or options.get("mem_per_gpu") is not None


def het_mem_refusal(components: Sequence[Mapping[str, str]]) -> int | None:
    """The het component sbatch refuses with MEMORY_EXCLUSIVE for a carried --mem (`het_sent`), or
    None; it is that component's check, so an earlier component's own refusal comes first."""
    seen = False
    for index, options in enumerate(components):
        if seen and _other_mem(options) and options.get("mem") is None:
            return index
        seen = seen or options.get("mem") is not None
    return None


# the counts sbatch reads with parse_int, in its order
COUNT_OPTIONS = ("ntasks", "ntasks_per_node", "cpus_per_task", "cpus_per_gpu", "mincpus")


def read_options(
    options: Mapping[str, str | None], slurm_release: str = "22.05"
) -> tuple[int | None, int | None, dict[str, int]]:
    """(min_nodes, max_nodes) of -N and the counts given; RequestError for what sbatch refuses while
    it reads the options, before any check (a het job: every component's first)."""
    nodes = options.get("nodes")
    low, high = node_range(nodes, slurm_release) if nodes is not None else (None, None)
    counts = {
        key: task_count("--" + key.replace("_", "-"), text, slurm_release)
        for key in COUNT_OPTIONS
        if (text := options.get(key)) is not None
    }
    memory = [options.get(name.replace("-", "_")) for name in MEMORY]
    for name, text in zip(MEMORY, memory):
        mebibytes(text, f"--{name}")
    if sum(text is not None for text in memory) > 1:
        raise RequestError("sbatch", MEMORY_EXCLUSIVE)
    # sbatch's -w against -N: more hosts than -N's maximum is refused (24.11 passes `-w a,b -N1` on)
    hosts = _hosts(options.get("nodelist"))
    if slurm_release == "22.05" and high and hosts is not None and hosts > high and hosts > (low or 0):
        raise RequestError("sbatch", f"invalid number of nodes (-N {hosts}-{high})")
    return low, high, counts


def _hosts(nodelist: str | None) -> int | None:
    """The hosts -w names (0: none); None where it is no hostlist (slurmctld's to refuse)."""
    try:
        return hostlist_size(nodelist) if nodelist else 0
    except ValueError:
        return None


def _uint16(count: int | None) -> int | None:
    """A count as sbatch stores it in a 16-bit job_desc field: its low 16 bits (its checks use all)."""
    return None if count is None else count % 2**16


CPUS_EXCLUSIVE = {
    "gres:": "--cpus-per-gpu is mutually exclusive with --cpus-per-task",
    "gres/": "--cpus-per-task, --tres-per-task=cpu:#, and --cpus-per-gpu are mutually exclusive",
}


def _hosts_nodes(nodelist: str | None, min_nodes: int | None, num_tasks: int | None) -> int | None:
    """min_nodes after sbatch's -w: raised to the hosts named, not above the tasks (`-n1 -w a,b`: 1)."""
    hosts = _hosts(nodelist)
    if hosts is None:
        return min_nodes
    hosts = min(hosts, num_tasks) if num_tasks else hosts
    return max(hosts, min_nodes or 0) or min_nodes


def job_from_options(
    *,
    uid: int | None = None,
    slurm_release: str = "22.05",
    names: frozenset[str] | None = None,
    **options: str | None,
) -> Job:
    """The job_desc that sbatch of `slurm_release` (22.05 or 24.11) would send for these options,
    as typed (`OPTIONS` keys, `nodes="1-2"`; overcommit: given at all; `names`: GresTypes, None to
    read any GRES name); RequestError where sbatch itself refuses them."""
    if unknown := set(options) - {name.replace("-", "_") for name in OPTIONS}:
        raise TypeError(f"not an sbatch option a decision reads: {sorted(unknown)}")
    nodes, max_nodes, counts = read_options(options, slurm_release)
    ntasks, ntasks_per_node, cpus_per_task, mincpus = map(
        counts.get, ("ntasks", "ntasks_per_node", "cpus_per_task", "mincpus")
    )
    gres, gpus, gpus_per_node, gpus_per_task, gpus_per_socket, cpus_per_gpu, mem_per_gpu, nodelist = map(
        options.get,
        "gres gpus gpus_per_node gpus_per_task gpus_per_socket cpus_per_gpu mem_per_gpu nodelist".split(),
    )
    pre = RELEASE_PREFIX[slurm_release]
    if cpus_per_task is not None and cpus_per_gpu:  # sbatch's first words, measured on each release
        raise RequestError("sbatch", CPUS_EXCLUSIVE[pre])
    # sbatch puts --gpus-per-node before the --gres items
    per_node_items = _gpu_items(pre, gpus_per_node) + (_gres_items(gres, pre) if gres else [])
    per_task = _per_task_24_11(gpus_per_task) if pre == "gres/" else ",".join(_gpu_items(pre, gpus_per_task))
    fields: dict[str, Any] = {
        "tres_per_job": ",".join(_gpu_items(pre, gpus)) or None,
        "tres_per_node": ",".join(per_node_items) or None,
        "tres_per_task": per_task or None,
        "tres_per_socket": ",".join(_gpu_items(pre, gpus_per_socket)) or None,
    }
    for text in fields.values():
        if refusal := gres_refusal(text, slurm_release, names):
            raise RequestError("sbatch", refusal)
    items = ",".join(filter(None, fields.values())).split(",")
    gpu_asked = any(re.match(r"gres[:/]gpu(?:$|[:=])", item) for item in items)  # gpumem is not a gpu
    if mem_per_gpu and not gpu_asked:  # before --cpus-per-gpu's
        per_gpu = f"{pre}gpu:{mebibytes(mem_per_gpu, '--mem-per-gpu')}"
        raise RequestError("sbatch", f"Requested mem_per_tres={per_gpu} but did not request any GPU.")
    if cpus_per_gpu and pre == "gres/" and not gpu_asked:  # 24.11 only
        raise RequestError(
            "sbatch", f"Requested cpus_per_tres={pre}gpu:{cpus_per_gpu} but did not request any GPU."
        )
    if pre == "gres/" and cpus_per_task:  # after 22.05 sbatch puts -c in tres_per_task too, first
        fields["tres_per_task"] = ",".join(filter(None, [f"cpu={cpus_per_task}", fields["tres_per_task"]]))
    if refusal := gpu_ensure(gres, gpus, gpus_per_node, gpus_per_task):
        raise RequestError("sbatch", refusal)
    if options.get("sockets_per_node") is None and any(
        _gpu_option(i)[1] for i in (gpus_per_socket or "").split(",") if i
    ):
        raise RequestError("sbatch", GPUS_PER_SOCKET_REFUSAL)
    min_nodes, num_tasks, per_node = sbatch_counts(  # then sbatch's task-count check
        nodes,
        ntasks,
        ntasks_per_node,
        bool(gpus_per_task),
        bool(gpus),
        slurm_release,
        bool(max_nodes and max_nodes != nodes),
        cpus_per_task is not None,
        bool(nodelist and "{" not in nodelist),
    )
    if pre == "gres:" or nodes is None:  # 24.11 keeps -N's count beside -w
        # 22.05 lowers the hosts to an explicit -n only, not to the tasks --ntasks-per-node makes
        min_nodes = _hosts_nodes(nodelist, min_nodes, ntasks if pre == "gres:" else num_tasks)
    # -N N is min and max (-N MIN-MAX: max as given, lowered with min to the tasks); else unset
    top = min(max_nodes, num_tasks) if max_nodes and num_tasks and min_nodes != nodes else max_nodes
    if refusal := gpu_refusal(gres, gpus, gpus_per_node, gpus_per_task, min_nodes, top, per_node):
        raise RequestError("sbatch", refusal)
    memory = _memory_fields(options.get("mem"), options.get("mem_per_cpu"))
    # sbatch's tasks x -c in 32 bits, which slurmctld holds the job to whatever the 16-bit fields
    # kept; with -O the nodes (the hook reads -O from it)
    min_cpus = min((num_tasks or (ntasks_per_node or 1) * (nodes or 1)) * (cpus_per_task or 1), 2**32 - 3)
    if options.get("overcommit") is not None:
        min_cpus = max(min_nodes or 1, 1)
    return Job(
        **fields,
        partition=options.get("partition"),
        features=options.get("constraint"),
        submit_uid=uid,
        user_id=uid,
        min_nodes=min_nodes,
        num_tasks=num_tasks,
        ntasks_per_node=_uint16(per_node),
        max_nodes=top,
        cpus_per_task=_uint16(cpus_per_task),
        min_cpus=min_cpus,
        pn_min_cpus=_uint16(max(mincpus or 0, cpus_per_task or 0)) or None,  # sbatch raises it to -c
        cpus_per_tres=f"{pre}gpu:{cpus_per_gpu}" if cpus_per_gpu else None,
        mem_per_tres=f"{pre}gpu:{mebibytes(mem_per_gpu, '--mem-per-gpu')}" if mem_per_gpu else None,
        min_mem_per_node=memory[0],
        min_mem_per_cpu=memory[1],
        req_nodes=nodelist,
        exc_nodes=options.get("exclude"),
    )
