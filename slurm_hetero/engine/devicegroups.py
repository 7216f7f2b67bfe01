"""The layout solver's device groups from catalog facts: what one device sustains, holds and sends.

Pure: `DeviceSpec`s and numbers in, `DeviceGroup`s out. `device_groups` turns ``[(type, count),
...]`` into one group per type: sustained TFLOPS = bf16 (else fp16) peak x `MFU`, unless a
measured figure is given for the type (what `slurm-hetero calibrate` writes); usable memory =
capacity x `MEMORY_USABLE`; link = the catalog's bidirectional interconnect figure halved (one
way), `PCIE_GBS` when the catalog has none. The model's side (per-layer costs) is
`engine.modelcost`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slurm_hetero.devicespec import Catalog, DeviceSpec
from slurm_hetero.engine.stagecost import DeviceGroup
from slurm_hetero.errors import RequestError

MFU = 0.45  # sustained share of the dense bf16/fp16 peak in transformer training (Megatron: 0.4-0.55)
MEMORY_USABLE = 0.9  # the rest: communication buffers, allocator fragmentation
PCIE_GBS = 25.0  # PCIe 4.0 x16, one way


def device_tflops(spec: DeviceSpec, measured: Mapping[str, float], mfu: float = MFU) -> float:
    """Sustained TFLOPS of one device on this model: measured, else the catalog peak x `mfu`."""
    if spec.type in measured:
        return float(measured[spec.type])
    peak = spec.bf16_tflops if spec.bf16_tflops is not None else spec.fp16_tflops
    if peak is None:
        raise RequestError(
            spec.type,
            f"the catalog has no bf16/fp16 TFLOPS for it; pass --measured FILE "
            f"with a line '{spec.type}: TFLOPS'",
        )
    return peak * mfu


def device_groups(
    devices: Sequence[tuple[str, int]],
    catalog: Catalog,
    measured: Mapping[str, float] | None = None,
    per_node: int = 8,
    mfu: float = MFU,
) -> tuple[DeviceGroup, ...]:
    """One group per device type (counts of repeated types added, first appearance order), on
    nodes of `per_node` devices (the last node takes the rest)."""
    counts: dict[str, int] = {}
    specs: dict[str, DeviceSpec] = {}
    for name, count in devices:
        spec = catalog.by_type(name)
        if spec is None:
            raise RequestError(name, f"unknown device type; known: {', '.join(catalog.types())}")
        specs[spec.type] = spec
        counts[spec.type] = counts.get(spec.type, 0) + count
    rates = {_canonical(catalog, k): float(v) for k, v in (measured or {}).items()}
    return tuple(_group(specs[t], n, rates, per_node, mfu) for t, n in counts.items())


def _canonical(catalog: Catalog, name: str) -> str:
    spec = catalog.by_type(name)
    return spec.type if spec else name


def _group(
    spec: DeviceSpec, count: int, measured: Mapping[str, float], per_node: int, mfu: float
) -> DeviceGroup:
    full, rest = divmod(count, per_node)
    nodes = (per_node,) * full + ((rest,) if rest else ())
    link = spec.interconnect_gbs / 2 if spec.interconnect_gbs else PCIE_GBS
    memory = spec.memory_gib * 2**30 * MEMORY_USABLE
    return DeviceGroup(spec.type, nodes, device_tflops(spec, measured, mfu), memory, link)
