"""Live NVML probing: `read_nvml` asks pynvml (passed in, never imported here) for raw values per
GPU (`NvmlGpu`); `devices_from_nvml` turns them into Device records purely.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_hetero.core.errors import ToolError
from slurm_hetero.core.model import Device, Health, Link
from slurm_hetero.vendors._nvidia_smi import VENDOR, XML_TOOL, cpu_list, health_reasons

logger = logging.getLogger("slurm_hetero.vendors.nvidia")  # the vendor's channel, as before the split


def _bits(words: Iterable[int]) -> list[int]:
    """The set bits of an NVML bitmask of 64-bit words (bit 0 of word 0 first)."""
    return [w * 64 + b for w, word in enumerate(words) for b in range(64) if word >> b & 1]


def cpu_list_from_mask(words: Iterable[int]) -> str | None:
    """NVML's CPU affinity bitmask as "0-15,32-47"; empty mask -> None."""
    return cpu_list(_bits(words))


def cuda_version_string(version: int) -> str:
    """nvmlSystemGetCudaDriverVersion's integer as CUDA prints it: 12040 -> "12.4"."""
    return f"{version // 1000}.{version % 1000 // 10}"


@dataclass(frozen=True)
class NvmlGpu:
    """Raw values NVML gave for one GPU (None or empty: the query failed or is unsupported)."""

    name: str | None
    minor: int | None
    memory_total_bytes: int | None = None
    uuid: str | None = None
    bus_id: str | None = None
    numa_node: int | None = None
    cpu_mask: tuple[int, ...] = ()
    mig_current: int | None = None
    nvlink_gpus: tuple[str, ...] = ()  # remote PCI bus id of each active NVLink to a GPU (or unknown)
    nvswitch_links: int = 0  # active NVLinks into an NVSwitch
    retired_pages_pending: bool = False
    remapped_rows: tuple[int, int, int, int] | None = None  # corrected, uncorrected, pending, failed
    errors: tuple[str, ...] = ()  # essential queries that failed ("nvmlDeviceGetName: GPU is lost")


def bus_key(bus_id: str) -> str:
    """A PCI bus id as sysfs spells it: "00000000:1A:00.0" -> "0000:1a:00.0"."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 2:
        parts.insert(0, "0000")
    if len(parts) != 3:
        return bus_id.strip().lower()
    return f"{parts[0][-4:].rjust(4, '0')}:{parts[1]}:{parts[2]}"


def nvlink_peers(gpus: Sequence[NvmlGpu]) -> list[Counter[int]]:
    """Links per peer minor number for each GPU: direct links by remote bus id, plus NVSwitch fabrics
    (every two switch-attached GPUs get min(their switch links), as `topo -m` shows)."""
    minor_of = {bus_key(g.bus_id): g.minor for g in gpus if g.bus_id and g.minor is not None}
    peers: list[Counter[int]] = []
    for i, gpu in enumerate(gpus):
        counts = Counter(minor_of[bus_key(r)] for r in gpu.nvlink_gpus if bus_key(r) in minor_of)
        for j, other in enumerate(gpus):
            if j != i and other.minor is not None and gpu.nvswitch_links and other.nvswitch_links:
                counts[other.minor] += min(gpu.nvswitch_links, other.nvswitch_links)
        if gpu.minor is not None:
            counts.pop(gpu.minor, None)
        peers.append(counts)
    return peers


def _nvml_health(gpu: NvmlGpu) -> list[str]:
    remapped = gpu.remapped_rows or (0, 0, 0, 0)
    flags = {
        "pending_retirement": gpu.retired_pages_pending,
        "remap_pending": remapped[2],
        "remap_failure": remapped[3],
    }
    return [*gpu.errors, *health_reasons({key: "Yes" for key, on in flags.items() if on})]


def devices_from_nvml(gpus: Sequence[NvmlGpu], driver: str | None, cuda: str | None) -> list[Device]:
    """NVML's raw values -> devices in index order; a GPU without name or minor number is skipped."""
    devices = []
    for gpu, peers in zip(gpus, nvlink_peers(gpus)):
        if gpu.minor is None or not gpu.name:
            logger.warning("NVML GPU %s unreadable (%s); skipped", gpu.bus_id or "?", "; ".join(gpu.errors))
            continue
        reasons = _nvml_health(gpu)
        devices.append(
            Device(
                vendor=VENDOR,
                model=gpu.name,
                index=gpu.minor,
                file=f"/dev/nvidia{gpu.minor}",
                memory_mib=gpu.memory_total_bytes // 2**20 if gpu.memory_total_bytes else None,
                numa_node=gpu.numa_node,
                cores=cpu_list_from_mask(gpu.cpu_mask),
                uuid=gpu.uuid,
                pci_bus_id=gpu.bus_id,
                links=tuple(Link(p, "nvlink", n) for p, n in sorted(peers.items())),
                health=Health.UNHEALTHY if reasons else Health.OK,
                health_reason="; ".join(reasons) or None,
                driver_version=driver,
                runtime_version=cuda,
                partition_mode="mig" if gpu.mig_current == 1 else None,
            )
        )
    return sorted(devices, key=lambda d: d.index)


def _text(value: Any) -> str | None:
    """pynvml strings come as str, or bytes inside structures."""
    if value is None:
        return None
    return (value.decode(errors="replace") if isinstance(value, bytes) else str(value)).strip() or None


SYSFS_PCI = Path("/sys/bus/pci/devices")


def sysfs_numa_node(bus_id: str) -> int | None:
    """The CPU-side NUMA node of a PCI device from sysfs; None when unknown (-1) or unreadable."""
    try:
        node = int((SYSFS_PCI / bus_key(bus_id) / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


_CPU_WORDS = max(16, -(-(os.cpu_count() or 1) // 64))  # 64-bit words of the CPU affinity mask


class _NvmlReader:
    """Calls pynvml for one GPU, turning NVMLError into None and recording failures of essential queries."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.errors: list[str] = []

    def call(self, name: str, *args: Any, essential: bool = False) -> Any:
        fn = getattr(self.nvml, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as e:
            if essential:
                self.errors.append(f"{name}: {e}")
            return None

    def nvlinks(self, handle: Any) -> tuple[tuple[str, ...], int]:
        """Remote bus ids of active NVLinks to GPUs, and the number of links into NVSwitches."""
        remotes: list[str] = []
        switch = 0
        for link in range(int(getattr(self.nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            state = self.call("nvmlDeviceGetNvLinkState", handle, link)
            if state is None:
                break  # no NVLink, or past this GPU's last link
            if state != 1:
                continue
            kind = self.call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            if kind == getattr(self.nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2):
                switch += 1
            elif kind in (None, getattr(self.nvml, "NVML_NVLINK_DEVICE_TYPE_GPU", 0)):
                pci = self.call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
                bus = _text(getattr(pci, "busId", None))
                remotes.extend([bus] if bus else [])
        return tuple(remotes), switch

    def numa_node(self, handle: Any, bus_id: str | None) -> int | None:
        node = sysfs_numa_node(bus_id) if bus_id else None
        if node is None:
            words = self.call(
                "nvmlDeviceGetMemoryAffinity", handle, 4, getattr(self.nvml, "NVML_AFFINITY_SCOPE_NODE", 0)
            )
            bits = _bits(words or ())
            node = bits[0] if len(bits) == 1 else None
        return node

    def gpu(self, index: int) -> NvmlGpu:
        """Everything `devices_from_nvml` needs about the GPU NVML numbers `index`."""
        self.errors = []
        handle = self.call("nvmlDeviceGetHandleByIndex", index, essential=True)
        if handle is None:
            return NvmlGpu(name=None, minor=None, errors=tuple(self.errors))
        memory = self.call("nvmlDeviceGetMemoryInfo", handle, essential=True)
        bus = _text(getattr(self.call("nvmlDeviceGetPciInfo", handle, essential=True), "busId", None))
        mig = self.call("nvmlDeviceGetMigMode", handle)
        nvlink_gpus, nvswitch_links = self.nvlinks(handle)
        remapped = self.call("nvmlDeviceGetRemappedRows", handle)
        return NvmlGpu(
            name=_text(self.call("nvmlDeviceGetName", handle, essential=True)),
            minor=self.call("nvmlDeviceGetMinorNumber", handle, essential=True),
            memory_total_bytes=getattr(memory, "total", None),
            uuid=_text(self.call("nvmlDeviceGetUUID", handle)),
            bus_id=bus,
            numa_node=self.numa_node(handle, bus),
            cpu_mask=tuple(int(w) for w in self.call("nvmlDeviceGetCpuAffinity", handle, _CPU_WORDS) or ()),
            mig_current=mig[0] if mig else None,
            nvlink_gpus=nvlink_gpus,
            nvswitch_links=nvswitch_links,
            retired_pages_pending=bool(self.call("nvmlDeviceGetRetiredPagesPendingStatus", handle)),
            remapped_rows=tuple(remapped) if remapped else None,
            errors=tuple(self.errors),
        )


def read_nvml(nvml: Any) -> tuple[list[NvmlGpu], str | None, str | None]:
    """All GPUs NVML sees, with the driver and CUDA versions (nvmlInit/nvmlShutdown around it)."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        hint = f"{e}; is the NVIDIA driver loaded? Or capture `{XML_TOOL}` and use --from-file"
        raise ToolError(["nvmlInit"], None, hint, status="NVML cannot start") from e
    try:
        reader = _NvmlReader(nvml)
        driver = _text(reader.call("nvmlSystemGetDriverVersion"))
        cuda_int = reader.call("nvmlSystemGetCudaDriverVersion")
        count = reader.call("nvmlDeviceGetCount", essential=True) or 0
        gpus = [reader.gpu(i) for i in range(count)]
    finally:
        nvml.nvmlShutdown()
    return gpus, driver, cuda_version_string(cuda_int) if cuda_int else None
