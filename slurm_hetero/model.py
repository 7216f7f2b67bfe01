"""Plain records shared by every part: devices, links, nodes, inventories. Pure, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Health(StrEnum):
    OK = "ok"
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True)
class Link:
    """A direct device-to-device link (NVLink, xGMI, HCCS, Xe Link) to the device with index `peer`."""

    peer: int
    kind: str
    count: int = 1


@dataclass(frozen=True)
class Capture:
    """Text output of one vendor tool invocation; `source` is a file path or the argv that made it."""

    source: str
    text: str


@dataclass(frozen=True)
class Device:
    """One accelerator as Slurm will schedule it (one GRES `File=`).

    `index` is the device's position as Slurm and the runtime number it (the N in /dev/nvidiaN,
    /dev/davinciN); `tool_id` keeps the vendor tool's own id when it differs (Ascend "NPU 64 chip 0").
    `type` is the Slurm GRES Type, filled from the catalog when a parser leaves it empty.
    """

    vendor: str
    model: str
    index: int
    file: str
    memory_mib: int | None = None
    type: str = ""
    numa_node: int | None = None
    cores: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    tool_id: str | None = None
    links: tuple[Link, ...] = ()
    health: Health = Health.OK
    health_reason: str | None = None
    driver_version: str | None = None
    runtime_version: str | None = None
    partition_mode: str | None = None


@dataclass(frozen=True)
class Nic:
    """A high-speed NIC on the node (for RDMA-capable communicator choice)."""

    name: str
    kind: str = "ethernet"  # infiniband | roce | ethernet
    numa_node: int | None = None


@dataclass(frozen=True)
class NodeInventory:
    """One node (or a hostlist of identical nodes) with its devices."""

    name: str
    devices: tuple[Device, ...] = ()
    cpus: int | None = None
    sockets: int | None = None
    cores_per_socket: int | None = None
    threads_per_core: int | None = None
    real_memory_mib: int | None = None
    features: tuple[str, ...] = ()
    nics: tuple[Nic, ...] = ()


@dataclass(frozen=True)
class ClusterInventory:
    """A whole cluster: the contract between discover/merge and render/fit/plan."""

    nodes: tuple[NodeInventory, ...] = field(default_factory=tuple)
    version: int = 1
