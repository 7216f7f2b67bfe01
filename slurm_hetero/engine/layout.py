"""The uneven layout solver for training on a heterogeneous allocation, and rank assignment.

Pure numpy, deterministic, no I/O; per-stage costs and the step-time model are `engine.schedule`.
`solve(LayoutSpec) -> Layout`, then `assign_ranks(Layout) -> tuple[RankAssignment, ...]`.

Two layout families are searched and the shortest predicted step wins:

- ``pipeline``: one pipeline across the device groups (a group is all devices of one type), each
  group a contiguous run of stages with tensor parallel inside nodes, replicated `d` times (`d`
  divides every group's count). Layers are split unevenly, by speed, capped by memory.
- ``data``: each group runs copies of one common pipeline shape (same stages, tensor parallel
  degree and layer split, so gradients line up) and the global batch is split unevenly across
  these heterogeneous replicas by speed; a group short of memory recomputes.

For each candidate shape (data-parallel degree, stages and tensor parallel per group, and stage
order: every permutation of up to five groups, so the first stage's in-flight activations and
embedding and the last stage's head land where memory allows) the least bottleneck is found by
bisection over a feasibility test (the intervals of layers the first k stages can cover, each stage
recomputing the fewest layers that make it fit: exact for contiguous min-max splits), then single
layers are handed between stages while the step improves (closed form; simulated for steps of few
micro-batches). Shapes are visited by a lower bound on their step and skipped once none left can
win; the best few are timed by simulating the 1F1B schedule.

`bound_step_s` is the total work over the summed throughput of all devices; `even_step_s` is the
chosen shape with equal layers per stage and equal samples per replica (None if that cannot fit).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from slurm_hetero.engine.schedule import (
    GB,
    TFLOPS,
    DeviceGroup,
    LayerCosts,
    Schedule,
    Shape,
    StepModel,
    is_short,
    ring_allreduce_s,
    simulate_1f1b,
)
from slurm_hetero.errors import RequestError

__all__ = [
    "DeviceGroup",
    "LayerCosts",
    "Layout",
    "LayoutKind",
    "LayoutSpec",
    "PipelinePlan",
    "RankAssignment",
    "StagePlan",
    "assign_ranks",
    "bound_step_s",
    "candidate_shapes",
    "solve",
    "step_schedules",
]

FINALISTS = 4
GIB = 2**30
Rates = dict[tuple[int, int], float]


class LayoutKind(StrEnum):
    PIPELINE = "pipeline"
    DATA = "data"


@dataclass(frozen=True)
class LayoutSpec:
    """What to lay out: device groups in Slurm rank order, the model's per-layer costs, samples per
    step, and the knobs. `micro_batches`, when set, picks the micro-batch size so that an average
    replica runs that many per step (faster replicas run more); else it is `micro_batch_size`.
    `network_gbs` is each device's bandwidth between nodes (one way); `label` names the model in
    error messages."""

    groups: tuple[DeviceGroup, ...]
    costs: LayerCosts
    global_batch: int
    micro_batch_size: int = 1
    micro_batches: int | None = None
    network_gbs: float = 25.0
    shard_optimizer: bool = True
    tp_sizes: tuple[int, ...] = (1, 2, 4, 8)
    kinds: tuple[LayoutKind, ...] = (LayoutKind.PIPELINE, LayoutKind.DATA)
    label: str = ""

    def __post_init__(self) -> None:
        if not self.groups or self.global_batch < 1 or self.micro_batch_size < 1:
            raise ValueError("a layout needs device groups, global_batch >= 1 and micro_batch_size >= 1")
        if (self.micro_batches is not None and self.micro_batches < 1) or self.network_gbs <= 0:
            raise ValueError("micro_batches must be >= 1 and network_gbs positive")


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage: its devices, layers `[layer_start, layer_end)`, recomputed layers, and
    seconds per micro-batch (`p2p_s`: to the next stage, each way; `allreduce_s`: per step)."""

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
    """What one global rank does: its stage and layers, its replica's share of the batch, and its
    groups (tensor parallel: same replica and stage; data parallel: same stage and tp_rank;
    pipeline: same replica and tp_rank). Gradients are averaged with weight `grad_weight`."""

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


# -- candidate shapes ----------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_options(spec: LayoutSpec, group: int, devices: int) -> list[int]:
    per_node = spec.groups[group].per_node
    return [t for t in spec.tp_sizes if devices % t == 0 and all(c % t == 0 for c in per_node)]


def _micro_batch(spec: LayoutSpec, replicas: int) -> int:
    if spec.micro_batches is None:
        return spec.micro_batch_size
    return max(1, round(spec.global_batch / (replicas * spec.micro_batches)))


def _orders(spec: LayoutSpec) -> list[tuple[int, ...]]:
    k = len(spec.groups)
    if k <= 5:
        return list(itertools.permutations(range(k)))
    by_memory = tuple(sorted(range(k), key=lambda g: (-spec.groups[g].memory_bytes, g)))
    return [tuple(range(k)), by_memory, by_memory[::-1]]


def _pipeline_shapes(spec: LayoutSpec) -> Iterator[Shape]:
    counts, layers, orders = [g.count for g in spec.groups], spec.costs.layers, _orders(spec)
    for d in _divisors(math.gcd(*counts)):
        options = [[(n // d // t, t) for t in _tp_options(spec, i, n // d)] for i, n in enumerate(counts)]
        for combo in itertools.product(*options):
            if sum(s for s, _ in combo) <= layers:
                for order in orders:
                    line = tuple((g, combo[g][1]) for g in order for _ in range(combo[g][0]))
                    yield Shape(LayoutKind.PIPELINE, (line,), (d,), _micro_batch(spec, d))


def _data_shapes(spec: LayoutSpec) -> Iterator[Shape]:
    counts, k = [g.count for g in spec.groups], len(spec.groups)
    common = math.gcd(*counts)
    for t in (t for t in spec.tp_sizes if all(t in _tp_options(spec, g, common) for g in range(k))):
        for p in (p for p in _divisors(common // t) if p <= spec.costs.layers):
            lines = tuple(tuple((g, t) for _ in range(p)) for g in range(k))
            replicas = tuple(n // (p * t) for n in counts)
            yield Shape(LayoutKind.DATA, lines, replicas, _micro_batch(spec, sum(replicas)))


def candidate_shapes(spec: LayoutSpec) -> list[Shape]:
    """Every shape the solver considers, in a fixed order."""
    shapes = list(_pipeline_shapes(spec)) if LayoutKind.PIPELINE in spec.kinds else []
    if LayoutKind.DATA in spec.kinds and len(spec.groups) > 1:
        shapes += _data_shapes(spec)
    return shapes


# -- bounds that let the search skip shapes -------------------------------------------------------


def _stage_rate(spec: LayoutSpec, group: int, tp: int) -> float:
    """FLOP/s of a stage, tensor-parallel all-reduces charged at their least share of the work."""
    c, g = spec.costs, spec.groups[group]
    layer_share = float(c.flops.sum()) * 3 / c.step_flops_per_sample
    per_flop = 4 * ring_allreduce_s(c.boundary_bytes, tp, g.link_gbs) / (3 * float(c.flops.max()))
    return 1.0 / (1.0 / (tp * g.tflops * TFLOPS) + per_flop * layer_share)


def _runs(line: tuple[tuple[int, int], ...]) -> list[tuple[int, int, int]]:
    """A line as runs of equal stages: (group, tp, stages)."""
    return [(g, t, sum(1 for _ in run)) for (g, t), run in itertools.groupby(line)]


def _p2p_sum(spec: LayoutSpec, shape: Shape) -> float:
    """Sum of the transfer times between the stages of a one-line shape (as `line_p2p`)."""
    runs, total = _runs(shape.lines[0]), 0.0
    for g, t, n in runs:
        inside = t * n <= spec.groups[g].node_size
        total += (n - 1) / (t * (spec.groups[g].link_gbs if inside else spec.network_gbs))
    total += sum(1.0 / (min(a[1], b[1]) * spec.network_gbs) for a, b in itertools.pairwise(runs))
    return total * shape.micro_batch * spec.costs.boundary_bytes / GB


def _spread(runs: list[tuple[float, int]], work: float, most: float) -> float:
    """Sum of stage times when each stage (fastest first) does at most `most` seconds of `work`."""
    total, left = 0.0, work
    for rate, count in runs:
        full = min(count, int(left // (most * rate)))
        total, left = total + full * most, left - full * most * rate
        if full < count:
            return total + left / rate
    return total if left <= 1e-9 * work else math.inf


def _fill_bound(runs: list[tuple[float, int]], m: int, work: float, least: float) -> float:
    """Least `(m - 1) * T + sum of stage times` over bottlenecks `T >= least`, the per-micro-batch
    `work` going to the fastest stages first; `runs`: (FLOP/s, stages), fastest first. The sum is
    piecewise linear in T, so only its breakpoints (and `least`) need checking."""
    best = (m - 1) * least + _spread(runs, work, least) if least > 0 else math.inf
    used, rate = 0, 0.0
    for v, count in runs:
        for j in {used + 1, used + count}:
            if (t := work / (rate + (j - used) * v)) >= least:
                best = min(best, (m - 1 + j) * t)
        used, rate = used + count, rate + count * v
    return best


def _line_micro_batches(spec: LayoutSpec, shape: Shape) -> int:
    return math.ceil(math.ceil(spec.global_batch / shape.replicas[0]) / shape.micro_batch)


def _lower_bound(spec: LayoutSpec, shape: Shape, rate: Rates) -> float:
    """(Nearly) no split of `shape` estimates below this: every stage at full rate, the work on
    the fastest stages that balance it best, plus the transfers."""
    work, b = spec.costs.step_flops_per_sample * shape.micro_batch, shape.micro_batch
    if shape.kind == LayoutKind.PIPELINE:
        runs = sorted(((rate[g, t], n) for g, t, n in _runs(shape.lines[0])), reverse=True)
        return _fill_bound(runs, _line_micro_batches(spec, shape), work, 0.0) + 2 * _p2p_sum(spec, shape)
    speed = [
        r * rate[line[0]] * shape.stages / work for r, line in zip(shape.replicas, shape.lines, strict=True)
    ]
    lo, hi = 0.0, (spec.global_batch / b + sum(shape.replicas) * shape.stages) / min(speed)
    while hi - lo > 1e-9 * hi:  # least x with sum_g r_g * max(0, x * c_g - (p - 1)) >= B / b
        mid = (lo + hi) / 2
        reach = sum(
            max(0.0, mid * c - r * (shape.stages - 1)) for c, r in zip(speed, shape.replicas, strict=True)
        )
        lo, hi = (lo, mid) if reach >= spec.global_batch / b else (mid, hi)
    return hi


def _floor(spec: LayoutSpec, model: StepModel, bounds: list[int], rate: Rates) -> float:
    """No split of a one-line shape estimates below this: its bottleneck is at least the balanced
    split's (the least there is), and the fill as in `_lower_bound`."""
    stats, shape = model.line_stats(bounds), model.shape
    if len(shape.lines) > 1 or not stats:
        return 0.0
    runs = sorted(((rate[g, t], n) for g, t, n in _runs(shape.lines[0])), reverse=True)
    least = float((stats[0].fwd + stats[0].bwd).max()) * (1 - 1e-4)
    work = spec.costs.step_flops_per_sample * shape.micro_batch
    return _fill_bound(runs, _line_micro_batches(spec, shape), work, least) + 2 * float(stats[0].p2p.sum())


def _holds_state(spec: LayoutSpec, shape: Shape) -> bool:
    """Whether every replica's devices together can hold the weights, gradients and optimizer state
    (a cheap necessary condition for any split to fit)."""
    c, dp = spec.costs, sum(shape.replicas)
    params = float(c.param_bytes.sum()) + c.first_param_bytes + c.last_param_bytes
    state = params * (1 + c.grad_factor + c.optimizer_factor / (dp if spec.shard_optimizer else 1))
    return all(sum(t * spec.groups[g].memory_bytes for g, t in line) >= state for line in shape.lines)


def _cap(spec: LayoutSpec, shape: Shape, best: float) -> float:
    """Bottleneck a one-line shape needs to beat `best`: each of its micro-batches passes it."""
    if len(shape.lines) > 1 or is_short(shape, spec.global_batch):
        return math.inf
    return best / _line_micro_batches(spec, shape)


# -- the layer split ------------------------------------------------------------------------------


def _fits_all(model: StepModel, k: int, a: int, e: int, budget: float, theta: list[float]) -> bool:
    """Whether stage `k` of every line fits `[a, e)` within `budget * theta[line]` and memory."""
    return all(m[k].fits(a, e, budget * th) for m, th in zip(model.models, theta, strict=True))


def _reach(model: StepModel, budget: float, theta: list[float]) -> list[tuple[int, int]] | None:
    """For each stage count k, the interval of layer counts the first k stages can cover within
    `budget * theta[line]` and memory (stage costs grow with their range, so these are intervals)."""
    layers, p = model.costs.layers, model.shape.stages
    reach = [(0, 0)]
    for k in range(p):
        (lo, hi), limit = reach[-1], layers - (p - 1 - k)
        first = next((a for a in range(lo, hi + 1) if _fits_all(model, k, a, a + 1, budget, theta)), None)
        if first is None or first + 1 > limit:
            return None
        last = next(a for a in range(hi, first - 1, -1) if _fits_all(model, k, a, a + 1, budget, theta))
        end = min(m[k].max_end(last, limit, budget * th) for m, th in zip(model.models, theta, strict=True))
        reach.append((first + 1, end))
    return reach if reach[-1][1] == layers else None


def _split_within(model: StepModel, budget: float, theta: list[float]) -> list[int] | None:
    """A split whose stages all fit `budget * theta[line]` and memory, or None: from the last stage
    back, each stage takes the most layers it can while the stages before can still cover the rest."""
    reach = _reach(model, budget, theta)
    if reach is None:
        return None
    bounds = [model.costs.layers]
    for k in range(model.shape.stages - 1, -1, -1):
        (lo, hi), end = reach[k], bounds[0]
        starts = range(lo, min(hi, end - 1) + 1)

        def fits(a: int, k: int = k, end: int = end) -> bool:
            return _fits_all(model, k, a, end, budget, theta)

        i = bisect.bisect_left(starts, True, key=fits)
        if i == len(starts):
            return None
        bounds.insert(0, starts[i])
    return bounds


def balanced_bounds(model: StepModel, cap: float = math.inf) -> list[int] | None:
    """The split with the least bottleneck stage time (seconds on the first line; other lines
    scaled by their speed), or None when none fits memory or has its bottleneck under `cap`."""
    speed = [line[0][1] * model.groups[line[0][0]].tflops for line in model.shape.lines]
    theta = [speed[0] / v for v in speed]
    best = _split_within(model, cap, theta)
    stats = model.line_stats(best) if best else None
    if best is None or stats is None:
        return None
    lo, hi = 0.0, max(float((s.fwd + s.bwd).max()) / th for s, th in zip(stats, theta, strict=True))
    while hi - lo > 1e-4 * hi:
        mid = (lo + hi) / 2
        trial = _split_within(model, mid, theta)
        lo, hi, best = (lo, mid, trial) if trial else (mid, hi, best)
    return best


def _moves(bounds: list[int], reach: int) -> Iterator[list[int]]:
    """Splits that hand one layer from a stage to another at most `reach` stages away (the
    boundaries between them shift by one)."""
    for i, j in itertools.permutations(range(len(bounds) - 1), 2):
        if abs(i - j) <= reach and bounds[i + 1] - bounds[i] > 1:
            lo, hi, step = (i + 1, j + 1, -1) if i < j else (j + 1, i + 1, 1)
            yield [b + step if lo <= k < hi else b for k, b in enumerate(bounds)]


def polish(model: StepModel, bounds: list[int], sweeps: int = 64) -> tuple[list[int], float]:
    """Hand single layers between stages (any two stages in pipelines of up to 16, neighbours
    beyond) while the step improves (`StepModel.score`)."""
    best, reach = model.score(bounds), len(bounds) if len(bounds) <= 17 else 1
    for _ in range(sweeps):
        trial = next((t for t in _moves(bounds, reach) if model.score(t) < best * (1 - 1e-9)), None)
        if trial is None:
            break
        bounds, best = trial, model.score(trial)
    return bounds, best


# -- the answer ----------------------------------------------------------------------------------


def _fits(spec: LayoutSpec) -> list[tuple[float, int, list[int], StepModel]]:
    """Fitted shapes (score, position, split, model), visited by lower bound until none can win."""
    rate = {(g, t): _stage_rate(spec, g, t) for g in range(len(spec.groups)) for t in spec.tp_sizes}
    ranked = sorted((_lower_bound(spec, s, rate), i, s) for i, s in enumerate(candidate_shapes(spec)))
    fits: list[tuple[float, int, list[int], StepModel]] = []
    best = math.inf
    for bound, i, shape in ranked:
        short = is_short(shape, spec.global_batch)
        if (bound >= best and not short) or not _holds_state(spec, shape):
            continue
        model = StepModel(
            spec.groups, spec.costs, shape, spec.global_batch, spec.network_gbs, spec.shard_optimizer
        )
        start = balanced_bounds(model, _cap(spec, shape, best))
        if start is None or (_floor(spec, model, start, rate) >= best and not short):
            continue
        bounds, score = polish(model, start)
        fits.append((score, i, bounds, model))
        best = min(best, score)
    return fits


def solve(spec: LayoutSpec) -> Layout:
    """The layout with the least simulated step time among the best estimated candidates."""
    fits = sorted(_fits(spec), key=lambda f: (f[0], f[1]))[:FINALISTS]
    if not fits:
        raise _no_fit(spec)
    timed = []
    for _, i, bounds, model in fits:
        samples = model.refine_split(bounds, model.split(model.line_stats(bounds) or []))
        timed.append((model.simulate(bounds, samples), i, bounds, samples, model))
    predicted, _, bounds, samples, model = min(timed, key=lambda t: (t[0], t[1]))
    return _layout(spec, model, bounds, samples, predicted)


def bound_step_s(spec: LayoutSpec) -> float:
    """Total work of a step over the summed throughput of every device."""
    rate = sum(g.count * g.tflops * TFLOPS for g in spec.groups)
    return spec.global_batch * spec.costs.step_flops_per_sample / rate


def even_bounds(layers: int, stages: int) -> list[int]:
    """Equal layers per stage (the first `layers % stages` stages one more)."""
    q, r = divmod(layers, stages)
    return [0, *itertools.accumulate(q + (k < r) for k in range(stages))]


def _even_step_s(spec: LayoutSpec, model: StepModel) -> float | None:
    replicas = sum(model.shape.replicas)
    q, r = divmod(spec.global_batch, replicas)
    step = model.simulate(
        even_bounds(spec.costs.layers, model.shape.stages), [q + (j < r) for j in range(replicas)]
    )
    return None if math.isinf(step) else step


def _stage_plans(spec: LayoutSpec, model: StepModel, bounds: list[int]) -> list[tuple[StagePlan, ...]]:
    stats, allreduce = model.line_stats(bounds) or [], model.allreduce(bounds)
    out = []
    for line, s in zip(model.shape.lines, stats, strict=True):
        plans = []
        for k, (g, t) in enumerate(line):
            times = (float(s.fwd[k]), float(s.bwd[k]), float(s.p2p[k]), float(allreduce[k]))
            memory = (float(s.memory[k]), spec.groups[g].memory_bytes)
            layers = (bounds[k], bounds[k + 1], int(s.recompute[k]))
            plans.append(StagePlan(k, g, spec.groups[g].type, t, *layers, *times, *memory))
        out.append(tuple(plans))
    return out


def _layout(
    spec: LayoutSpec, model: StepModel, bounds: list[int], samples: tuple[int, ...], step: float
) -> Layout:
    pipelines, first = [], 0
    for stages, r in zip(_stage_plans(spec, model, bounds), model.shape.replicas, strict=True):
        pipelines.append(PipelinePlan(stages, samples[first : first + r], model.shape.micro_batch, first))
        first += r
    kind, even = LayoutKind(model.shape.kind), _even_step_s(spec, model)
    return Layout(kind, spec.groups, tuple(pipelines), spec.global_batch, step, even, bound_step_s(spec))


def _no_fit(spec: LayoutSpec) -> RequestError:
    c, groups = spec.costs, spec.groups
    what = f"{spec.label or f'{c.layers}-layer model'} on " + ",".join(f"{g.type}:{g.count}" for g in groups)
    if not candidate_shapes(spec):
        return RequestError(
            what, "no pipeline or data-parallel shape uses every device; use counts with a common divisor"
        )
    params = float(c.param_bytes.sum()) + c.first_param_bytes + c.last_param_bytes
    devices, have = sum(g.count for g in groups), sum(g.count * g.memory_bytes for g in groups)
    least = params * (1 + c.grad_factor + c.optimizer_factor / (devices if spec.shard_optimizer else 1))
    if least > have:
        need = f"weights, gradients and optimizer state need at least {least / GIB:,.0f} GiB"
        return RequestError(what, f"{need} but the {devices} devices have {have / GIB:,.0f} GiB; add devices")
    big = max(groups, key=lambda g: g.memory_bytes)
    largest = f"largest device: {big.memory_bytes / GIB:.0f} GiB on {big.type}"
    return RequestError(what, f"no stage split fits memory even with recomputation ({largest}); add devices")


# -- ranks ---------------------------------------------------------------------------------------


def assign_ranks(layout: Layout) -> tuple[RankAssignment, ...]:
    """Every global rank's assignment. Ranks follow Slurm: group by group, node by node (the
    prefix sum of per-node counts); inside a group, replica by replica, stage by stage, tp rank."""
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
    stages = [s for s in plan.stages if s.group == gi]
    offsets = [0, *itertools.accumulate(s.tp for s in stages)]
    ranks = first + np.arange(layout.groups[gi].count)
    nodes = np.searchsorted(node_first, ranks, side="right") - 1
    out = []
    for i, (rank, node) in enumerate(zip(ranks.tolist(), nodes.tolist(), strict=True)):
        replica, offset = divmod(i, offsets[-1])
        j = bisect.bisect_right(offsets, offset) - 1
        s, n = stages[j], plan.samples[replica]
        out.append(
            RankAssignment(
                rank,
                rank - int(node_first[node]),
                node,
                s.type,
                gi,
                plan.first_replica + replica,
                s.index,
                offset - offsets[j],
                s.tp,
                len(plan.stages),
                layout.replicas,
                s.layer_start,
                s.layer_end,
                plan.micro_batch,
                plan.micro_batches(replica),
                n,
                n / layout.global_batch,
                s.recompute,
            )
        )
    return out


def step_schedules(layout: Layout) -> list[Schedule]:
    """One simulated step per pipeline shape, for its busiest replica (what the Gantt chart draws)."""
    out = []
    for plan in layout.pipelines:
        fwd, bwd, p2p = (np.array([getattr(s, f) for s in plan.stages]) for f in ("fwd_s", "bwd_s", "p2p_s"))
        busiest = max(range(len(plan.samples)), key=lambda j: (plan.samples[j], -j))
        out.append(simulate_1f1b(fwd, bwd, p2p, plan.micro_batches(busiest)))
    return out
