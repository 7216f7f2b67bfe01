"""Cluster inventory -> plain data for the gres.conf / slurm-nodes.conf templates. Pure.

Nodes whose rendered lines are identical fold into one hostlist (`gpu-[001-512]`), so most work is
per distinct node shape.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_hetero.core import hostlist
from slurm_hetero.core.devicespec import Catalog
from slurm_hetero.core.errors import ConfigError
from slurm_hetero.core.model import ClusterInventory, Device, NodeInventory, SlurmNode
from slurm_hetero.core.units import format_size
from slurm_hetero.engine.score import DEFAULT_PARTITION
from slurm_hetero.inventory.document import NODE_FACTS as SLURMD_FACTS
from slurm_hetero.inventory.nodes import check_shares, slurm_nodes
from slurm_hetero.render.weights import CostModel, node_weight
from slurm_hetero.slurm.syntax import cpu_ids, ranges

POLICIES = ("binpack", "spread")


@dataclass(frozen=True)
class LocalSlurmd:
    """Dev-cluster settings: every node is a slurmd on this host, fake devices under `file_root`."""

    hostname: str
    port_base: int = 17001
    address: str = "127.0.0.1"
    file_root: str = "/dev/fakegpu"


@dataclass(frozen=True)
class RenderOptions:
    policy: str = "binpack"
    include_unhealthy: bool = False
    shares: Mapping[str, int] = field(default_factory=dict)  # gres type -> MiB of one shard
    local: LocalSlurmd | None = None
    autodetect: bool = False  # AutoDetect= lines for nodes of one vendor Slurm can detect (nvml, rsmi)


def _device_file(device: Device, node_name: str, local: LocalSlurmd | None) -> str:
    if local is None:
        return device.file
    return posixpath.join(local.file_root, node_name, posixpath.basename(device.file))


def _links_row(
    position: int, device: Device, positions: Mapping[tuple[str, int], int], size: int
) -> str | None:
    """gres.conf Links= of the device at `position`: -1 for itself, the link count per peer of its
    vendor (`positions`: (vendor, index) -> gres.conf position)."""
    row = [0] * size
    for link in device.links:
        peer = positions.get((device.vendor, link.peer))
        if peer is not None and peer != position:
            row[peer] = link.count
    if not any(row):
        return None
    row[position] = -1
    return ",".join(map(str, row))


def slurm_cores(cpu_list: str | None, node: NodeInventory) -> tuple[str | None, str | None]:
    """gres.conf `Cores=` from OS CPU ids, and a note when left out. Linux numbers SMT siblings
    `core + cores` on x86, so they fold onto their core; ids beyond the node's CPUs would make
    slurmd reject the line."""
    if not cpu_list:
        return None, None
    cores = (
        node.sockets * node.cores_per_socket
        if node.sockets and node.cores_per_socket
        else (node.cpus // (node.threads_per_core or 1) if node.cpus else None)
    )
    if cores is None:
        return cpu_list, None
    ids = cpu_ids(cpu_list)
    limit = node.cpus or cores * (node.threads_per_core or 1)
    if max(ids) >= limit:
        return None, f"CPU affinity {cpu_list} is beyond the node's {limit} CPUs; Cores= left out"
    return ranges(sorted({i % cores for i in ids})), None


def _gres_device_lines(slurm_node: SlurmNode, local: LocalSlurmd | None, notes: list[str]) -> list[GresLine]:
    """One line per device with links; consecutive same-type same-cores devices fold into one."""
    devices, node, flags = slurm_node.devices, slurm_node.record, slurm_node.gpu_env
    if any(d.vendor.slurm_gpu_env != flags for d in devices):  # several vendors: Slurm would have set one
        mixed = "several vendors: Flags=no_gpu_env, as slurmd takes one per node and numbers its "
        mixed += "variable over every vendor's devices; the TaskProlog's variables alone name them"
        if bare := sorted({d.vendor.name for d in devices if not d.vendor.visible_devices_env}):
            mixed += f"; {' and '.join(bare)} devices get none: isolate them with ConstrainDevices=yes"
        notes.append(mixed)
    linked = any(d.device.links for d in devices)
    positions = {(d.device.vendor, d.index): i for i, d in enumerate(devices)} if linked else {}
    cores_of: dict[str | None, tuple[str | None, str | None]] = {}
    lines: list[tuple[GresLine, list[str]]] = []
    for position, slurm_device in enumerate(devices):
        device = slurm_device.device
        if device.cores not in cores_of:
            cores_of[device.cores] = slurm_cores(device.cores, node)
        cores, note = cores_of[device.cores]
        if note:
            notes.append(f"{device.vendor} device {device.index}: {note}")
        links = _links_row(position, device, positions, len(devices)) if device.links else None
        file = _device_file(device, node.name, local)
        last = lines[-1][0] if lines else None
        if last and links is None and last.links is None and (last.type, last.cores) == (device.type, cores):
            lines[-1][1].append(file)
        else:
            lines.append((GresLine(device.type, "", cores, links, flags), [file]))
    return [dataclasses.replace(line, file=hostlist.fold(files)) for line, files in lines]


def shards_per_device(device: Device, shares: Mapping[str, int]) -> int:
    """How many shards `gres render --share TYPE=UNIT` gives this device (0: not shared)."""
    unit = shares.get(device.type)
    return (device.memory_mib or 0) // unit if unit else 0


@dataclass(frozen=True)
class GresLine:
    type: str
    file: str
    cores: str | None
    links: str | None
    flags: str  # the node's environment flag (SlurmNode.gpu_env)


@dataclass(frozen=True)
class NodeShape:
    """Everything rendered for a node except its name."""

    facts: tuple[int | None, ...]  # the node's SLURMD_FACTS, in that order
    gres_lines: tuple[GresLine, ...]
    per_type: tuple[tuple[str, int], ...]
    gpumem: str | None
    gpucore: int | None
    shards: int | None
    features: tuple[str, ...]
    vendors: tuple[str, ...]
    notes: tuple[str, ...] = ()
    shard_lines: tuple[tuple[str, int], ...] = ()  # (device file, shards) per shared device
    weight: int = 1
    gpu_node: bool = True  # has a device Slurm will see: member of the GPU partitions
    autodetect: str | None = None

    @property
    def gres(self) -> str:
        """The slurm.conf `Gres=` value."""
        parts = [f"gpu:{t}:{n}" for t, n in self.per_type]
        parts += [f"gpumem:{self.gpumem}"] if self.gpumem else []
        parts += [f"gpucore:{self.gpucore}"] if self.gpucore else []
        parts += [f"shard:{self.shards}"] if self.shards else []
        return ",".join(parts)


def slurmd_facts(node: NodeInventory) -> tuple[int | None, ...]:
    return tuple(getattr(node, k) for k in SLURMD_FACTS)


def node_shape(slurm_node: SlurmNode, options: RenderOptions, costs: CostModel) -> NodeShape:
    node, devices = slurm_node.record, [d.device for d in slurm_node.devices]
    notes = missing_facts_note(node)
    if slurm_node.left_out and not devices:
        named = ", ".join(
            f"{d.vendor} {d.index} ({d.health_reason or d.health})" for d in slurm_node.left_out
        )
        notes.insert(0, f"no healthy device ({named}): left out of the GPU partitions")
    lines = _gres_device_lines(slurm_node, options.local, notes)
    memory = sum(d.memory_mib or 0 for d in devices)
    shard_lines = tuple(
        (_device_file(d, node.name, options.local), n)
        for d in devices
        if (n := shards_per_device(d, options.shares))
    )
    shards = sum(n for _, n in shard_lines)
    autodetect = _autodetect(slurm_node, notes) if options.autodetect else None
    return NodeShape(
        slurmd_facts(node),
        tuple(lines),
        tuple(Counter(d.type for d in devices).items()),
        format_size(memory) if memory else None,
        100 * len(devices) if devices else None,
        shards or None,
        slurm_node.features,
        tuple(sorted({d.vendor for d in devices})),
        tuple(notes),
        shard_lines,
        node_weight(slurm_node.devices, options.policy, costs),
        bool(devices),
        autodetect,
    )


def _autodetect(slurm_node: SlurmNode, notes: list[str]) -> str | None:
    """The node's AutoDetect= mechanism, where slurmd can match what it detects to Type= (Slurm:
    the Type must be part of the detected name, spaces as underscores)."""
    vendors = {d.vendor.name: d.vendor.slurm_autodetect for d in slurm_node.devices}
    if len(vendors) > 1:
        notes.append(f"AutoDetect left out: the node has several vendors ({', '.join(vendors)}), slurmd one")
        return None
    mechanism = next(iter(vendors.values()), None)
    if mechanism is None:
        return None
    for d in slurm_node.devices:
        detected = d.device.model.lower().replace(" ", "_")
        if d.type.lower() not in detected:
            notes.append(
                f"AutoDetect left out: Type={d.type} is not part of the name {mechanism} reports "
                f"({detected}), so slurmd could not match them"
            )
            return None
    return mechanism


NODE_FACTS = {
    "cpus": "CPUs=1",
    "real_memory_mib": "RealMemory=1",
}


def missing_facts_note(node: NodeInventory) -> list[str]:
    """What Slurm will assume for node facts the inventory lacks."""
    missing = [assumed for key, assumed in NODE_FACTS.items() if getattr(node, key) is None]
    if not missing:
        return []
    return [
        f"no {' or '.join(k.split('=')[0] for k in missing)} in the inventory: Slurm will assume "
        f"{', '.join(missing)} (discover live on the node, or pass --cpus/--real-memory with --from-file)"
    ]


def _group(
    nodes: Iterable[SlurmNode], options: RenderOptions, costs: CostModel
) -> dict[NodeShape, list[str]]:
    """Nodes by rendered shape, computed once per resolved device tuple (shared by identical nodes)."""
    groups: dict[NodeShape, list[str]] = {}
    shapes: dict[tuple[Any, ...], NodeShape] = {}
    for slurm_node in nodes:
        node = slurm_node.record
        key = (node.name if options.local else "", id(slurm_node.devices), slurmd_facts(node), node.features)
        shape = shapes.get(key)
        if shape is None:
            shape = shapes[key] = node_shape(slurm_node, options, costs)
        groups.setdefault(shape, []).append(node.name)
    return groups


def per_host(nodes: Iterable[SlurmNode]) -> list[SlurmNode]:
    """One node per host: a dev cluster gives each host its own slurmd port and fake devices."""
    out: list[SlurmNode] = []
    for node in nodes:
        if node.hosts == 1 and "[" not in node.name:
            out.append(node)
            continue
        for host in hostlist.expand(node.name):
            record = dataclasses.replace(node.record, name=host)
            out.append(dataclasses.replace(node, record=record, hosts=1))
    return out


MAX_PORT = 65_535


def check_ports(port_base: int, hosts: int) -> None:
    """The dev cluster's slurmd ports, one per host from `port_base`, are TCP ports."""
    if port_base + hosts - 1 > MAX_PORT:
        raise ConfigError(
            f"--port-base {port_base}: {hosts} slurmd need ports up to {port_base + hosts - 1}, past "
            f"{MAX_PORT}; use --port-base {max(1, MAX_PORT - hosts + 1)} or lower"
            if hosts <= MAX_PORT
            else f"--port-base {port_base}: {hosts} slurmd on one host need more than {MAX_PORT} ports"
        )


def build_context(inventory: ClusterInventory, catalog: Catalog, options: RenderOptions) -> dict[str, Any]:
    built = slurm_nodes(inventory, catalog, include_unhealthy=options.include_unhealthy)
    check_shares(options.shares, built)
    if options.local:
        check_ports(options.local.port_base, sum(n.hosts for n in built))
    groups = _group(per_host(built) if options.local else built, options, CostModel.from_catalog(catalog))
    shapes, names_of = list(groups), list(groups.values())
    folded = [hostlist.fold(names) for names in names_of]
    nodes = [_node_entry(s, f, i, options) for i, (s, f) in enumerate(zip(shapes, folded))]
    vendors = sorted({v for s in shapes for v in s.vendors})
    partitions = [
        {
            "name": v,
            "nodes": hostlist.fold(n for s, names in zip(shapes, names_of) if v in s.vendors for n in names),
        }
        for v in vendors
    ]
    # from the names, not the shapes' folded lists (NodeSet would re-parse those)
    gpu_nodes = [n for s, names in zip(shapes, names_of) if s.gpu_node for n in names]
    warnings = [f"{f}: {n}" for s, f in zip(shapes, folded) for n in s.notes]
    gres_types = ["gpu", "gpumem", "gpucore"] + (["shard"] if any(s.shards for s in shapes) else [])
    return {
        "gres_types": ",".join(gres_types),
        "accounting_tres": accounting_tres(shapes, gres_types),
        "notes": warnings,
        "gres_groups": [
            {
                "nodes": f,
                "autodetect": s.autodetect,
                "lines": s.gres_lines,
                "gpumem": s.gpumem,
                "gpucore": s.gpucore,
                "shards": s.shard_lines,
            }
            for s, f in zip(shapes, folded)
        ],
        "nodes": nodes,
        "partitions": partitions,
        "all_nodes": hostlist.fold(gpu_nodes) if gpu_nodes else "",
        "default_partition": DEFAULT_PARTITION,
        "lln": options.policy == "spread",
        "policy": options.policy,
        "node_count": sum(n.hosts for n in built),
        "shape_count": len(shapes),
    }


def accounting_tres(shapes: Iterable[NodeShape], gres_types: Sequence[str]) -> str:
    """`AccountingStorageTRES`: Slurm accounts a GRES (and each gpu type) only when named there."""
    types = sorted({t for s in shapes for t, _ in s.per_type})
    return ",".join(["gres/gpu", *(f"gres/gpu:{t}" for t in types), *(f"gres/{g}" for g in gres_types[1:])])


ENTRY_FACTS = ("cpus", "sockets", "cores_per_socket", "threads_per_core", "real_memory")  # SLURMD_FACTS


def _node_entry(shape: NodeShape, names: str, position: int, options: RenderOptions) -> dict[str, Any]:
    local = options.local
    return {
        "name": names,
        **dict(zip(ENTRY_FACTS, shape.facts)),
        "gres": shape.gres,
        "features": ",".join(shape.features),
        "weight": shape.weight,
        "local": (
            {"address": local.address, "hostname": local.hostname, "port": local.port_base + position}
            if local
            else None
        ),
    }
