"""Which device types of an inventory can hold a job, and with how few devices.

Pure: node records (`slurm_hetero.inventory.nodes`) and a per-device memory estimate (`engine.fit`'s
`Breakdown`) in, `DeviceOption`s out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from slurm_hetero.core.model import SlurmNode
from slurm_hetero.engine.reasons import ReasonCode

if TYPE_CHECKING:
    from slurm_hetero.engine.fit import Breakdown

MIB = 2**20


@dataclass(frozen=True)
class DeviceOption:
    """One device type and whether the job fits on it: `memory_bytes` per device (the type's
    smallest), `needed` the fewest devices that hold the job (None when no count up to the limit
    does), `per_device_bytes` the estimate at that count."""

    type: str
    vendor: str
    memory_bytes: float | None
    available: int
    needed: int | None
    per_device_bytes: float | None
    reason: ReasonCode | None = None

    @property
    def fits(self) -> bool:
        return self.reason is None


@dataclass
class _TypeGroup:
    type: str
    vendor: str
    memory_bytes: float | None = None
    available: int = 0


def _group_devices(nodes: Sequence[SlurmNode]) -> list[_TypeGroup]:
    groups: dict[str, _TypeGroup] = {}
    for node in nodes:
        for device in node.devices:
            group = groups.setdefault(device.type, _TypeGroup(type=device.type, vendor=device.vendor.name))
            group.available += node.hosts
            memory = float(device.memory_mib) * MIB
            group.memory_bytes = memory if group.memory_bytes is None else min(group.memory_bytes, memory)
        for left_out in node.left_out:
            name = left_out.type or left_out.model
            groups.setdefault(name, _TypeGroup(type=name, vendor=left_out.vendor))
    return list(groups.values())


Estimate = Callable[[int], "Breakdown | None"]


def _option(group: _TypeGroup, estimate: Estimate, limit: int) -> DeviceOption:
    option = partial(DeviceOption, group.type, group.vendor, group.memory_bytes, group.available)
    if group.memory_bytes is None:  # every device of the type is left out: none to count on
        return option(None, None, ReasonCode.UNHEALTHY)
    for count in range(1, max(limit, group.available) + 1):
        breakdown = estimate(count)
        if breakdown is not None and breakdown.total <= group.memory_bytes:
            return option(
                count, breakdown.total, ReasonCode.NOT_ENOUGH_DEVICES if count > group.available else None
            )
    return option(None, None, ReasonCode.INSUFFICIENT_MEMORY)


def device_options(nodes: Sequence[SlurmNode], estimate: Estimate, limit: int = 1024) -> list[DeviceOption]:
    """For each device type: its smallest memory, its healthy devices, and the fewest devices `n` up to
    ``max(limit, available)`` whose `estimate(n)` fits (None: not a valid layout); fitting types
    first, fewest devices first."""
    options = [_option(g, estimate, limit) for g in _group_devices(nodes)]
    return sorted(options, key=lambda o: (not o.fits, o.needed or math.inf, -(o.memory_bytes or 0.0), o.type))
