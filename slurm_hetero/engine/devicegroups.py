"""The layout solver's device groups from catalog facts: what one device sustains, holds and sends.

Pure: `DeviceSpec`s and numbers in, `DeviceGroup`s out; one group per type. A type with no speed
(Huawei publishes none per 910B SKU) gets the slowest rated type's of the allocation, so the
solver gives it no more work than that type, and `plan` and `launch` warn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm_hetero.core.devicespec import Catalog, DeviceSpec
from slurm_hetero.core.errors import RequestError
from slurm_hetero.engine.comm import PCIE_GBS
from slurm_hetero.engine.compare import headline_tflops
from slurm_hetero.engine.stagecost import DeviceGroup, LayerCosts, default_gemm_half

NOMINAL_TFLOPS = 100.0  # placeholder when no device of the allocation has a figure (even split)
MFU = 0.45  # sustained share of the dense bf16/fp16 peak in transformer training (Megatron: 0.4-0.55)
MEMORY_USABLE = 0.9  # the rest: communication buffers, allocator fragmentation


def known_tflops(spec: DeviceSpec, measured: Mapping[str, float], mfu: float = MFU) -> float | None:
    """Sustained TFLOPS of one device: measured, else the catalog peak x `mfu`; None when neither."""
    if spec.type in measured:
        return float(measured[spec.type])
    peak = headline_tflops(spec)
    return None if peak is None else peak * mfu


def sustained_tflops(
    specs: Sequence[DeviceSpec], measured: Mapping[str, float], mfu: float = MFU
) -> tuple[list[float], tuple[str, ...]]:
    """Each spec's sustained TFLOPS and the types whose figure is an estimate."""
    known = [known_tflops(s, measured, mfu) for s in specs]
    figures = [k for k in known if k is not None]
    fallback = min(figures) if figures else NOMINAL_TFLOPS
    estimated = tuple(dict.fromkeys(s.type for s, k in zip(specs, known) if k is None))
    return [fallback if k is None else k for k in known], estimated


def estimate_note(
    estimated: Sequence[str], specs: Sequence[DeviceSpec], measured: Mapping[str, float], mfu: float = MFU
) -> str:
    """The warning for estimated speeds (empty when none are)."""
    if not estimated:
        return ""
    rated = [(v, s.type) for s in specs if (v := known_tflops(s, measured, mfu)) is not None]
    basis = (
        f"given the speed of {min(rated)[1]} ({min(rated)[0]:.4g} TFLOPS), the slowest rated type of "
        "the allocation"
        if rated
        else f"every type at one nominal {NOMINAL_TFLOPS:g} TFLOPS (--mfu does not apply): an even split, "
        "and its times are placeholders"
    )
    return (
        f"no TFLOPS for {', '.join(estimated)} (catalog nor --measured): its speed is an estimate, "
        f"{basis}; run `slurm-hetero calibrate` and pass --measured for a real plan"
    )


def _fold(text: str) -> str:
    return text.casefold().replace("-", "_")


def resolve_measured(
    measured: Mapping[str, float],
    catalog: Catalog,
    site_types: Mapping[str, str] | None = None,
    key_name: str = "--measured key",
) -> dict[str, float]:
    """`measured` keyed by catalog type (`site_types` maps site Type= names to catalog types): exact
    names first, then a unique case-insensitive match. Two keys for one type are refused: which one
    counted would depend on order; so is a key naming no type, lest a typo fall back to datasheets."""
    site = dict(site_types or {})
    names: dict[str, str] = {t: t for t in catalog.types()}
    names.update({a: s.type for s in catalog.specs for a in s.aliases})
    names.update(site)
    folded: dict[str, set[str]] = {}
    for name, canonical in names.items():
        folded.setdefault(_fold(name), set()).add(canonical)
    out: dict[str, float] = {}
    keys: dict[str, str] = {}
    for key, value in measured.items():
        match = names.get(key)
        if match is None and len(folded.get(_fold(key), ())) == 1:
            match = next(iter(folded[_fold(key)]))
        if match is None:
            raise RequestError(f"{key_name} {key!r}", _unknown_key(key, folded, site, catalog))
        if match in keys:
            raise RequestError(
                f"{key_name}s {keys[match]!r} and {key!r}", f"both name device type {match}; keep one"
            )
        keys[match] = key
        out[match] = float(value)
    return out


def _unknown_key(key: str, folded: Mapping[str, set[str]], site: Mapping[str, str], catalog: Catalog) -> str:
    if several := sorted(folded.get(_fold(key), ())):
        return f"matches several types when case is ignored ({', '.join(several)}); spell one exactly"
    local = f"types of this allocation: {', '.join(sorted(set(site)))}; " if site else ""
    return f"names no device type; {local}known types: {', '.join(sorted(catalog.types()))}"


def gemm_half(
    spec: DeviceSpec, measured_half: Mapping[str, float], measured: Mapping[str, float] | None = None
) -> float:
    """GEMM elements at half speed: `calibrate`'s figure; 0 for a type measured without one (a
    measured figure is not mixed with a datasheet curve); else the default scaled by the ridge point."""
    if spec.type in measured_half:
        return float(measured_half[spec.type])
    if measured and spec.type in measured:
        return 0.0
    return default_gemm_half(headline_tflops(spec), spec.memory_bandwidth_gbs)


def device_groups(
    devices: Sequence[tuple[str, int]],
    catalog: Catalog,
    measured: Mapping[str, float] | None = None,
    per_node: int = 8,
    mfu: float = MFU,
    measured_half: Mapping[str, float] | None = None,
) -> tuple[DeviceGroup, ...]:
    """One group per device type, in first appearance order, on nodes of `per_node` devices."""
    counts: dict[str, int] = {}
    specs: dict[str, DeviceSpec] = {}
    for name, count in devices:
        spec = catalog.by_type(name)
        if spec is None:
            raise RequestError(name, f"unknown device type; known: {', '.join(catalog.types())}")
        specs[spec.type] = spec
        counts[spec.type] = counts.get(spec.type, 0) + count
    rates = resolve_measured(measured or {}, catalog)
    halves = resolve_measured(measured_half or {}, catalog)
    speeds, _ = sustained_tflops([specs[t] for t in counts], rates, mfu)
    out = []
    for (t, n), tflops in zip(counts.items(), speeds):
        full, rest = divmod(n, per_node)
        nodes = (per_node,) * full + ((rest,) if rest else ())
        half, memory = gemm_half(specs[t], halves, rates), specs[t].memory_gib * 2**30
        out.append(spec_group(specs[t], t, specs[t].vendor, nodes, tflops, half, memory))
    return tuple(out)


def estimated_types(
    devices: Sequence[tuple[str, int]],
    catalog: Catalog,
    measured: Mapping[str, float] | None = None,
    mfu: float = MFU,
) -> tuple[tuple[str, ...], str]:
    """The types `device_groups` of the same arguments estimates the speed of, and the warning."""
    specs = [s for s in (catalog.by_type(n) for n, _ in devices) if s is not None]
    rates = resolve_measured(measured or {}, catalog)
    _, estimated = sustained_tflops(specs, rates, mfu)
    return estimated, estimate_note(estimated, specs, rates, mfu)


SAME_LAYER = 0.05  # a profile's layer FLOPs this close to ours are the same model's (kernels differ)


@dataclass(frozen=True)
class MeasuredShapes:
    """One type's measured shapes: points of (tp, micro_batch, seconds of one layer's forward plus
    backward or None, TFLOPS or None), and the seconds' model (name, seq, hidden, layer GFLOPs)."""

    key: str
    points: tuple[tuple[int, float, float | None, float | None], ...]
    model: tuple[str, int, int, float] | None = None


def shape_speeds(shapes: MeasuredShapes, costs: LayerCosts) -> tuple[tuple[int, float, float], ...]:
    """(tp, micro_batch, TFLOPS per device) of each point on this model; another model's seconds fail."""
    layer = float(costs.flops.mean())
    if shapes.model is not None:
        name, seq, hidden, gflops = shapes.model
        off = abs(gflops * 1e9 - layer) / layer
        if seq * hidden != costs.elements_per_sample or off > SAME_LAYER:
            raise RequestError(
                f"--measured {shapes.key}.model",
                f"measured on {name} (seq {seq} x hidden {hidden} = {seq * hidden}, {gflops:.4g} GFLOP a "
                f"layer); this plan's layers are seq x hidden = {costs.elements_per_sample:.0f}, "
                f"{layer / 1e9:.4g} GFLOP: measure this model's layer or give tflops points",
            )
    return tuple(
        (tp, mb, mb * 3 * layer / (tp * seconds) / 1e12 if seconds is not None else float(tflops or 0))
        for tp, mb, seconds, tflops in shapes.points
    )


def with_shapes(
    groups: Sequence[DeviceGroup],
    shapes: Mapping[str, MeasuredShapes],
    catalog: Catalog,
    costs: LayerCosts,
    site_types: Mapping[str, str] | None = None,
) -> tuple[DeviceGroup, ...]:
    """`groups` with the measured shapes of their types (keys resolved by `resolve_measured`)."""
    index = resolve_measured({k: float(i) for i, k in enumerate(shapes)}, catalog, site_types)
    keyed = {t: shapes[list(shapes)[int(i)]] for t, i in index.items()}
    site = dict(site_types or {})
    return tuple(
        dataclasses.replace(g, speeds=shape_speeds(keyed[t], costs))
        if (t := site.get(g.type, g.type)) in keyed
        else g
        for g in groups
    )


def with_network(
    groups: Sequence[DeviceGroup],
    network: Mapping[str, float],
    catalog: Catalog,
    site_types: Mapping[str, str] | None = None,
) -> tuple[DeviceGroup, ...]:
    """`groups` with the measured network figures of their types (keys resolved by `resolve_measured`)."""
    keyed = resolve_measured(network, catalog, site_types)
    site = dict(site_types or {})
    return tuple(
        dataclasses.replace(g, nic_gbs=keyed[t]) if (t := site.get(g.type, g.type)) in keyed else g
        for g in groups
    )


def spec_group(
    spec: DeviceSpec,
    gres_type: str,
    vendor: str,
    nodes: tuple[int, ...],
    tflops: float,
    half: float,
    memory_bytes: float,
    nic_gbs: float = 0.0,
) -> DeviceGroup:
    """The solver's group of `gres_type` devices; `memory_bytes` per device before the usable share."""
    link = spec.interconnect_gbs / 2 if spec.interconnect_gbs else PCIE_GBS  # the catalog's: both ways
    return DeviceGroup(
        gres_type,
        nodes,
        tflops,
        memory_bytes * MEMORY_USABLE,
        link,
        half,
        nic_gbs,
        price_per_hour=spec.price_per_hour_usd or 0.0,
        vendor=vendor,
        memory_gbs=spec.memory_bandwidth_gbs or 0.0,
    )
