"""The cluster as the job_submit hook decides on it: `compile_model` turns node records and the
scoring options into a `ClusterModel`, which `submit.tables` writes into the hook's Lua table
(DESIGN.md, "One request decision"). Pure.

Policies order types by a key, ties by memory then name: `best-fit` smallest memory then price;
`fastest` highest throughput for the configured dtype; `cheapest` lowest price per throughput;
`greenest` highest throughput per watt (unknown figures rank last). With more than one device,
types with a device-to-device fabric (NVLink, xGMI, HCCS, ...) come first.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from slurm_hetero.core.devicespec import DeviceSpec
from slurm_hetero.core.model import SlurmDevice, SlurmNode
from slurm_hetero.core.units import format_size
from slurm_hetero.slurm.syntax import feature

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
    """Cluster-wide scoring settings (from `slurm_hetero.inventory.config`)."""

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
    """Nodes with `count` devices of a type and the same features, CPUs and RealMemory (MiB; 0:
    unknown, never checked); `hosts`: their inventory names, for exclusions (-x)."""

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

    @property
    def devices(self) -> int:
        return sum(s.count * s.nodes for s in self.shapes)


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

    def known_partitions(self) -> list[str]:
        """The partitions the model has a rule for, and the default one, sorted."""
        return sorted({*self.partitions, self.default_partition})


# ------------------------------------------------------------------------------ compile the model


@dataclass
class _Seen:
    """What the inventory says about one type, gathered node by node."""

    spec: DeviceSpec
    vendor: str
    memory: int | None = None
    # Every node holding several of its devices lists links on each (None: no such node). The job may
    # land on any node of the type, so one linked node does not make the type linked.
    linked: bool | None = None
    shapes: Counter[tuple[int, frozenset[str], int, int]] = field(default_factory=Counter)
    hosts: dict[tuple[int, frozenset[str], int, int], list[str]] = field(default_factory=dict)

    def add(self, devices: Sequence[SlurmDevice], features: frozenset[str], node: SlurmNode) -> None:
        if sizes := [d.device.memory_mib for d in devices if d.device.memory_mib]:
            self.memory = min(sizes + ([self.memory] if self.memory else []))
        if len(devices) > 1:
            self.linked = self.linked is not False and all(d.device.links for d in devices)
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
        bool(seen.linked) or spec.interconnect not in (None, *SLOW_INTERCONNECTS),
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
            by_type = summaries[id(node.devices)] = {}
            for device in node.devices:
                by_type.setdefault(device.type, []).append(device)
        features = frozenset(node.features)
        for name, devices in by_type.items():
            first = devices[0]
            seen.setdefault(name, _Seen(first.spec, first.device.vendor)).add(devices, features, node)
    return {name: _facts(name, seen[name], options) for name in sorted(seen)}


# ------------------------------------------------------------------------------------- ranking


def _ratio(num: float | None, den: float | None) -> float | None:
    """`num / den`, unknown where either is or `den` is 0 (a price of 0 is known: the cheapest)."""
    return num / den if num is not None and den else None


def policy_key(policy: str, facts: TypeFacts) -> float:
    """A type's primary sort key under a policy (lower ranks first; unknown -> +inf)."""

    def known(value: float | None, sign: float = 1.0) -> float:
        return math.inf if value is None else sign * value

    if policy == "best-fit":
        return facts.memory_mib
    if policy == "fastest":
        return known(facts.throughput, -1.0)
    if policy == "cheapest":
        return known(_ratio(facts.price, facts.throughput))
    if policy == "greenest":
        return known(_ratio(facts.throughput, facts.tdp_w), -1.0)
    raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")


def rank(policy: str, facts: Sequence[TypeFacts], multi: bool) -> tuple[str, ...]:
    """Type names in policy order (best-fit's ties by price); with `multi`, linked types first."""

    def key(f: TypeFacts) -> tuple[int, float, float, int, str]:
        price = math.inf if f.price is None else f.price
        second = price if policy == "best-fit" else 0.0
        return (0 if f.fast_link or not multi else 1, policy_key(policy, f), second, f.memory_mib, f.name)

    return tuple(f.name for f in sorted(facts, key=key))


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


def vendor_scope(
    facts: Mapping[str, TypeFacts], allowed: Iterable[str], wanted: Sequence[str]
) -> frozenset[str]:
    """The vendors a bare request (no gpu TYPE, no vendor's feature in -C) may land on: the `wanted`
    ones with allowed types, else the one with the most allowed devices (ties: name order); empty
    when `wanted` is, or when the scope would hold every vendor of the allowed types anyway."""
    present: Counter[str] = Counter()
    for name in allowed:
        present[facts[name].vendor] += facts[name].devices
    if not wanted or len(present) < 2:
        return frozenset()
    scope = frozenset(v for v in wanted if v in present)
    if not scope:
        scope = frozenset({min(present, key=lambda v: (-present[v], v))})
    return frozenset() if scope == set(present) else scope


def compile_model(nodes: Sequence[SlurmNode], options: ScoringOptions) -> ClusterModel:
    """Everything the Lua hook needs about a cluster (nodes without unhealthy devices)."""
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
