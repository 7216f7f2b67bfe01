"""The layer split of a candidate shape, and the search over shapes that finds the best splits.

Pure, deterministic: the bounds that let the search skip shapes, the min-max split (bisection over
a feasibility test), `polish`, and `search`, which visits shapes by lower bound until none can win.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slurm_hetero.engine.schedule import (
    LayoutKind,
    Shape,
    StepModel,
    is_short,
    network_between,
    stage_periods,
)
from slurm_hetero.engine.shapes import MAX_CANDIDATES
from slurm_hetero.engine.stagecost import GB, TFLOPS, device_rate, ring_allreduce_s

if TYPE_CHECKING:
    from slurm_hetero.engine.layout import LayoutSpec

Rates = dict[tuple[int, int, float], float]
# The search's bounds (MAX_SPLIT_WORK and MAX_SCORES x the spec's share of `shapes.MAX_CANDIDATES`;
# LARGE_SEARCH counts devices x layers): docs/plan.md, "The search is bounded".
LARGE_SEARCH = 32_768
MAX_SPLITS = 48
MAX_SPLIT_WORK = 1_000_000  # above what the benchmark mixes and exhaustively checked instances need
MAX_SCORES = 2_500  # above what the benchmark mixes need
SCORE_LINES = 8
CLASS_SHARE = 2


class Budget:
    """Scores the search may still spend (`MAX_SCORES`), also charged to `whole` when given."""

    def __init__(self, left: float, whole: Budget | None = None) -> None:
        self.left, self.whole = left, whole

    def take(self, moves: Iterator[list[int]], model: StepModel) -> Iterator[list[int]]:
        weight = max(1.0, len(model.shape.lines) / SCORE_LINES)
        for trial in moves:
            seen = model.simulations
            if self.spent:
                return
            yield trial
            self.charge(max(1, model.simulations - seen) * weight)

    def charge(self, amount: float) -> None:
        self.left -= amount
        if self.whole is not None:
            self.whole.charge(amount)

    @property
    def spent(self) -> bool:
        return self.left <= 0 or (self.whole is not None and self.whole.spent)


# -- bounds that let the search skip shapes -------------------------------------------------------


def _stage_rate(spec: LayoutSpec, group: int, tp: int, b: float) -> float:
    """FLOP/s of a stage at micro-batch `b`, its tensor-parallel all-reduces at their least share."""
    c, g = spec.costs, spec.groups[group]
    layer_share = float(c.flops.sum()) * 3 / c.step_flops_per_sample
    rate, measured = device_rate(g, tp, b, c.elements_per_sample)
    comm = 0.0 if measured else 4 * ring_allreduce_s(b * c.boundary_bytes, tp, g.link_gbs) / b
    per_flop = comm / (3 * float(c.flops.max()))  # per sample
    return 1.0 / (1.0 / (tp * rate * TFLOPS) + per_flop * layer_share)


def _first_true(n: int, test: Callable[[int], bool]) -> int:
    """The first j in range(n) where the monotone `test` holds (n if none): Python 3.9's bisect has no key."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if test(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


Line = tuple[tuple[int, int], ...]
Fit = tuple[float, int, list[int], StepModel]  # score, position in the shapes, split, model
LineFacts = dict[tuple[Line, tuple[int, ...]], tuple[list[tuple[int, int, int, int]], float]]


@dataclass
class _Memo:
    """What the search's bounds reuse across shapes: stage rates, and each line's runs and transfers."""

    spec: LayoutSpec
    rates: Rates = field(default_factory=dict)
    lines: LineFacts = field(default_factory=dict)

    def rate(self, g: int, t: int, b: float) -> float:
        if (g, t, b) not in self.rates:
            self.rates[g, t, b] = _stage_rate(self.spec, g, t, b)
        return self.rates[g, t, b]

    def facts(self, shape: Shape) -> tuple[list[tuple[int, int, int, int]], float]:
        key = (shape.lines[0], shape.stage_dp)
        found = self.lines.get(key)
        if found is None:
            runs = [(g, t, sum(1 for _ in run)) for (g, t), run in itertools.groupby(shape.lines[0])]
            starts = itertools.accumulate((n for _, _, n in runs), initial=0)
            with_dp = [(g, t, n, shape.dp(k)) for (g, t, n), k in zip(runs, starts)]
            found = self.lines[key] = (with_dp, _p2p_total(self.spec, with_dp))
        return found

    def run_rates(self, shape: Shape) -> list[tuple[float, int]]:
        """(FLOP/s of one stage, stages) of each run of a one-line shape, fastest first."""
        runs = [(d * self.rate(g, t, shape.micro_batch / d), n) for g, t, n, d in self.facts(shape)[0]]
        return sorted(runs, reverse=True)


def _p2p_total(spec: LayoutSpec, runs: list[tuple[int, int, int, int]]) -> float:
    """Sum over a line's stage boundaries of 1 / (sending ranks x GB/s): `line_p2p`'s least, per byte."""
    total, groups = 0.0, spec.groups

    def net(a: int, b: int) -> float:
        return network_between(groups, spec.pair_gbs, spec.network_gbs, a, b)

    for g, t, n, w in runs:
        inside = t * w * n <= groups[g].node_size  # may share a node: the faster of the two
        total += (n - 1) / (w * (max(groups[g].link_gbs, net(g, g)) if inside else net(g, g)))
    total += sum(1.0 / (min(a[3], b[3]) * net(a[0], b[0])) for a, b in zip(runs, runs[1:]))
    return total


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
    """Least `(m - 1) * T + sum of stage times` over bottlenecks `T >= least`, the `work` going to the
    fastest stages (`runs`) first; piecewise linear in T, so only its breakpoints are checked."""
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


def _lower_bound(spec: LayoutSpec, shape: Shape, memo: _Memo) -> float:
    """(Nearly) no split of `shape` estimates below this: every stage at full rate, plus the transfers."""
    work, b = spec.costs.step_flops_per_sample * shape.micro_batch, shape.micro_batch
    if shape.kind in (LayoutKind.PIPELINE, LayoutKind.STAGED):
        sent = memo.facts(shape)[1] * b * spec.costs.boundary_bytes / GB
        least = sent / max(1, shape.stages - 1)  # a stage beside the slowest boundary receives it
        fill = _fill_bound(memo.run_rates(shape), _line_micro_batches(spec, shape), work, least)
        return fill + 2 * sent
    speed = [
        r * memo.rate(line[0][0], line[0][1], b) * shape.stages / work
        for r, line in zip(shape.replicas, shape.lines)
    ]
    lo, hi = 0.0, (spec.global_batch / b + sum(shape.replicas) * shape.stages) / min(speed)
    terms = [(c, r * (shape.stages - 1)) for c, r in zip(speed, shape.replicas)]
    need = spec.global_batch / b
    while hi - lo > 1e-9 * hi:  # least x with sum_g r_g * max(0, x * c_g - (p - 1)) >= B / b
        mid = (lo + hi) / 2
        reach = sum(max(0.0, mid * c - fill) for c, fill in terms)
        lo, hi = (lo, mid) if reach >= need else (mid, hi)
    return hi


def _floor(spec: LayoutSpec, model: StepModel, bounds: list[int], memo: _Memo) -> float:
    """`_lower_bound` of a one-line shape, tightened by its balanced split's bottleneck (the least)."""
    stats, shape = model.line_stats(bounds), model.shape
    if len(shape.lines) > 1 or not stats:
        return 0.0
    least = float(stage_periods(stats[0].fwd, stats[0].bwd, stats[0].p2p).max()) * (1 - 1e-4)
    work = spec.costs.step_flops_per_sample * shape.micro_batch
    fill = _fill_bound(memo.run_rates(shape), _line_micro_batches(spec, shape), work, least)
    return fill + 2 * float(stats[0].p2p.sum())


def _holds_state(spec: LayoutSpec, shape: Shape) -> bool:
    """Whether every replica's devices together can hold the model state."""
    state = spec.costs.model_state_bytes(sum(shape.replicas))
    return all(
        sum(t * shape.dp(k) * spec.groups[g].memory_bytes for k, (g, t) in enumerate(line)) >= state
        for line in shape.lines
    )


def _cap(spec: LayoutSpec, shape: Shape, best: float) -> float:
    """Bottleneck a one-line shape needs to beat `best`: each of its micro-batches passes it."""
    if len(shape.lines) > 1 or is_short(shape, spec.global_batch):
        return math.inf
    return best / _line_micro_batches(spec, shape)


# -- the layer split ------------------------------------------------------------------------------


def _fits_all(model: StepModel, k: int, a: int, e: int, budget: float, theta: list[float]) -> bool:
    """Whether stage `k` of every line fits `[a, e)` within `budget * theta[line]` and memory."""
    if len(theta) == 1:  # one line: most shapes, and the search's hottest call
        return model.models[0][k].fits(a, e, budget * theta[0])
    return all(m[k].fits(a, e, budget * th) for m, th in zip(model.models, theta))


def _reach(model: StepModel, budget: float, theta: list[float]) -> list[tuple[int, int]] | None:
    """Per stage count k, the interval of layers the first k stages can cover within the budget."""
    layers, p = model.costs.layers, model.shape.stages
    reach = [(0, 0)]
    for k in range(p):
        (lo, hi), limit = reach[-1], layers - (p - 1 - k)
        first = next((a for a in range(lo, hi + 1) if _fits_all(model, k, a, a + 1, budget, theta)), None)
        if first is None or first + 1 > limit:
            return None
        last = next(a for a in range(hi, first - 1, -1) if _fits_all(model, k, a, a + 1, budget, theta))
        end = min([m[k].max_end(last, limit, budget * th) for m, th in zip(model.models, theta)])
        reach.append((first + 1, end))
    return reach if reach[-1][1] == layers else None


def _split_within(model: StepModel, budget: float, theta: list[float]) -> list[int] | None:
    """A split whose stages all fit `budget * theta[line]` and memory, or None; the last stages fullest."""
    reach = _reach(model, budget, theta)
    if reach is None:
        return None
    bounds = [model.costs.layers]
    for k in range(model.shape.stages - 1, -1, -1):
        (lo, hi), end = reach[k], bounds[0]
        starts = range(lo, min(hi, end - 1) + 1)

        def fits_at(j: int, k: int = k, end: int = end, starts: range = starts) -> bool:
            return _fits_all(model, k, starts[j], end, budget, theta)

        i = _first_true(len(starts), fits_at)
        if i == len(starts):
            return None
        bounds.insert(0, starts[i])
    return bounds


def balanced_bounds(model: StepModel, cap: float = math.inf) -> list[int] | None:
    """The split with the least bottleneck (seconds on the first line, others scaled by speed), or
    None when none fits memory or has its bottleneck under `cap`."""
    speed = [line[0][1] * model.groups[line[0][0]].tflops for line in model.shape.lines]
    theta = [speed[0] / v for v in speed]
    best = _split_within(model, cap, theta)
    stats = model.line_stats(best) if best else None
    if best is None or stats is None:
        return None
    lo, hi = 0.0, max(float((s.fwd + s.bwd).max()) / th for s, th in zip(stats, theta))
    while hi - lo > 1e-4 * hi:
        mid = (lo + hi) / 2
        trial = _split_within(model, mid, theta)
        lo, hi, best = (lo, mid, trial) if trial else (mid, hi, best)
    return best


def _moves(bounds: list[int], reach: int) -> Iterator[list[int]]:
    """Splits that hand one layer between two stages at most `reach` apart."""
    for i, j in itertools.permutations(range(len(bounds) - 1), 2):
        if abs(i - j) <= reach and bounds[i + 1] - bounds[i] > 1:
            lo, hi, step = (i + 1, j + 1, -1) if i < j else (j + 1, i + 1, 1)
            yield [b + step if lo <= k < hi else b for k, b in enumerate(bounds)]


def polish(
    model: StepModel, bounds: list[int], sweeps: int = 64, budget: Budget | None = None
) -> tuple[list[int], float]:
    """Hand single layers between stages while the step improves, scoring at most what `budget` has left."""
    best, reach = model.score(bounds), len(bounds) if len(bounds) <= 17 else 1
    for _ in range(sweeps):
        goal = best * (1 - 1e-9)
        moves = _moves(bounds, reach)
        for trial in budget.take(moves, model) if budget else moves:  # the first that scores under goal
            if (score := model.score(trial, goal)) < goal:
                bounds, best = trial, score
                break
        else:
            break
    return bounds, best


def even_bounds(layers: int, stages: int) -> list[int]:
    """Equal layers per stage (the first `layers % stages` stages one more)."""
    q, r = divmod(layers, stages)
    return [0, *itertools.accumulate(q + (k < r) for k in range(stages))]


# -- the search ----------------------------------------------------------------------------------


def _split_work(spec: LayoutSpec, shape: Shape) -> int:
    """Rough work of splitting and polishing `shape` (the unit of MAX_SPLIT_WORK)."""
    p = shape.stages
    if not is_short(shape, spec.global_batch):
        return p**3
    return p**3 * 2 * p * math.ceil(spec.global_batch / sum(shape.replicas) / shape.micro_batch)


def shape_class(shape: Shape) -> tuple[str, int]:
    """A shape's family and micro-batch size per device: what `--kind` and `--micro-batch` restrict."""
    per_device = shape.micro_batch // max(shape.stage_dp) if shape.stage_dp else shape.micro_batch
    return str(shape.kind), per_device


def search(spec: LayoutSpec, shapes: Sequence[Shape]) -> tuple[list[Fit], bool]:
    """Fitted shapes, visited by lower bound until none can win in its class (`shape_class`), within the
    bounds above; and whether a bound stopped it."""
    memo = _Memo(spec)
    ranked = sorted((_lower_bound(spec, s, memo), i, s) for i, s in enumerate(shapes))
    fits: list[Fit] = []
    best: dict[tuple[str, int], float] = {}
    stopped, split = False, 0
    large = sum(g.count for g in spec.groups) * spec.costs.layers > LARGE_SEARCH
    share = spec.max_candidates / MAX_CANDIDATES
    part = share if large else share / CLASS_SHARE
    whole = Budget(MAX_SCORES * share) if large else None  # small problems: classes never share
    work: dict[tuple[str, int], int] = {}
    budgets: dict[tuple[str, int], Budget] = {}
    for bound, i, shape in ranked:
        short, key = is_short(shape, spec.global_batch), shape_class(shape)
        least = best.get(key, math.inf)
        if (bound >= least and not short) or not _holds_state(spec, shape):
            continue
        pool = ("", 0) if large else key  # large problems: one pool, as MAX_SPLITS is
        budget = budgets.setdefault(pool, Budget(MAX_SCORES * part, whole))
        spent = work.get(pool, 0) > MAX_SPLIT_WORK * part
        if (spent or budget.spent) and key in best:
            stopped = True
            continue
        split += 1
        if split > MAX_SPLITS and fits and large:
            return fits, True
        work[pool] = work.get(pool, 0) + _split_work(spec, shape)
        model = StepModel(spec.groups, spec.costs, shape, spec.global_batch, spec.network_gbs, spec.pair_gbs)
        start = balanced_bounds(model, _cap(spec, shape, least))
        if start is None or (_floor(spec, model, start, memo) >= least and not short):
            continue
        bounds, score = polish(model, start, budget=budget)
        fits.append((score, i, bounds, model))
        best[key] = min(least, score)
    return fits, stopped or any(b.spent for b in budgets.values())
