"""This host's CPU topology and memory as `slurmd -C` reports them, from sysfs and /proc/meminfo
under a `root`. gres.conf `Cores=` takes core indices in hwloc's logical order, while vendor tools
print OS CPU ids that include SMT siblings; `HostTopology.slurm_cores` maps one to the other.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from slurm_hetero.core.errors import HeteroError
from slurm_hetero.core.readfile import read_text
from slurm_hetero.slurm.syntax import cpu_ids, ranges

logger = logging.getLogger(__name__)

CPU_DIR = "sys/devices/system/cpu"
MAX_KERNEL_FILE = 1 << 20  # sysfs files are one page; /proc/meminfo a few KiB


@dataclass(frozen=True)
class HostTopology:
    """The NodeName facts of one host and the OS CPU id -> Slurm core index map."""

    cpus: int
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    real_memory_mib: int | None = None
    core_of_cpu: Mapping[int, int] = field(default_factory=dict, compare=False, repr=False)

    def slurm_cores(self, cpu_list: str) -> str | None:
        """OS CPU ids -> Slurm core indices; None when an id is not an online CPU."""
        try:
            ids = cpu_ids(cpu_list)
        except ValueError as e:
            raise HeteroError(str(e)) from None
        if any(i not in self.core_of_cpu for i in ids):
            return None
        return ranges(sorted({self.core_of_cpu[i] for i in ids}))


def _read(path: Path) -> str:
    """A kernel file (a FIFO or /dev/zero in a captured tree is an error)."""
    return read_text(path, MAX_KERNEL_FILE, "kernel file").strip()


def _online_cpus(cpu_dir: Path) -> list[int]:
    online = cpu_dir / "online"
    if online.exists():
        return cpu_ids(_read(online))
    return sorted(int(p.name[3:]) for p in cpu_dir.glob("cpu[0-9]*") if p.name[3:].isdigit())


def memtotal_mib(root: Path = Path("/"), strict: bool = False) -> int | None:
    """MemTotal in MiB (slurmd's RealMemory), None when unreadable (`strict`: HeteroError)."""
    path = root / "proc/meminfo"
    try:
        for line in _read(path).splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
        error = HeteroError(f"{path}: no MemTotal line")
    except (ValueError, IndexError):
        error = HeteroError(f"{path}: MemTotal is not a number of kB")
    except HeteroError as e:
        error = e
    if strict:
        raise error
    return None


def topology_from_cpus(
    cpus: Mapping[int, tuple[int, int]], real_memory_mib: int | None = None
) -> HostTopology:
    """From {OS CPU id: (package id, core id)}."""
    cores: dict[tuple[int, int], list[int]] = {}  # in the order of their first CPU, as hwloc's
    for cpu, key in sorted(cpus.items()):
        cores.setdefault(key, []).append(cpu)
    packages: dict[int, list[tuple[int, int]]] = {}
    for key in cores:
        packages.setdefault(key[0], []).append(key)
    per_socket = max(len(v) for v in packages.values())
    core_of_cpu: dict[int, int] = {}
    for socket_index, keys in enumerate(packages.values()):
        for core_index, key in enumerate(keys):
            for cpu in cores[key]:
                core_of_cpu[cpu] = socket_index * per_socket + core_index
    return HostTopology(
        cpus=len(cpus),
        sockets=len(packages),
        cores_per_socket=per_socket,
        threads_per_core=max(len(v) for v in cores.values()),
        real_memory_mib=real_memory_mib,
        core_of_cpu=core_of_cpu,
    )


def read_topology(root: Path = Path("/"), strict: bool = False) -> HostTopology | None:
    """None, logged, when missing or irregular; `strict` (a captured tree) makes either an error."""
    cpu_dir = root / CPU_DIR
    cpus: dict[int, tuple[int, int]] = {}
    try:
        for cpu in _online_cpus(cpu_dir):
            topo = cpu_dir / f"cpu{cpu}" / "topology"
            cpus[cpu] = (int(_read(topo / "physical_package_id")), int(_read(topo / "core_id")))
        if not cpus:
            raise HeteroError("no online CPU")
        topology = topology_from_cpus(cpus, memtotal_mib(root, strict))
        shape = topology.sockets * topology.cores_per_socket * topology.threads_per_core
        if shape != topology.cpus:
            raise HeteroError(
                f"irregular topology: {topology.sockets} sockets x {topology.cores_per_socket} cores x "
                f"{topology.threads_per_core} threads is not the {topology.cpus} online CPUs"
            )
        return topology
    except (OSError, ValueError, HeteroError) as e:
        if strict:
            raise HeteroError(
                f"--host-root {root}: CPU topology under {cpu_dir} not usable ({e}); copy the "
                "node's /sys/devices/system/cpu and /proc/meminfo there"
            ) from None
        logger.warning("CPU topology not readable from %s (%s); NodeName gets CPUs only", cpu_dir, e)
        return None
