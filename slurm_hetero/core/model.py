"""Plain records shared by every part: devices, links, nodes, inventories. Pure, no I/O."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from slurm_hetero.core.compat import StrEnum
from slurm_hetero.core.devicespec import DeviceSpec


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
    """One accelerator as Slurm schedules it (one GRES `File=`); `tool_id`: the tool's own id, if other."""

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


@dataclass(frozen=True)
class VendorTraits:
    """What the rest of the suite knows of a vendor, as data (`vendors.vendor_traits()`).

    `visible_devices_env` names devices by `visible_id` (None: Slurm's CUDA_VISIBLE_DEVICES serves);
    `relative_visible_envs` apply *inside* that set, so they take positions 0..n-1 (ROCm's
    HIP_VISIBLE_DEVICES inside ROCR_VISIBLE_DEVICES).
    """

    name: str = ""
    visible_devices_env: str | None = None
    relative_visible_envs: tuple[str, ...] = ()
    visible_by_tool_id: bool = False
    torch_backend: str = "gloo"  # init_process_group(backend=...) inside one vendor
    torch_package: str | None = None  # module that registers the device and backend (None: in torch)
    torch_device: str = "cuda"  # torch device type (torch.<device> module)
    stack_label: str = ""  # feature prefix of the software stack version (cuda12.4, cann8.0)
    ucc_memory: bool = False  # UCC has a memory component for this vendor (cuda, rocm)
    ccl_env_prefix: str | None = None  # the CCL's NCCL-style network variables: NCCL_IB_HCA, MCCL_...
    slurm_gpu_env: str = "no_gpu_env"  # gres.conf Flags=: the variable Slurm itself sets (no_gpu_env: none)
    slurm_autodetect: str | None = None  # gres.conf AutoDetect= mechanism for the vendor (nvml, rsmi)

    def visible_id(self, device: Device) -> str:
        """The id this device has in `visible_devices_env`."""
        return device.tool_id if self.visible_by_tool_id and device.tool_id else str(device.index)

    @property
    def stack_prefix(self) -> str:
        return self.stack_label or f"{self.name}_rt"


@dataclass(frozen=True)
class SlurmDevice:
    """One device as Slurm schedules it: the inventory record, its vendor's traits and its catalog facts."""

    device: Device
    vendor: VendorTraits
    spec: DeviceSpec

    @property
    def type(self) -> str:
        return self.device.type

    @property
    def index(self) -> int:
        return self.device.index

    @property
    def memory_mib(self) -> int:
        """The device's own memory, else the model's nominal memory."""
        return self.device.memory_mib or self.spec.memory_mib


@dataclass(frozen=True)
class SlurmNode:
    """One inventory node as Slurm sees it (`inventory.nodes.slurm_nodes`): devices in gres.conf order."""

    record: NodeInventory
    devices: tuple[SlurmDevice, ...]
    left_out: tuple[Device, ...]
    features: tuple[str, ...]
    hosts: int

    @property
    def name(self) -> str:
        return self.record.name

    @functools.cached_property  # read per rank by the launcher
    def gpu_env(self) -> str:
        """gres.conf `Flags=` of the node's gpu lines: its vendor's, or no_gpu_env on a node of
        several vendors (slurmd numbers its variable over all of them; each runtime counts its own)."""
        vendors = {d.vendor.name: d.vendor.slurm_gpu_env for d in self.devices}
        return next(iter(vendors.values())) if len(vendors) == 1 else "no_gpu_env"

    def types(self) -> list[str]:
        """The Slurm types of the node's devices, each once, in gres.conf order."""
        return list(dict.fromkeys(d.type for d in self.devices))
