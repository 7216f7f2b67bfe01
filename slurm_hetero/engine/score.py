"""Filter and rank device types for a request: the rules the job_submit hook applies. Pure.

`compile_model` turns the cluster's node records (`model.SlurmNode`, built once per inventory load
by `slurm_hetero.nodes`) and the scoring options into a `ClusterModel`:
per device type its memory, node shapes (devices per node with the node's features), fast-link
flag and shares, plus the ranked type order of every policy. `decide` takes a `Need` and
returns a `Choice` or a `FitReport`. `slurm_hetero.submit.tables` writes the same model into the
Lua table, and `job_submit.lua` repeats `decide` over it, so the rules live here once:

1. The job's partitions (none given: the default partition, `ScoringOptions.default_partition`)
   pick the allowed types: the cluster allow/deny lists, each partition's own, and for a
   partition named after a vendor, as `gres render` makes them, that vendor's types; a bare
   request takes each partition's vendor scope first; a list (`-p a,b`) allows what any of them
   allows, and the first listed picks the policy and mode.
2. Each type, in policy order, fails on the first of: not allowed (TYPE_EXCLUDED), no node with
   the job's `--constraint` features (MISSING_FEATURE; only a plain `a&b` list is read),
   memory per device below gpumem (INSUFFICIENT_MEMORY), fewer devices per node than each node
   of the job needs (TOO_FEW_DEVICES), no such node with the CPUs and memory each node of the job
   needs (NODE_TOO_SMALL; `Need.cpus`, `Need.node_memory_mib`), fewer such nodes than the job
   spans, less those -x excludes and those earlier components of a heterogeneous job take
   (TOO_FEW_NODES; see `Need.nodes`, `Need.each`, `Need.excluded`, `Need.taken`). A gpu TYPE
   in the request limits the candidates to that type.
3. Policies order types by a key, ties by memory then name: `best-fit` smallest memory then
   price; `fastest` highest throughput for the configured dtype; `cheapest` lowest price per
   throughput; `greenest` highest throughput per watt (unknown figures rank last). With more
   than one device, types with a device-to-device fabric (NVLink, xGMI, HCCS, ...) come first.
4. Below a whole device (no gpu item, gpucore < 100), the first adequate type with a shard size
   (U MiB, as `gres render --share TYPE=U`: memory // U shards per device) gives `shard:S`,
   S = max(ceil(gpumem / U), ceil(gpucore * shards / 100)), if S is below the shards of one
   device. Else the first adequate type (`exact`), or every
   adequate type as a constraint (`any-fit`, only when the job's constraint is a plain list).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from slurm_hetero.devicespec import DeviceSpec
from slurm_hetero.engine.constraint import NO_CONSTRAINT, Alternatives, satisfies
from slurm_hetero.engine.reasons import CODE_ORDER, FitReport, ReasonCode, counts_text
from slurm_hetero.model import SlurmDevice, SlurmNode
from slurm_hetero.slurm.syntax import feature
from slurm_hetero.units import format_size

POLICIES = ("best-fit", "fastest", "cheapest", "greenest")
MODES = ("exact", "any-fit")
DTYPES = {
    "bf16": "bf16_tflops",
    "fp16": "fp16_tflops",
    "fp32": "fp32_tflops",
    "fp8": "fp8_tflops",
    "int8": "int8_tops",
}
SLOW_INTERCONNECTS = ("pcie", "roce")


# The partition `gres render` marks Default=YES (`job_submit.default_partition` when the site's is another).
DEFAULT_PARTITION = "gpu"


@dataclass(frozen=True)
class PartitionOptions:
    """Per-partition overrides; None inherits the cluster-wide value."""

    policy: str | None = None
    mode: str | None = None
    allow_types: tuple[str, ...] = ()
    deny_types: tuple[str, ...] = ()
    vendor_scope: tuple[str, ...] | None = None  # None: the cluster's (ScoringOptions.vendor_scope)


@dataclass(frozen=True)
class ScoringOptions:
    """Cluster-wide scoring settings (from `slurm_hetero.config`)."""

    policy: str = "best-fit"
    mode: str = "exact"
    dtype: str = "bf16"
    allow_types: tuple[str, ...] = ()
    deny_types: tuple[str, ...] = ()
    partitions: Mapping[str, PartitionOptions] = field(default_factory=dict)
    shares: Mapping[str, int] = field(default_factory=dict)  # gres type -> MiB of one shard
    # vendors a request without a type may land on (`job_submit.default_vendors`); (): every vendor
    vendor_scope: tuple[str, ...] = ()
    default_partition: str = DEFAULT_PARTITION  # the partition of a job that names none


@dataclass(frozen=True)
class Shape:
    """Nodes with `count` devices of a type, the same Slurm features, CPUs and RealMemory (MiB;
    0: unknown, never checked); `hosts`: their inventory names (host names or hostlists), for
    exclusions (-x)."""

    count: int
    features: frozenset[str]
    nodes: int = 1
    cpus: int = 0
    memory_mib: int = 0
    hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class TypeFacts:
    name: str
    vendor: str
    memory_mib: int
    feature: str
    fast_link: bool
    shares: int  # shards per device (0: not shared)
    shapes: tuple[Shape, ...]
    throughput: float | None = None
    price: float | None = None
    tdp_w: float | None = None
    shard_mib: int = 0  # memory of one shard

    @property
    def size(self) -> str:
        return format_size(self.memory_mib)


@dataclass(frozen=True)
class Rule:
    """What a partition (or the cluster default) decides with."""

    policy: str
    mode: str
    allowed: frozenset[str]
    vendors: frozenset[str] = frozenset()  # the vendor scope of a bare request (empty: none)


@dataclass(frozen=True)
class ClusterModel:
    types: Mapping[str, TypeFacts]  # sorted by name
    orders: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]  # policy -> (single, multi)
    default: Rule
    partitions: Mapping[str, Rule]
    features: frozenset[str] = frozenset()  # every node's features (Slurm refuses other names in -C)
    vendor_features: frozenset[str] = frozenset()  # features only one vendor's nodes carry
    default_partition: str = DEFAULT_PARTITION

    def rules(self, partition: str | None) -> list[Rule]:
        """The rule of each partition listed (`a,b`; none: the default partition), in order; the
        cluster default for a partition without one."""
        names = dict.fromkeys(n for n in (partition or self.default_partition).split(",") if n)
        return [self.partitions.get(n, self.default) for n in names] or [self.default]

    def known_partitions(self) -> list[str]:
        """The partitions the model has a rule for, and the default one, sorted."""
        return sorted({*self.partitions, self.default_partition})

    def unknown_partition(self, partition: str | None) -> str | None:
        """The first name of a job's partition list (`a,b`) that the model does not know, `''` for
        a list that names none (`,`, `''`), else None (also for a job that names none: None).
        Empty names in a list are skipped, as slurmctld skips them (`a,,b` is `a,b`); slurmctld
        refuses a list with an unknown name, or with no name, as "Invalid partition name"."""
        if partition is None:
            return None
        names = [n for n in partition.split(",") if n]
        known = set(self.partitions) | {self.default_partition}
        return next((n for n in names if n not in known), None) if names else ""

    def rule(self, partition: str | None) -> Rule:
        """The partitions' rules as one (`joined`)."""
        return joined(self.rules(partition))

    def order(self, policy: str, count: int) -> tuple[str, ...]:
        return self.orders[policy][1 if count > 1 else 0]


def joined(rules: Sequence[Rule]) -> Rule:
    """Rules of a partition list as one: the first one's policy and mode, the types any allows, the
    vendor scopes together (none when one of them has none)."""
    if len(rules) == 1:
        return rules[0]
    allowed = frozenset().union(*(r.allowed for r in rules))
    vendors = (
        frozenset() if not all(r.vendors for r in rules) else frozenset().union(*(r.vendors for r in rules))
    )
    return Rule(rules[0].policy, rules[0].mode, allowed, vendors)


# ------------------------------------------------------------------------------ compile the model


def _by_type(node: SlurmNode) -> dict[str, list[SlurmDevice]]:
    by_type: dict[str, list[SlurmDevice]] = {}
    for device in node.devices:
        by_type.setdefault(device.type, []).append(device)
    return by_type


def _fast(spec: DeviceSpec, linked: bool) -> bool:
    return linked or (spec.interconnect is not None and spec.interconnect not in SLOW_INTERCONNECTS)


@dataclass
class _Seen:
    """What the inventory says about one type, gathered node by node."""

    spec: DeviceSpec
    vendor: str
    memory: int | None = None
    linked: bool = False
    shapes: Counter[tuple[int, frozenset[str], int, int]] = field(default_factory=Counter)
    hosts: dict[tuple[int, frozenset[str], int, int], list[str]] = field(default_factory=dict)

    def add(self, devices: Sequence[SlurmDevice], features: frozenset[str], node: SlurmNode) -> None:
        sizes = [d.device.memory_mib for d in devices if d.device.memory_mib]
        if sizes:
            self.memory = min(sizes + ([self.memory] if self.memory else []))
        self.linked = self.linked or any(d.device.links for d in devices)
        key = (len(devices), features, node_cpus(node), node.record.real_memory_mib or 0)
        self.shapes[key] += node.hosts
        self.hosts.setdefault(key, []).append(node.name)


def node_cpus(node: SlurmNode) -> int:
    """The node's CPUs as slurm.conf gets them (`CPUs=`, else sockets x cores x threads); 0: unknown."""
    record = node.record
    if record.cpus:
        return record.cpus
    if record.sockets and record.cores_per_socket:
        return record.sockets * record.cores_per_socket * (record.threads_per_core or 1)
    return 0


def _facts(name: str, seen: _Seen, options: ScoringOptions) -> TypeFacts:
    spec = seen.spec
    rows = sorted(seen.shapes.items(), key=lambda kv: (-kv[0][0], sorted(kv[0][1]), -kv[0][2], -kv[0][3]))
    memory, unit = seen.memory or spec.memory_mib, int(options.shares.get(name, 0))
    return TypeFacts(
        name,
        seen.vendor,
        memory,
        feature(name),
        _fast(spec, seen.linked),
        memory // unit if unit else 0,
        tuple(
            Shape(n, f, c, cpus, mem, tuple(seen.hosts[(n, f, cpus, mem)])) for (n, f, cpus, mem), c in rows
        ),
        getattr(spec, DTYPES[options.dtype]),
        spec.price_per_hour_usd,
        spec.tdp_w,
        unit if unit and memory // unit else 0,
    )


def _all_facts(nodes: Sequence[SlurmNode], options: ScoringOptions) -> dict[str, TypeFacts]:
    seen: dict[str, _Seen] = {}
    summaries: dict[int, dict[str, list[SlurmDevice]]] = {}
    for node in nodes:
        # identical nodes share their resolved device tuple: group it by type once
        by_type = summaries.get(id(node.devices))
        if by_type is None:
            by_type = summaries[id(node.devices)] = _by_type(node)
        features = frozenset(node.features)
        for name, devices in by_type.items():
            first = devices[0]
            seen.setdefault(name, _Seen(first.spec, first.device.vendor)).add(devices, features, node)
    return {name: _facts(name, seen[name], options) for name in sorted(seen)}


# ------------------------------------------------------------------------------------- ranking


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def policy_key(policy: str, facts: Sequence[TypeFacts]) -> np.ndarray:
    """The primary sort key of each type under a policy (lower ranks first; unknown -> +inf)."""

    def column(values: Iterable[float | None], sign: float = 1.0) -> np.ndarray:
        return np.array([np.inf if v is None else sign * v for v in values], dtype=float)

    if policy == "best-fit":
        return np.array([f.memory_mib for f in facts], dtype=float)
    if policy == "fastest":
        return column((f.throughput for f in facts), -1.0)
    if policy == "cheapest":
        return column(_ratio(f.price, f.throughput) for f in facts)
    if policy == "greenest":
        return column((_ratio(f.throughput, f.tdp_w) for f in facts), -1.0)
    raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")


def rank(policy: str, facts: Sequence[TypeFacts], multi: bool) -> tuple[str, ...]:
    """Type names in policy order. Ties: best-fit by price; all by memory, then name. With
    `multi`, types with a device-to-device fabric come first."""
    if not facts:
        return ()
    price = np.array([np.inf if f.price is None else f.price for f in facts], dtype=float)
    second = price if policy == "best-fit" else np.zeros(len(facts))
    memory = np.array([f.memory_mib for f in facts], dtype=float)
    names = np.argsort(np.array([f.name for f in facts]), kind="stable")
    name_rank = np.empty(len(facts), dtype=int)
    name_rank[names] = np.arange(len(facts))
    links = np.array([0 if (f.fast_link or not multi) else 1 for f in facts])
    order = np.lexsort((name_rank, memory, second, policy_key(policy, facts), links))
    return tuple(facts[i].name for i in order)


# ------------------------------------------------------------------------------------ the model


def _allowed(names: Iterable[str], allow: Sequence[str], deny: Sequence[str]) -> frozenset[str]:
    return frozenset(n for n in names if (not allow or n in allow) and n not in deny)


def _rules(facts: Mapping[str, TypeFacts], options: ScoringOptions) -> tuple[Rule, dict[str, Rule]]:
    """The cluster default rule and one per partition (configured ones, and one per vendor)."""
    allowed = _allowed(facts, options.allow_types, options.deny_types)
    default = Rule(options.policy, options.mode, allowed, vendor_scope(facts, allowed, options.vendor_scope))
    vendors = {f.vendor for f in facts.values()}
    rules = {}
    for name in sorted(set(options.partitions) | vendors):
        part = options.partitions.get(name, PartitionOptions())
        allowed = _allowed(default.allowed, part.allow_types, part.deny_types)
        if name in vendors:  # a vendor's partition: its vendor, whatever the scope
            allowed = frozenset(t for t in allowed if facts[t].vendor == name)
        scope = options.vendor_scope if part.vendor_scope is None else part.vendor_scope
        rules[name] = Rule(
            part.policy or default.policy,
            part.mode or default.mode,
            allowed,
            vendor_scope(facts, allowed, scope),
        )
    return default, rules


def device_counts(facts: Iterable[TypeFacts]) -> Counter[str]:
    """Devices per vendor."""
    counts: Counter[str] = Counter()
    for f in facts:
        counts[f.vendor] += sum(s.count * s.nodes for s in f.shapes)
    return counts


def vendor_scope(
    facts: Mapping[str, TypeFacts], allowed: Iterable[str], wanted: Sequence[str]
) -> frozenset[str]:
    """The vendors a bare request (no gpu TYPE, no vendor's feature in -C) may land on under a rule
    with `allowed` types: the `wanted` ones that have allowed types, else the one with the most
    allowed devices (ties: name order); empty (no scope) when `wanted` is empty or the scope
    would hold every vendor of the allowed types anyway."""
    present = device_counts(facts[t] for t in allowed)
    if not wanted or len(present) < 2:
        return frozenset()
    scope = frozenset(v for v in wanted if v in present)
    if not scope:
        scope = frozenset({min(present, key=lambda v: (-present[v], v))})
    return frozenset() if scope == set(present) else scope


def check_options(options: ScoringOptions) -> None:
    """Policy, mode and dtype names must be known (ValueError naming the choices)."""
    for value, choices, what in [
        (options.policy, POLICIES, "policy"),
        (options.mode, MODES, "mode"),
        (options.dtype, tuple(DTYPES), "dtype"),
    ]:
        if value not in choices:
            raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")
    for part in options.partitions.values():
        check_options(
            replace(
                options, policy=part.policy or options.policy, mode=part.mode or options.mode, partitions={}
            )
        )


def compile_model(nodes: Sequence[SlurmNode], options: ScoringOptions) -> ClusterModel:
    """Everything `decide` (and the Lua hook) needs about a cluster (nodes without unhealthy devices)."""
    check_options(options)
    facts = _all_facts(nodes, options)
    listed = list(facts.values())
    orders = {p: (rank(p, listed, False), rank(p, listed, True)) for p in POLICIES}
    default, partitions = _rules(facts, options)
    features = frozenset(f for node in nodes for f in node.features)
    vendor_features = _vendor_features(nodes)
    return ClusterModel(
        facts, orders, default, partitions, features, vendor_features, options.default_partition
    )


def _vendor_features(nodes: Sequence[SlurmNode]) -> frozenset[str]:
    """Features that only nodes of one vendor carry: one of them in -C chooses the vendor."""
    vendors: dict[str, set[str]] = {}
    of_devices: dict[int, set[str]] = {}  # identical nodes share their device tuple
    for node in nodes:
        node_vendors = of_devices.get(id(node.devices))
        if node_vendors is None:
            node_vendors = of_devices[id(node.devices)] = {d.device.vendor for d in node.devices}
        for name in node.features:
            vendors.setdefault(name, set()).update(node_vendors or {""})
    return frozenset(name for name, seen in vendors.items() if len(seen) == 1 and "" not in seen)


# ------------------------------------------------------------------------------------ decisions


@dataclass(frozen=True)
class Need:
    """A parsed request plus the job fields that steer it."""

    request: str  # our items as the user wrote them, for messages
    memory_mib: int | None = None
    gpucore: int | None = None
    count: int = 1
    gpu_type: str | None = None
    explicit_count: bool = False  # a gpu item was given (whole devices, never shards)
    partition: str | None = None
    features: frozenset[str] | None = frozenset()  # None: a constraint too complex to read
    memory_items: tuple[str, ...] = ()  # gpumem/gpucore items as written, for hints
    nodes: int = 1  # nodes the job spans (-N, or tasks over tasks per node)
    per_node: int = 0  # devices each of those nodes needs (0: `count`)
    constraint: Alternatives | None = None  # a parsed constraint beyond a plain list (features None)
    named_features: frozenset[str] = frozenset()  # every feature name the constraint mentions
    cpus: int = 0  # CPUs each node of the job needs (0: none asked)
    node_memory_mib: int = 0  # memory each node of the job needs (0: none asked)
    # nodes of each type that earlier components of the same heterogeneous job take: Slurm never
    # puts two components on one node (22.05 and 24.11: `-w n : -w n` is "Invalid node name
    # specified"; two components for a one-node type stay PENDING (Resources))
    taken: Mapping[str, int] = field(default_factory=dict)
    # nodes of each shape (by type, in `TypeFacts.shapes` order) that -x/--exclude names (in a
    # heterogeneous job Slurm also gives every component the other components' -w nodes there);
    # only types with an excluded node
    excluded: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # an edit of a job holding this type, whose -x Slurm does not show the hook: the type it
    # holds is chosen whenever it takes the request (the job's -x may exclude any other)
    prefer: str | None = None

    @property
    def match(self) -> Alternatives:
        """What a node's features must satisfy (`engine.constraint`)."""
        if self.constraint is not None:
            return self.constraint
        return ((self.features,),) if self.features is not None else NO_CONSTRAINT

    @property
    def each(self) -> int:
        """Devices each node of the job needs."""
        return self.per_node or self.count


@dataclass(frozen=True)
class Choice:
    kind: str  # "gpu" (one type), "any" (constraint over types) or "shard"
    types: tuple[str, ...]
    count: int  # devices, or shards for "shard"
    policy: str
    mode: str
    constraint: tuple[str, ...] = ()  # node features to require ("any" and "shard")
    scope: tuple[str, ...] = ()  # the vendor scope applied and the vendors left out, for the note


def max_per_node(facts: TypeFacts, match: Alternatives) -> int:
    """Most devices of the type on one node satisfying the constraint (0: no such node)."""
    return max((s.count for s in facts.shapes if any(satisfies(a, s.features) for a in match)), default=0)


def holds(shape: Shape, need: Need) -> bool:
    """Whether a node of the shape has the CPUs and memory each node of the job needs (unknown
    figures hold anything)."""
    return (not shape.cpus or shape.cpus >= need.cpus) and (
        not shape.memory_mib or shape.memory_mib >= need.node_memory_mib
    )


def nodes_with(facts: TypeFacts, need: Need, count: int, less_excluded: bool = False) -> int:
    """Nodes with at least `count` devices of the type and the CPUs and memory the job needs per
    node, satisfying one alternative of the constraint (the best one: a matching OR puts every
    node on the same alternative); `less_excluded`: without the nodes -x excludes."""
    gone = need.excluded.get(facts.name, ()) if less_excluded else ()
    return max(
        sum(
            s.nodes - (gone[i] if i < len(gone) else 0)
            for i, s in enumerate(facts.shapes)
            if s.count >= count and holds(s, need) and satisfies(alt, s.features)
        )
        for alt in need.match
    )


def node_limit(facts: TypeFacts, need: Need) -> tuple[str, ...]:
    """The limit that nodes of the type with enough devices fall short of: their most CPUs, else
    their most memory (among those with the CPUs), as a `node_cpus` / `node_memory` message."""
    shapes = [
        s for s in facts.shapes if s.count >= need.each and any(satisfies(a, s.features) for a in need.match)
    ]
    inf = float("inf")
    cpus = max((s.cpus or inf for s in shapes), default=inf)
    if need.cpus > cpus:
        return ("node_cpus", facts.name, str(need.each), str(int(cpus)), str(need.cpus))
    memory = max((s.memory_mib or inf for s in shapes if not s.cpus or s.cpus >= need.cpus), default=inf)
    return (
        "node_memory",
        facts.name,
        str(need.each),
        format_size(int(memory)),
        format_size(need.node_memory_mib),
    )


def reason(facts: TypeFacts, need: Need, allowed: frozenset[str]) -> ReasonCode | None:
    """The first check the type fails, or None when it can take the request."""
    if facts.name not in allowed:
        return ReasonCode.TYPE_EXCLUDED
    per_node = max_per_node(facts, need.match)
    if per_node == 0:
        return ReasonCode.MISSING_FEATURE
    if need.memory_mib is not None and facts.memory_mib < need.memory_mib:
        return ReasonCode.INSUFFICIENT_MEMORY
    if per_node < need.each:
        return ReasonCode.TOO_FEW_DEVICES
    if (need.cpus or need.node_memory_mib) and nodes_with(facts, need, need.each) == 0:
        return ReasonCode.NODE_TOO_SMALL
    if (need.nodes > 1 or need.taken or need.excluded) and free_nodes(facts, need, need.each) < need.nodes:
        return ReasonCode.TOO_FEW_NODES
    return None


def free_nodes(facts: TypeFacts, need: Need, count: int) -> int:
    """`nodes_with`, less the nodes -x excludes and those earlier components of the heterogeneous
    job take."""
    return nodes_with(facts, need, count, less_excluded=True) - need.taken.get(facts.name, 0)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def shards(facts: TypeFacts, need: Need) -> int:
    """Shards of one device that cover gpumem and gpucore (at least 1)."""
    by_memory = ceil_div(need.memory_mib, facts.shard_mib) if need.memory_mib else 1
    by_core = ceil_div(need.gpucore * facts.shares, 100) if need.gpucore else 1
    return max(by_memory, by_core, 1)


def _shard_choice(model: ClusterModel, need: Need, adequate: Sequence[str], rule: Rule) -> Choice | None:
    if need.explicit_count or need.features is None or (need.gpucore or 0) >= 100:
        return None
    for name in adequate:
        facts = model.types[name]
        if facts.shares > 0:
            count = shards(facts, need)
            return (
                Choice("shard", (name,), count, rule.policy, rule.mode, (facts.feature,))
                if count < facts.shares
                else None
            )
    return None


def _whole_choice(model: ClusterModel, need: Need, adequate: Sequence[str], rule: Rule) -> Choice:
    if rule.mode == "any-fit" and need.gpu_type is None and need.features is not None:
        constraint = tuple(dict.fromkeys(model.types[t].feature for t in adequate))
        return Choice("any", tuple(adequate), need.count, rule.policy, rule.mode, constraint)
    return Choice("gpu", (adequate[0],), need.count, rule.policy, rule.mode)


def scoped(model: ClusterModel, rule: Rule, need: Need) -> Rule:
    """The rule a request decides with: for a bare one (no gpu TYPE, no feature in -C that only
    one vendor's nodes carry) the allowed types of the rule's vendor scope; else the rule
    without a scope."""
    if not rule.vendors or need.gpu_type or need.named_features & model.vendor_features:
        return replace(rule, vendors=frozenset())
    return replace(rule, allowed=frozenset(t for t in rule.allowed if model.types[t].vendor in rule.vendors))


def scope_note(model: ClusterModel, unscoped: Rule, rule: Rule) -> tuple[str, ...]:
    """(scope, the other vendors as `a or -C b`) for the `scope` message; () without a scope."""
    if not rule.vendors:
        return ()
    others = sorted({model.types[t].vendor for t in unscoped.allowed} - rule.vendors)
    return (",".join(sorted(rule.vendors)), " or -C ".join(others))


def decide(model: ClusterModel, need: Need) -> Choice | FitReport:
    """The hook's decision for one request (see the module docstring for the rules)."""
    rules = model.rules(need.partition)
    unscoped, rule = joined(rules), joined([scoped(model, r, need) for r in rules])
    order = model.order(rule.policy, need.each)
    candidates = (need.gpu_type,) if need.gpu_type else order
    preferred = model.types.get(need.prefer or "")
    if preferred is not None and not need.gpu_type and reason(preferred, need, rule.allowed) is None:
        candidates = (preferred.name,)
    adequate = [t for t in candidates if reason(model.types[t], need, rule.allowed) is None]
    if not adequate:
        return report(model, need, rule, candidates, unscoped)
    choice = _shard_choice(model, need, adequate, rule) or _whole_choice(model, need, adequate, rule)
    return replace(choice, scope=scope_note(model, unscoped, rule))


# -------------------------------------------------------------------------------------- reports


def size_up(mib: int, limit: int) -> str:
    """`mib` rounded up to whole GiB when that still fits in `limit`, else exact in MiB."""
    gib = ceil_div(mib, 1024)
    return f"{gib}G" if gib * 1024 <= limit else f"{mib}M"


def _headline(
    model: ClusterModel, need: Need, rule: Rule, usable: Sequence[str], counts: Mapping[ReasonCode, int]
) -> tuple[str, ...]:
    if need.gpu_type:
        facts = model.types[need.gpu_type]
        code = reason(facts, need, rule.allowed)
        if code == ReasonCode.TOO_FEW_NODES:
            found = free_nodes(facts, need, need.each)
            return ("type_nodes", facts.name, str(found), str(need.each), str(need.nodes))
        if code == ReasonCode.NODE_TOO_SMALL:
            return node_limit(facts, need)
        return {
            ReasonCode.TYPE_EXCLUDED: ("type_excluded", facts.name),
            ReasonCode.MISSING_FEATURE: ("type_features", facts.name),
            ReasonCode.INSUFFICIENT_MEMORY: ("type_memory", facts.name, facts.size),
        }.get(code, ("type_count", facts.name, str(max_per_node(facts, need.match))))  # type: ignore[arg-type]
    largest = None
    for name in usable:
        facts = model.types[name]
        if (
            largest is None
            or facts.memory_mib > largest.memory_mib
            or (facts.memory_mib == largest.memory_mib and facts.name < largest.name)
        ):
            largest = facts
    if need.memory_mib is not None and largest is not None and largest.memory_mib < need.memory_mib:
        return ("largest", largest.name, largest.size)
    return ("none_fit", counts_text(counts))


def _would_fit(model: ClusterModel, need: Need, usable: Sequence[str]) -> tuple[str, ...]:
    for name in usable:
        if name != need.gpu_type and reason(model.types[name], need, frozenset(usable)) is None:
            return ("would_fit", name, str(need.count), "".join("," + m for m in need.memory_items))
    return ()


def _split(model: ClusterModel, need: Need, usable: frozenset[str], rule: Rule, most: int) -> tuple[str, ...]:
    if need.memory_mib is None or need.each != need.count:
        return ()
    multi = [t for t in model.order(rule.policy, 2) if t in usable]
    for k in range(need.count + 1, most + 1):
        per = ceil_div(need.count * need.memory_mib, k)
        for name in multi:
            facts = model.types[name]
            if facts.memory_mib >= per and free_nodes(facts, need, k) >= need.nodes:
                return ("split", str(k), str(k), size_up(per, facts.memory_mib))
    return ()


def _excluded_counts(need: Need) -> str:
    """The nodes -x excludes per type, for messages: `a100_80g:1, l40s:1`."""
    return ", ".join(f"{t}:{sum(n)}" for t, n in sorted(need.excluded.items()))


def _hint(model: ClusterModel, need: Need, rule: Rule, usable: Sequence[str]) -> tuple[str, ...]:
    """What would fit: another type (for a typed request), else, where nodes are too small for the
    job's CPUs or memory, that limit (untyped; a typed request's headline says it), else the
    memory split over more devices, the most devices per node, or the most nodes."""
    if not usable:
        return ()
    per_node = [max_per_node(model.types[t], need.match) for t in usable]
    most = max(per_node)
    allowed = frozenset(usable)
    small = [t for t in usable if reason(model.types[t], need, allowed) == ReasonCode.NODE_TOO_SMALL]
    hint = _would_fit(model, need, usable) if need.gpu_type else ()
    if (
        not hint
        and need.taken
        and any(reason(model.types[t], need, allowed) == ReasonCode.TOO_FEW_NODES for t in usable)
    ):
        taken = ", ".join(f"{t}:{n}" for t, n in sorted(need.taken.items()))
        if need.excluded:  # both took nodes (adversarial A21): say both
            return ("het_nodes_excluded", taken, _excluded_counts(need))
        return ("het_nodes", taken)
    if (
        not hint
        and need.excluded
        and any(reason(model.types[t], need, allowed) == ReasonCode.TOO_FEW_NODES for t in usable)
    ):
        return ("excluded", _excluded_counts(need))
    if small:
        return hint or (node_limit(model.types[small[0]], need) if not need.gpu_type else ())
    hint = hint or _split(model, need, allowed, rule, most)
    if not hint and need.each > most:
        hint = ("per_node", str(most), usable[per_node.index(most)])
    if not hint and need.nodes > 1:
        hint = _nodes_hint(model, need, usable)
    return hint


def _nodes_hint(model: ClusterModel, need: Need, usable: Sequence[str]) -> tuple[str, ...]:
    """The type (first in order) with the most nodes for a job that fails only on its node count;
    a job that names a type (or holds one, an edit) hears of that type only."""
    allowed = frozenset(usable)
    candidates = (need.gpu_type,) if need.gpu_type else usable
    short = [t for t in candidates if reason(model.types[t], need, allowed) == ReasonCode.TOO_FEW_NODES]
    spans = [free_nodes(model.types[t], need, need.each) for t in short]
    if not spans:
        return ()
    best = max(spans)
    return ("nodes", str(best), str(need.each), short[spans.index(best)], str(best))


def _other_vendor(model: ClusterModel, need: Need, rule: Rule, unscoped: Rule) -> tuple[str, ...]:
    """For a request the vendor scope left without a fit: the first type of another vendor that
    would take it."""
    if not rule.vendors:
        return ()
    for name in model.order(rule.policy, need.each):
        facts = model.types[name]
        if facts.vendor not in rule.vendors and reason(facts, need, unscoped.allowed) is None:
            return ("other_vendor", name, facts.vendor, facts.vendor)
    return ()


def report(
    model: ClusterModel, need: Need, rule: Rule, candidates: Sequence[str], unscoped: Rule | None = None
) -> FitReport:
    """Why no candidate fits, and the best alternative (a type of another vendor first, when the
    vendor scope of `unscoped`, the rule before it, left it out)."""
    counts = Counter(reason(model.types[t], need, rule.allowed) for t in candidates)
    ordered = {code: counts[code] for code in CODE_ORDER if counts[code]}
    order = model.order(rule.policy, need.each)
    usable = [t for t in order if t in rule.allowed and max_per_node(model.types[t], need.match) > 0]
    return FitReport(
        need.request,
        ordered,
        len(candidates),
        _headline(model, need, rule, usable, ordered),
        _other_vendor(model, need, rule, unscoped or rule) or _hint(model, need, rule, usable),
    )
