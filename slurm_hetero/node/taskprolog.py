"""TaskProlog: export each vendor's own visible-device variable for the GPUs Slurm allocated.

Slurm exports CUDA_VISIBLE_DEVICES and the like; CANN, Cambricon's or Habana's runtimes read their
own variable. slurmstepd applies `export NAME=value` lines and shows `print ...` lines, reading
stdout and stderr together, so nothing else may be written; `protocol_lines` is the one gate. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from slurm_hetero.core.errors import HeteroError
from slurm_hetero.core.model import Device, SlurmDevice, SlurmNode
from slurm_hetero.slurm import syntax
from slurm_hetero.slurm.jobenv import TaskEnv

_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_,.\-]*$")
EXPORT_LINE = re.compile(r"export [A-Za-z_][A-Za-z0-9_]{0,127}=[A-Za-z0-9_,.\-=/:+%@]{0,4096}")
PRINT_PREFIX = "print slurm-hetero task-prolog: "
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


@dataclass(frozen=True)
class SharingLimits:
    """How shards of a device are enforced: MPS for NVIDIA, HAMi-core where its library exists."""

    shares: Mapping[str, int] = field(default_factory=dict)  # gres type -> MiB of one shard
    hami_core_library: str | None = None  # path, only when the file exists on this node


def export_lines(
    task: TaskEnv,
    node: SlurmNode,
    sharing: SharingLimits | None = None,
) -> list[str]:
    """Export lines of the allocated devices' vendors and a shard allocation's limits; `node` is
    built as `gres render` was run, so indices match gres.conf."""
    indexes = task.devices.gpu_indexes
    if not indexes:
        return []
    devices = node.devices
    for i in indexes:
        if not 0 <= i < len(devices):
            raise HeteroError(
                f"GPU index {i} is beyond the {len(devices)} devices of {node.name} in the inventory"
            )
    chosen = [devices[i] for i in indexes]
    lines = _lines_per_vendor(chosen)
    shards = task.shards_on_node
    if shards and len(chosen) == 1 and sharing:
        lines += shard_limit_lines(chosen[0].device, shards, sharing)
    return lines


def shard_limit_lines(device: Device, shards: int, sharing: SharingLimits) -> list[str]:
    """Limits for `shards` shards of `device`, counted as the hook counts them (M MiB in units of
    U: M // U shards)."""
    unit = sharing.shares.get(device.type)
    per_device = (device.memory_mib or 0) // unit if unit else 0
    if not unit or per_device <= 0:
        return []
    memory_mib = min(shards * unit, device.memory_mib or 0)
    percent = min(100, -(-100 * shards // per_device))
    lines = []
    if device.vendor == "nvidia":
        lines += [
            f"export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={memory_mib}M",
            f"export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percent}",
        ]
    if sharing.hami_core_library:
        lines += [
            f"export CUDA_DEVICE_MEMORY_LIMIT={memory_mib}m",
            f"export CUDA_DEVICE_SM_LIMIT={percent}",
            f"export LD_PRELOAD={sharing.hami_core_library}",
        ]
    return lines


def _lines_per_vendor(devices: Sequence[SlurmDevice]) -> list[str]:
    """Each vendor's variable by device id, and those its runtime applies inside that set by
    position (ROCm's HIP_VISIBLE_DEVICES inside ROCR_VISIBLE_DEVICES)."""
    values: dict[str, list[str]] = {}
    for device in devices:
        vendor = device.vendor
        if vendor.visible_devices_env:
            ids = values.setdefault(vendor.visible_devices_env, [])
            ids.append(vendor.visible_id(device.device))
            for name in vendor.relative_visible_envs:
                values[name] = [str(i) for i in range(len(ids))]
    lines = []
    for name, ids in values.items():
        value = ",".join(ids)
        if _SAFE_VALUE.match(value):
            lines.append(f"export {name}={value}")
    return lines


def print_line(message: str) -> str:
    """A warning as a TaskProlog `print` line of printable ASCII."""
    return PRINT_PREFIX + _UNPRINTABLE.sub("?", message)[:400]


def protocol_lines(lines: Sequence[str], warnings: Sequence[str]) -> tuple[list[str], list[str]]:
    """(lines to print, warnings for the log); a malformed export becomes a warning."""
    exports = [line for line in lines if EXPORT_LINE.fullmatch(line)]
    dropped = [f"dropped a malformed line {syntax.text(line, 60)}" for line in lines if line not in exports]
    notes = [*warnings, *dropped]
    return exports + [print_line(w) for w in notes], notes
