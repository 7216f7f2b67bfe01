"""The layout search's memos and cheap bounds change its speed, never its answer: each memoized or
pruned path against the plain computation it replaces, on small instances (speed itself is measured
by `scripts/bench_plan`, not asserted here)."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import random

import numpy as np
import pytest

from slurm_hetero.engine.layout import LayoutSpec, candidate_shapes
from slurm_hetero.engine.partition import (
    SCORE_LINES,
    Budget,
    _lower_bound,
    _Memo,
    balanced_bounds,
    even_bounds,
    polish,
)
from slurm_hetero.engine.schedule import (
    LayoutKind,
    LineStats,
    Schedule,
    Shape,
    StageModel,
    StepModel,
    _op_order,
    _schedule,
    estimate_1f1b,
    is_short,
    simulate_1f1b,
    split_samples,
)
from tests.unit.test_layout import random_spec


def long_spec(seed: int) -> LayoutSpec:
    """A small random instance with a batch large enough for the closed form (not `is_short`)."""
    rng = random.Random(seed)
    return dataclasses.replace(random_spec(rng), global_batch=rng.choice([512, 2048, 4096]))


def models(spec: LayoutSpec) -> list[StepModel]:
    return [
        StepModel(spec.groups, spec.costs, s, spec.global_batch, spec.network_gbs, spec.pair_gbs)
        for s in candidate_shapes(spec)
    ]


def fresh(model: StepModel) -> StepModel:
    """The same model with empty caches."""
    return StepModel(model.groups, model.costs, model.shape, model.batch, model.network_gbs, model.pair_gbs)


def one_move(bounds: list[int], i: int, j: int) -> list[int]:
    """Stage `i` hands one layer towards stage `j` (the boundaries between them shift by one)."""
    lo, hi, step = (i + 1, j + 1, -1) if i < j else (j + 1, i + 1, 1)
    return [b + step if lo <= k < hi else b for k, b in enumerate(bounds)]


def plain_polish(model: StepModel, bounds: list[int], sweeps: int = 64) -> tuple[list[int], float]:
    """`polish` as it was before its moves were cut by a lower bound: every move fully scored."""
    best, reach = model.score(bounds), len(bounds) if len(bounds) <= 17 else 1
    for _ in range(sweeps):
        moves = (
            one_move(bounds, i, j)
            for i, j in itertools.permutations(range(len(bounds) - 1), 2)
            if abs(i - j) <= reach and bounds[i + 1] - bounds[i] > 1
        )
        trial = next((t for t in moves if model.score(t) < best * (1 - 1e-9)), None)
        if trial is None:
            break
        bounds, best = trial, model.score(trial)
    return bounds, best


def test_polish_with_a_bound_moves_as_the_plain_polish() -> None:
    polished, moved = 0, 0
    for seed in range(12):
        for model in models(long_spec(seed)):
            start = balanced_bounds(model)
            if start is None:
                continue
            bounds, score = polish(model, start)
            assert (bounds, score) == plain_polish(fresh(model), start)
            polished, moved = polished + 1, moved + (bounds != start)
    assert polished >= 50 and moved >= 10, (polished, moved)


@pytest.mark.parametrize("seed", range(12))
def test_a_bounded_estimate_is_exact_below_the_bound_and_a_lower_bound_above(seed: int) -> None:
    spec = long_spec(seed)
    for model in models(spec):
        start = balanced_bounds(model)
        if start is None or is_short(model.shape, model.batch):
            continue
        exact = model.estimate(start)
        for below in (exact * 0.5, exact * 0.999, exact * 1.001, math.inf):
            value = model.estimate(start, below=below)
            assert value == exact or below <= value <= exact


@pytest.mark.parametrize("seed", range(12))
def test_shared_memo_gives_each_shape_the_bound_of_a_fresh_one(seed: int) -> None:
    spec = long_spec(seed)
    shapes = candidate_shapes(spec)

    shared = _Memo(spec)
    fresh = [_lower_bound(spec, s, _Memo(spec)) for s in shapes]
    assert [_lower_bound(spec, s, shared) for s in shapes] == fresh


def test_cached_gradients_match_a_fresh_model_whatever_the_order() -> None:
    spec = long_spec(3)
    for model in models(spec)[:20]:
        layers, p = spec.costs.layers, model.shape.stages
        splits = [[0, *c, layers] for c in itertools.combinations(range(1, layers), p - 1)][:30]
        warm = [(grad_bytes(model, b), model.allreduce(b).tolist()) for b in splits]
        for bounds, seen in zip(reversed(splits), reversed(warm)):
            cold = StepModel(
                model.groups, model.costs, model.shape, model.batch, model.network_gbs, model.pair_gbs
            )
            assert (cold.allreduce(bounds).tolist(), grad_bytes(cold, bounds))[::-1] == seen
            assert seen[0] == plain_grad_bytes(model, bounds).tolist()


def grad_bytes(model: StepModel, bounds: list[int]) -> list[float]:
    """Gradient bytes per rank of each stage position, from the model's per-stage cache."""
    return [model._gradient(k, a, e)[0] for k, (a, e) in enumerate(zip(bounds, bounds[1:]))]


def plain_grad_bytes(model: StepModel, bounds: list[int]) -> np.ndarray:
    """The gradient bytes as they were before their per-stage cache, over the whole split at once."""
    c, pre, edges = model.costs, model.costs.prefix["params"], np.asarray(bounds)
    params = pre[edges[1:]] - pre[edges[:-1]]
    params[0] += c.first_param_bytes
    params[-1] += c.last_param_bytes
    tp = np.array(
        [min(line[k][1] for line in model.shape.lines) for k in range(len(params))], dtype=np.float64
    )
    out: np.ndarray = params * c.grad_factor / tp
    return out


def plain_max_end(stage: StageModel, a: int, limit: int, budget: float) -> int:
    """`StageModel.max_end` as it was before its per-start cache: every end priced afresh."""
    goal = stage._time[a] + budget - 3 * stage.alpha * stage.extra_flops
    e = bisect.bisect_right(stage._time, goal, a + 1, limit + 1) - 1
    if e == a or (not stage.all and stage.base_mem + stage._mem[e] - stage._mem[a] <= stage.capacity):
        return e
    ends = np.arange(a + 1, e + 1)
    r = stage._recompute_all(a, ends)
    rr = np.minimum(r, ends - a)
    f = stage.costs.prefix["flops"]
    extra = stage.alpha * (3 * stage.extra_flops + f[a + rr] - f[a]) + 2 * stage.comm * rr
    bad = np.flatnonzero((r > ends - a) | (stage._time_array[ends] - stage._time[a] + extra > budget))
    return a + (int(bad[0]) if bad.size else int(ends.size))


@pytest.mark.parametrize("seed", range(12))
def test_max_end_with_its_cache_ends_where_the_plain_search_does(seed: int) -> None:
    rng, spec = random.Random(seed), long_spec(seed)
    layers, recomputing = spec.costs.layers, 0
    for model in models(spec)[:10]:
        for stage in (m for line in model.models for m in line):
            full = stage._time[-1] - stage._time[0]
            for _ in range(60):  # starts, limits and budgets in random order: the cache is reused
                a = rng.randrange(layers)
                limit, budget = rng.randint(a + 1, layers), rng.choice([math.inf, rng.uniform(0, 1.2) * full])
                assert stage.max_end(a, limit, budget) == plain_max_end(stage, a, limit, budget)
            recomputing += bool(stage._need)
    assert recomputing  # the recomputation path (and its cache) was taken


def plain_simulate_1f1b(fwd: np.ndarray, bwd: np.ndarray, p2p: np.ndarray, m: int) -> Schedule:
    """`simulate_1f1b` as it was before its tables of finished operations: a dict of them."""
    p = len(fwd)
    orders = [_op_order(p, k, m) for k in range(p)]
    done: dict[tuple[bool, int, int], float] = {}
    ops: list[tuple[int, int, bool, float, float]] = []
    ptr, free, sweep = [0] * p, [0.0] * p, 0
    while len(ops) < 2 * p * m:
        sweep += 1
        for k in range(p) if sweep % 2 else range(p - 1, -1, -1):
            while ptr[k] < len(orders[k]):
                back, i = orders[k][ptr[k]]
                if not back:
                    ready, receive = (done.get((False, k - 1, i)), float(p2p[k - 1])) if k else (0.0, 0.0)
                elif k == p - 1:
                    ready, receive = done.get((False, k, i)), 0.0
                else:
                    ready, receive = done.get((True, k + 1, i)), float(p2p[k])
                if ready is None:
                    break
                start = max(free[k], ready)  # a blocking receive: the transfer on this stage's time
                free[k] = start + receive + (bwd[k] if back else fwd[k])
                done[(back, k, i)] = free[k]
                ops.append((k, i, back, start, free[k]))
                ptr[k] += 1
    return _schedule(ops, free)


@pytest.mark.parametrize("seed", range(8))
def test_the_1f1b_simulation_plays_out_as_the_plain_one(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p, m = int(rng.integers(1, 9)), int(rng.integers(1, 40))
    fwd, bwd, p2p = rng.uniform(0.1, 2, p), rng.uniform(0.2, 4, p), rng.uniform(0, 0.5, max(p - 1, 0))
    new, old = simulate_1f1b(fwd, bwd, p2p, m), plain_simulate_1f1b(fwd, bwd, p2p, m)
    for field in dataclasses.fields(Schedule):
        assert getattr(new, field.name).tolist() == getattr(old, field.name).tolist()


def plain_fits(stage: StageModel, a: int, e: int, budget: float) -> bool:
    """`StageModel.fits` as it was before its per-range cache."""
    r = stage.recompute(a, e)
    if r > e - a:
        return False
    f = stage.costs.prefix["flops"]
    extra = stage.alpha * (3 * stage.extra_flops + f[a + r] - f[a]) + 2 * stage.comm * r
    return bool(stage._time[e] - stage._time[a] + extra <= budget)


@pytest.mark.parametrize("seed", range(12))
def test_fits_with_its_cache_answers_as_the_plain_test(seed: int) -> None:
    rng, spec = random.Random(seed), long_spec(seed)
    layers, refused = spec.costs.layers, 0
    for model in models(spec)[:10]:
        for stage in (m for line in model.models for m in line):
            full = stage._time[-1] - stage._time[0]
            for _ in range(60):  # ranges asked again at other budgets, infinite ones too
                a = rng.randrange(layers)
                e, budget = rng.randint(a + 1, layers), rng.choice([math.inf, rng.uniform(0, 1.2) * full])
                assert stage.fits(a, e, budget) == plain_fits(stage, a, e, budget)
                refused += not plain_fits(stage, a, e, math.inf)
    assert refused  # some ranges fit no memory: the cached NaN must refuse them at any budget


def _line(p: int) -> LineStats:
    rng = np.random.default_rng(p)
    fwd, bwd = rng.uniform(1, 2, p), rng.uniform(2, 4, p)
    return LineStats(fwd, bwd, np.zeros(p), np.zeros(p, dtype=np.int64), np.full(p, 0.1))


def test_stage_ends_never_simulate_more_micro_batches_than_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """64 stages x 200 micro-batches simulated 256 and 512 (the steady-state extrapolation); 512
    stages (1,024 devices x 10,000 layers) simulated for 16 s a step: the closed form prices those."""
    from slurm_hetero.engine import schedule

    sizes: list[int] = []
    plain = schedule.simulate_1f1b
    monkeypatch.setattr(schedule, "simulate_1f1b", lambda f, b, c, m: sizes.append(m) or plain(f, b, c, m))
    model = StepModel.__new__(StepModel)
    s = _line(64)
    assert np.allclose(model._stage_ends(s, 200), plain(s.fwd, s.bwd, s.p2p, 200).stage_end)
    assert sizes == [200]
    s = _line(512)
    ends = model._stage_ends(s, 400)
    assert sizes == [200] and ends[0] == pytest.approx(estimate_1f1b(s.fwd, s.bwd, s.p2p, 400))


def _plain_simulate(model: StepModel, bounds: list[int], samples: tuple[int, ...]) -> float:
    """`StepModel.simulate` without its memo: every line simulated each time."""
    stats = model.line_stats(bounds)
    if stats is None:
        return math.inf
    ms = [math.ceil(n / model.shape.micro_batch) for n in model._per_line_max(samples)]
    ends = [model._stage_ends(s, m) for s, m in zip(stats, ms)]
    return max(float((e + x).max()) for e, x in zip(ends, model.tail(bounds)))


@pytest.mark.parametrize("seed", range(12))
def test_simulate_with_its_memo_prices_as_the_plain_simulation(seed: int) -> None:
    """The memo keeps each line's end for the last split: trials that move samples, and splits
    that change and come back, price exactly as simulating every line afresh."""
    rng = random.Random(seed)
    spec = random_spec(rng)
    for model in models(spec)[:6]:
        splits = [even_bounds(spec.costs.layers, model.shape.stages)]
        balanced = balanced_bounds(model, math.inf)
        splits += [balanced] if balanced else []
        for bounds in [*splits, *splits[::-1]]:
            samples = model.split(model.line_stats(bounds) or [])
            for _ in range(4):
                assert model.simulate(bounds, samples) == _plain_simulate(model, bounds, samples)
                i, j = rng.randrange(len(samples)), rng.randrange(len(samples))
                if samples[i]:
                    samples = tuple(n - (k == i) + (k == j) for k, n in enumerate(samples))


def _plain_split(
    total: int, replicas: list[int], fill: list[float], period: list[float], b: int
) -> tuple[int, ...]:
    """`split_samples` before its water level was counted with numpy (Python floats, line by line)."""

    def count(x: float) -> list[int]:
        steps = [math.floor((x - f) / q * (1 + 1e-12)) + 1 for f, q in zip(fill, period)]
        return [b * n if x >= f else 0 for n, f in zip(steps, fill)]

    def reach(x: float) -> int:
        return sum(r * n for r, n in zip(replicas, count(x)))

    lo, hi = 0.0, min(f + (math.ceil(total / (r * b)) - 1) * q for f, q, r in zip(fill, period, replicas))
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if reach(mid) >= total else (mid, hi)
    low, high = count(lo), count(hi)
    n = [v for r, v in zip(replicas, high) for _ in range(r)]
    surplus, ends = reach(hi) - total, list(itertools.accumulate(replicas))
    for i in reversed(range(len(replicas))):
        for j in range(ends[i] - 1, ends[i] - replicas[i] - 1, -1):
            cut = min(surplus, high[i] - low[i])
            n[j], surplus = n[j] - cut, surplus - cut
    return tuple(n)


@pytest.mark.parametrize("seed", range(200))
def test_split_samples_counts_as_the_plain_water_filling(seed: int) -> None:
    rng = random.Random(seed)
    k = rng.randint(2, 60)
    replicas = [rng.randint(1, 8) for _ in range(k)]
    fill = [rng.uniform(0.0, 5.0) for _ in range(k)]
    period = [rng.choice([rng.uniform(1e-4, 1.0), 0.25, 1.0]) for _ in range(k)]
    total, b = rng.randint(sum(replicas), 8 * 4096), rng.choice([1, 2, 4, 8])
    got = split_samples(total, replicas, fill, period, b)
    assert got == _plain_split(total, replicas, fill, period, b)
    assert all(type(n) is int for n in got) and sum(got) == total


@pytest.mark.parametrize("seed", range(12))
def test_rings_priced_once_per_stage_column_match_each_stage_priced_alone(seed: int) -> None:
    for model in models(random_spec(random.Random(seed))):
        p = model.shape.stages
        assert model._ar_gbs == [model._allreduce_gbs(k) for k in range(p)]
        assert model._ar_groups == [model._hierarchy(k) for k in range(p)]


def test_a_score_of_many_lines_spends_the_budget_by_its_lines() -> None:
    """58 types x 16 devices: 1,170 scores of 58-line data shapes took 14 s; a score of more than
    SCORE_LINES lines counts as lines / SCORE_LINES."""
    few, many = (
        Shape(LayoutKind.DATA, tuple(((g, 1),) for g in range(n)), (1,) * n, 1)
        for n in (SCORE_LINES, 4 * SCORE_LINES)
    )

    def spent(shape: Shape) -> float:
        budget = Budget(100.0)
        stand_in = type("Model", (), {"shape": shape, "simulations": 0})()
        for _ in budget.take(iter([[0, 1]] * 10), stand_in):  # type: ignore[arg-type]
            pass
        return 100.0 - budget.left

    assert spent(few) == 10 and spent(many) == 40
