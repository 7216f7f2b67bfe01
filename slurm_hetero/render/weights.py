"""Node `Weight=` from the devices' own facts. Pure.

Slurm gives a job the lowest-weight nodes that satisfy it, so for `binpack` a node's weight is
the hourly cost of its dearest device in US cents. It never depends on other nodes, so adding a
node changes no other line.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_hetero.core.devicespec import Catalog, DeviceSpec
from slurm_hetero.core.model import SlurmDevice
from slurm_hetero.engine.compare import headline_tflops


@dataclass(frozen=True)
class CostModel:
    """USD per device-hour of one unit of capability, the median over the catalog's priced entries."""

    per_tflops: float
    per_gib: float

    @classmethod
    def from_catalog(cls, catalog: Catalog) -> CostModel:
        priced = [s for s in catalog.specs if s.price_per_hour_usd]
        per_tflops = [s.price_per_hour_usd / t for s in priced if (t := headline_tflops(s))]  # type: ignore[operator]
        per_gib = [s.price_per_hour_usd / s.memory_gib for s in priced if s.memory_gib]  # type: ignore[operator]
        return cls(
            statistics.median(per_tflops) if per_tflops else 0.005,
            statistics.median(per_gib) if per_gib else 0.03,
        )

    def device_cost(self, spec: DeviceSpec) -> float:
        """USD per hour of one device: its price, else its TFLOPS or memory at the median price."""
        if spec.price_per_hour_usd:
            return spec.price_per_hour_usd
        tflops = headline_tflops(spec)
        return tflops * self.per_tflops if tflops else spec.memory_gib * self.per_gib


def node_weight(devices: Sequence[SlurmDevice], policy: str, costs: CostModel) -> int:
    """1 under spread or without devices, else its dearest device in cents/hour."""
    if policy == "spread" or not devices:
        return 1
    return max(1, round(max(costs.device_cost(d.spec) for d in devices) * 100))
