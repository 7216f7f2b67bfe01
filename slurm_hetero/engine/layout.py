"""The uneven layout solver for training on a heterogeneous allocation, and rank assignment.

Pure numpy, deterministic: `solve(LayoutSpec) -> Layout`, then `assign_ranks(Layout)`. The
families it searches, its bounds and what its figures promise: docs/plan.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from slurm_hetero.core.errors import RequestError
from slurm_hetero.engine.limits import MAX_DEVICES as MAX_DEVICES
from slurm_hetero.engine.limits import check_batch, check_prices, check_size
from slurm_hetero.engine.partition import Fit, even_bounds, search, shape_class
from slurm_hetero.engine.schedule import LayoutKind, Schedule, StepModel, simulate_1f1b
from slurm_hetero.engine.shapes import (
    MAX_CANDIDATES,
    STAGED_MAX_WORLD,
    candidate_shapes,
    shape_search,
    staged_applies,
    staged_degrees,
    staged_micro_batch,
)
from slurm_hetero.engine.shapes import SEARCHED_MICRO_BATCHES as SEARCHED_MICRO_BATCHES
from slurm_hetero.engine.shapes import kinds_for_micro_batch as kinds_for_micro_batch
from slurm_hetero.engine.stagecost import TFLOPS, Checkpointing, DeviceGroup, LayerCosts, peak_rate

FINALISTS = 4
GIB = 2**30
OBJECTIVES = ("time", "cost")
DEFAULT_TP_SIZES = (1, 2, 4, 8)  # what `plan` searches (launch: --tp-sizes, default 1)


NETWORK_GBS = 25.0  # a device's share of its node's network without a better figure (one 200 Gb/s NIC)


@dataclass(frozen=True)
class LayoutSpec:
    """What to lay out: device groups in Slurm rank order, the model's per-layer costs and the knobs."""

    groups: tuple[DeviceGroup, ...]
    costs: LayerCosts
    global_batch: int
    micro_batch_size: int = 1
    micro_batches: int | None = None  # sizes micro-batches so an average replica runs this many
    network_gbs: float = NETWORK_GBS  # each device's GB/s between nodes, one way
    tp_sizes: tuple[int, ...] = DEFAULT_TP_SIZES
    kinds: tuple[LayoutKind, ...] = (LayoutKind.PIPELINE, LayoutKind.DATA, LayoutKind.STAGED)
    label: str = ""
    micro_batch_sizes: tuple[int, ...] = ()  # searched when given (else `micro_batch_size` only)
    pair_gbs: Mapping[tuple[int, int], float] = field(default_factory=dict)  # between groups (i < j)
    objective: str = "time"  # or "cost": step seconds x the price of the devices used
    leave_out: bool = False  # may a whole device type stay idle when the step is better without it
    mixed_tp: bool = True  # data family: may types differ in tensor-parallel degree
    max_candidates: int = MAX_CANDIDATES  # shapes searched (`engine.shapes`: the search's bound)

    def __post_init__(self) -> None:
        if not self.groups or self.global_batch < 1 or self.micro_batch_size < 1:
            raise ValueError("a layout needs device groups, global_batch >= 1 and micro_batch_size >= 1")
        if (self.micro_batches is not None and self.micro_batches < 1) or self.network_gbs <= 0:
            raise ValueError("micro_batches must be >= 1 and network_gbs positive")
        if any(b < 1 for b in self.micro_batch_sizes) or self.objective not in OBJECTIVES:
            raise ValueError(f"micro_batch_sizes must be >= 1 and objective one of {', '.join(OBJECTIVES)}")


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage: its layers `[layer_start, layer_end)`, recomputed layers, and seconds per
    micro-batch (`p2p_s`: to the next stage, each way; `allreduce_s`: per step)."""

    index: int
    group: int
    type: str
    tp: int
    layer_start: int
    layer_end: int
    recompute: int
    fwd_s: float
    bwd_s: float
    p2p_s: float
    allreduce_s: float
    memory_bytes: float
    capacity_bytes: float
    dp: int = 1  # data-parallel degree inside the stage (the staged family), else 1


@dataclass(frozen=True)
class PipelinePlan:
    """A pipeline shape and its replicas: `samples[i]` per step for global replica `first_replica + i`."""

    stages: tuple[StagePlan, ...]
    samples: tuple[int, ...]
    micro_batch: int
    first_replica: int

    def micro_batches(self, replica: int) -> int:
        return math.ceil(self.samples[replica] / self.micro_batch)


@dataclass(frozen=True)
class Layout:
    """The solver's answer, with its predicted, even-split and bound step seconds."""

    kind: LayoutKind
    groups: tuple[DeviceGroup, ...]
    pipelines: tuple[PipelinePlan, ...]
    global_batch: int
    predicted_step_s: float
    even_step_s: float | None
    bound_step_s: float
    left_out: tuple[str, ...] = ()  # device types left idle (`LayoutSpec.leave_out`)
    cost_per_step_usd: float | None = None  # step x the hourly price of the devices used
    notes: tuple[str, ...] = ()  # what the user should know: the search bounded, prices missing

    @property
    def efficiency(self) -> float:
        return self.bound_step_s / self.predicted_step_s

    @property
    def world_size(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def replicas(self) -> int:
        return sum(len(p.samples) for p in self.pipelines)


@dataclass(frozen=True)
class RankAssignment:
    """What one global rank does (tensor-parallel group: same replica and stage; data-parallel: same
    stage and tp_rank; pipeline: same replica and tp_rank); gradients weigh `grad_weight`."""

    rank: int
    local_rank: int
    node: int
    type: str
    group: int
    replica: int
    stage: int
    tp_rank: int
    tp_size: int
    pp_size: int
    dp_size: int
    layer_start: int
    layer_end: int
    micro_batch: int
    micro_batches: int
    samples: int
    grad_weight: float
    recompute: int


# -- the answer ----------------------------------------------------------------------------------


def check_limits(spec: LayoutSpec) -> None:
    """A RequestError when `spec` is beyond what `solve` takes (`engine.limits`), before any search."""
    check_size(spec.groups)
    check_batch(spec.global_batch)
    check_prices(spec.objective, spec.groups)


def solve(spec: LayoutSpec) -> Layout:
    """The best layout by `spec.objective`; with `spec.leave_out`, allocations with one type idle too."""
    check_limits(spec)
    if not spec.leave_out or len(spec.groups) < 2:
        return _solve_all(spec)
    best: Layout | None
    try:
        best = _solve_all(spec)
        full_notes = best.notes
    except RequestError as no_fit:  # a subset may fit; the note says why a type is idle
        best, failure = None, no_fit
        full_notes = (f"{NO_FULL_LAYOUT}: {no_fit.reason}",)
    share, bounded = max(64, spec.max_candidates // (8 * len(spec.groups))), False
    for k in range(len(spec.groups)):
        pairs = {(a - (a > k), b - (b > k)): v for (a, b), v in spec.pair_gbs.items() if k not in (a, b)}
        subset = dataclasses.replace(
            spec, groups=spec.groups[:k] + spec.groups[k + 1 :], pair_gbs=pairs, max_candidates=share
        )
        try:
            trial = _solve_all(subset)
        except RequestError:
            continue
        bounded |= bool(trial.notes)
        if best is None or _objective(spec, trial) < _objective(spec, best) * (1 - 1e-9):
            best = dataclasses.replace(
                trial, bound_step_s=bound_step_s(spec), left_out=(spec.groups[k].type,)
            )
    if best is None:
        raise failure
    if bounded:
        full_notes += ("search bounded: each allocation with a type left out searched within its share",)
    return dataclasses.replace(best, notes=full_notes)


NO_FULL_LAYOUT = "no layout uses every device"


def _objective(spec: LayoutSpec, layout: Layout) -> float:
    if spec.objective == "cost" and layout.cost_per_step_usd is not None:
        return layout.cost_per_step_usd
    return layout.predicted_step_s


def _solve_all(spec: LayoutSpec) -> Layout:
    """The best simulated layout among the best estimated candidates, each finalist's even split too."""
    shapes, notes = shape_search(spec)
    fits, stopped = search(spec, shapes)
    fits = _finalists(fits)
    if not fits:
        raise _no_fit(spec)
    timed, trials = [], max(16, StepModel.REFINE_SIMULATIONS * spec.max_candidates // MAX_CANDIDATES)
    for _, i, bounds, model in fits:
        samples = model.refine_split(bounds, model.split(model.line_stats(bounds) or []), trials)
        timed.append((model.simulate(bounds, samples), i, bounds, samples, model))
        if (even := _even_split(spec, model)) is not None:
            timed.append((model.simulate(*even), i, *even, model))
    predicted, _, bounds, samples, model = min(timed, key=lambda t: (t[0], t[1]))
    layout = layout_from_split(spec, model, bounds, samples, predicted)
    stop = "search bounded: splitting stopped at its bound, the most promising shapes first"
    return dataclasses.replace(layout, notes=(*notes, *([stop] if stopped else [])))


def _finalists(fits: list[Fit]) -> list[Fit]:
    """The best `FINALISTS` fits of each class (`partition.shape_class`; why: docs/plan.md)."""
    by_class: dict[tuple[str, int], list[Fit]] = {}
    for fit in sorted(fits, key=lambda f: (f[0], f[1])):
        by_class.setdefault(shape_class(fit[3].shape), []).append(fit)
    return [f for group in by_class.values() for f in group[:FINALISTS]]


def bound_step_s(spec: LayoutSpec) -> float:
    """A step no layout beats: its work over every device's speed at the whole global batch's GEMM size."""
    elements = spec.global_batch * spec.costs.elements_per_sample
    rate = sum(g.count * peak_rate(g, elements) * TFLOPS for g in spec.groups)
    return spec.global_batch * spec.costs.step_flops_per_sample / rate


def _even_split(spec: LayoutSpec, model: StepModel) -> tuple[list[int], tuple[int, ...]] | None:
    """Equal layers per stage and samples per replica of `model`'s shape (None: too few layers)."""
    if model.shape.stages > spec.costs.layers:
        return None
    replicas = sum(model.shape.replicas)
    q, r = divmod(spec.global_batch, replicas)
    return even_bounds(spec.costs.layers, model.shape.stages), tuple(q + (j < r) for j in range(replicas))


def _even_step_s(spec: LayoutSpec, model: StepModel) -> float | None:
    even = _even_split(spec, model)
    step = math.inf if even is None else model.simulate(*even)
    return None if math.isinf(step) else step


def _stage_plans(spec: LayoutSpec, model: StepModel, bounds: list[int]) -> list[tuple[StagePlan, ...]]:
    stats, allreduce = model.line_stats(bounds) or [], model.allreduce(bounds)
    out = []
    for line, s in zip(model.shape.lines, stats):
        plans = []
        for k, (g, t) in enumerate(line):
            times = (float(s.fwd[k]), float(s.bwd[k]), float(s.p2p[k]), float(allreduce[k]))
            memory = (float(s.memory[k]), spec.groups[g].memory_bytes)
            layers = (bounds[k], bounds[k + 1], int(s.recompute[k]))
            plans.append(StagePlan(k, g, spec.groups[g].type, t, *layers, *times, *memory, model.shape.dp(k)))
        out.append(tuple(plans))
    return out


def layout_from_split(
    spec: LayoutSpec, model: StepModel, bounds: list[int], samples: tuple[int, ...], step: float
) -> Layout:
    """The `Layout` of `model`'s shape with layer split `bounds`, `samples` per replica and `step` seconds."""
    pipelines, first = [], 0
    for stages, r in zip(_stage_plans(spec, model, bounds), model.shape.replicas):
        pipelines.append(PipelinePlan(stages, samples[first : first + r], model.shape.micro_batch, first))
        first += r
    kind, even = LayoutKind(model.shape.kind), _even_step_s(spec, model)
    priced = not any(g.price_per_hour <= 0 for g in spec.groups)
    cost = step / 3600.0 * sum(g.count * g.price_per_hour for g in spec.groups) if priced else None
    return Layout(
        kind, spec.groups, tuple(pipelines), spec.global_batch, step, even, bound_step_s(spec), (), cost
    )


def _no_fit(spec: LayoutSpec) -> RequestError:
    c, groups = spec.costs, spec.groups
    what = f"{spec.label or f'{c.layers}-layer model'} on " + ",".join(f"{g.type}:{g.count}" for g in groups)
    if not candidate_shapes(spec):
        return RequestError(what, _no_shape_reason(spec))
    devices, have = sum(g.count for g in groups), sum(g.count * g.memory_bytes for g in groups)
    least = c.model_state_bytes(devices)
    if least > have:
        need = f"weights, gradients and optimizer state need at least {least / GIB:,.0f} GiB"
        return RequestError(what, f"{need} but the {devices} devices have {have / GIB:,.0f} GiB; add devices")
    big = max(groups, key=lambda g: g.memory_bytes)
    largest = f"largest device: {big.memory_bytes / GIB:.0f} GiB on {big.type}"
    if c.overhead_bytes >= big.memory_bytes:  # more devices cannot help
        overhead = f"{c.overhead_bytes / GIB:,.1f} GiB of overhead a device fills every device ({largest})"
        return RequestError(what, f"{overhead}; give a smaller --overhead-gib")
    if c.checkpointing == Checkpointing.NEVER:
        how, fix = "without recomputing whole layers", "add devices or allow recomputation (auto, full)"
    else:
        how, fix = "even with recomputation", "add devices"
    pipeline = dataclasses.replace(spec, kinds=(LayoutKind.PIPELINE,))
    if LayoutKind.PIPELINE in spec.kinds and not candidate_shapes(pipeline):
        fix += f". Pipeline layouts were not tried: {_no_shape_reason(pipeline)}"
        fix += ", or --leave-out to plan without one type" if len(groups) > 1 and not spec.leave_out else ""
    return RequestError(what, f"no stage split fits memory {how} ({largest}); {fix}")


def _no_shape_reason(spec: LayoutSpec) -> str:
    """Why no candidate shape uses every device, for the families asked for."""
    kinds, world = set(spec.kinds), sum(g.count for g in spec.groups)
    if kinds == {LayoutKind.STAGED} and not staged_applies(spec):
        if len(spec.groups) < 2:
            return "the staged family needs two device types or more; use --kind pipeline or data"
        return (
            f"the staged family is searched on at most {STAGED_MAX_WORLD} devices (these are {world}); "
            "use --kind pipeline or data, or leave --kind out"
        )
    fixed = staged_micro_batch(spec)
    if kinds == {LayoutKind.STAGED} and fixed is not None:
        least = min(
            (s.micro_batch for s in candidate_shapes(dataclasses.replace(spec, micro_batches=None))),
            default=2,
        )
        return (
            f"--micro-batches {spec.micro_batches} on global batch {spec.global_batch} makes the staged "
            f"pipeline's micro-batch {fixed} sample{'s' if fixed > 1 else ''}, fewer than the "
            f"{least} data-parallel devices of the widest stage of every staged shape (each needs a "
            f"sample); give --micro-batches {max(1, spec.global_batch // least)} or fewer, or another --kind"
        )
    if kinds == {LayoutKind.DATA} and len(spec.groups) < 2:
        return (
            "the data family needs two device types or more (one type's data parallelism is the "
            "pipeline family's); use --kind pipeline or leave --kind out"
        )
    if spec.costs.layers < len(spec.groups):
        return f"{len(spec.groups)} device types need at least as many layers ({spec.costs.layers})"
    split = [
        f"{g.type} has {'/'.join(map(str, sorted(set(g.per_node))))} per node"
        for g in spec.groups
        if not any(all(c % t == 0 for c in g.per_node) for t in spec.tp_sizes)
    ]
    if split:
        tps = ",".join(map(str, spec.tp_sizes))
        return f"tensor parallelism {tps} stays within a node and {'; '.join(split)}; use a smaller tp size"
    if kinds == {LayoutKind.STAGED} and len(degrees := staged_degrees(spec)) == 1:
        return (
            f"the staged family can give every type here only data-parallel degree {degrees.pop()}, "
            "which is the pipeline family's shape; use --kind pipeline or leave --kind out"
        )
    family = "pipeline" if kinds == {LayoutKind.PIPELINE} else "pipeline or data-parallel"
    return f"no {family} shape uses every device; use counts with a common divisor"


# -- ranks ---------------------------------------------------------------------------------------


def assign_ranks(layout: Layout) -> tuple[RankAssignment, ...]:
    """Every global rank's assignment, ranks in Slurm's order (group by group, node by node)."""
    node_first = np.concatenate(([0], np.cumsum([c for g in layout.groups for c in g.per_node])))
    group_first = np.concatenate(([0], np.cumsum([g.count for g in layout.groups])))
    out: list[RankAssignment] = []
    for gi in range(len(layout.groups)):
        plan = next(p for p in layout.pipelines if any(s.group == gi for s in p.stages))
        out += _group_ranks(layout, gi, plan, int(group_first[gi]), node_first)
    return tuple(out)


def _group_ranks(
    layout: Layout, gi: int, plan: PipelinePlan, first: int, node_first: npt.NDArray[np.int64]
) -> list[RankAssignment]:
    """Group `gi`'s ranks: replica by replica, stage by stage, each `dp x tp` ranks (dp-major; a staged
    stage's data-parallel ranks share the micro-batch and samples evenly)."""
    roles = [
        (replica, s, j, tp_rank)
        for replica in range(len(plan.samples))
        for s in plan.stages
        if s.group == gi
        for j in range(s.dp)
        for tp_rank in range(s.tp)
    ]
    ranks = first + np.arange(len(roles))
    nodes = np.searchsorted(node_first, ranks, side="right") - 1
    out = []
    for rank, node, (replica, s, j, tp_rank) in zip(ranks.tolist(), nodes.tolist(), roles):
        q, r = divmod(plan.samples[replica], s.dp)
        n = q + (j < r)
        out.append(
            RankAssignment(
                rank, rank - int(node_first[node]), node, s.type, gi, plan.first_replica + replica + j,
                s.index, tp_rank, s.tp, len(plan.stages), layout.replicas * s.dp, s.layer_start, s.layer_end,
                math.ceil(plan.micro_batch / s.dp), plan.micro_batches(replica), n, n / layout.global_batch,
                s.recompute,
            )
        )  # fmt: skip
    return out


def step_schedules(layout: Layout) -> list[Schedule]:
    """One simulated step per pipeline shape, for its busiest replica (what the Gantt chart draws)."""
    out = []
    for plan in layout.pipelines:
        fwd, bwd, p2p = (np.array([getattr(s, f) for s in plan.stages]) for f in ("fwd_s", "bwd_s", "p2p_s"))
        busiest = max(range(len(plan.samples)), key=lambda j: (plan.samples[j], -j))
        out.append(simulate_1f1b(fwd, bwd, p2p, plan.micro_batches(busiest)))
    return out
