"""The step-time model behind the layout solver: what one pipeline stage costs and one step takes.

Pure numpy, deterministic, no I/O. The rules, written down once:

- **Compute.** A stage of `tp` devices at `tflops` sustained TFLOPS each runs its layers' forward
  FLOPs in `fwd` and twice that in `bwd`; recomputed layers add their forward FLOPs to `bwd`.
  Time scales linearly with the micro-batch size.
- **Tensor parallel** (inside a node only) costs 4 ring all-reduces of the hidden state per layer and
  micro-batch (Megatron: 2 forward, 2 backward; 2 more per recomputed layer), over `link_gbs`.
- **Memory per device** of a stage: weights, gradients and optimizer state of its layers (split over
  `tp`; optimizer state also over the stage's data-parallel replicas when sharded, ZeRO-1), plus
  activations of `in_flight` micro-batches (1F1B: stage `k` of `p` holds `p - k`), split over `tp`.
  Recomputation keeps only a layer's input (`ckpt_bytes`) and needs one layer's full activations
  while it recomputes. Stages recompute the fewest layers that make them fit, their first ones.
- **Pipeline.** One step is a 1F1B schedule (warm-up forwards, one-forward-one-backward, drain)
  that `simulate_1f1b` plays out with per-stage times and the transfer delay between stages
  (schedules over 200,000 operations are extrapolated from two shorter ones: the steady state adds
  the same time per micro-batch). `estimate_1f1b` is its closed form (every stage once plus `m - 1`
  bottleneck periods), which the search uses except for steps of few micro-batches (`is_short`),
  where it is least accurate and simulating is cheap.
- **Batch.** Replicas of one pipeline shape are identical; the global batch is split across
  shapes by water-filling the closed form (faster replicas take more samples), refined by
  simulation for short steps. A replica's gradient weight is its share of the global batch.
- **Gradients** of each stage are all-reduced over its data-parallel replicas by a ring
  (`2 (n - 1) / n` times the bytes over the slowest link), overlapped with the stage's last
  backward (bucketed reduction, as DDP and Megatron do); only the rest adds to the step.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
GB = 1e9
TFLOPS = 1e12


def _frozen(values: npt.ArrayLike, name: str) -> FloatArray:
    array = np.array(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0 or not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(f"{name} must be a non-empty 1-d array of finite non-negative numbers")
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class LayerCosts:
    """Per-layer costs of a model for one sample (one sequence of the training length).

    `flops`: forward FLOPs per layer; `param_bytes`: weight bytes per layer in the training dtype
    (gradients are `grad_factor` times that, optimizer state `optimizer_factor` times: 1 and 6 for
    bf16 weights with fp32 master weights and Adam); `act_bytes`: activations kept for backward;
    `ckpt_bytes`: what a recomputed layer keeps instead; `boundary_bytes`: the hidden state sent
    between stages. `first_*` / `last_*`: the embedding on the first stage and the head (and its
    logits, `last_act_bytes`) on the last.
    """

    flops: FloatArray
    param_bytes: FloatArray
    act_bytes: FloatArray
    ckpt_bytes: FloatArray
    boundary_bytes: float
    first_flops: float = 0.0
    last_flops: float = 0.0
    first_param_bytes: float = 0.0
    last_param_bytes: float = 0.0
    last_act_bytes: float = 0.0
    grad_factor: float = 1.0
    optimizer_factor: float = 6.0

    def __post_init__(self) -> None:
        for name in ("flops", "param_bytes", "act_bytes", "ckpt_bytes"):
            object.__setattr__(self, name, _frozen(getattr(self, name), name))
        if len({self.flops.size, self.param_bytes.size, self.act_bytes.size, self.ckpt_bytes.size}) != 1:
            raise ValueError("flops, param_bytes, act_bytes and ckpt_bytes must have one entry per layer")
        if np.any(self.ckpt_bytes > self.act_bytes):
            raise ValueError("ckpt_bytes must not exceed act_bytes")

    @property
    def layers(self) -> int:
        return int(self.flops.size)

    @property
    def step_flops_per_sample(self) -> float:
        """Forward plus backward FLOPs of the whole model for one sample (no recomputation)."""
        return 3.0 * (float(self.flops.sum()) + self.first_flops + self.last_flops)

    @cached_property
    def prefix(self) -> dict[str, FloatArray]:
        """Prefix sums (length layers + 1) of flops, params, activations and recompute savings."""
        sums = {
            "flops": self.flops,
            "params": self.param_bytes,
            "acts": self.act_bytes,
            "savings": self.act_bytes - self.ckpt_bytes,
        }
        return {k: np.concatenate(([0.0], np.cumsum(v))) for k, v in sums.items()}


@dataclass(frozen=True)
class DeviceGroup:
    """Devices of one type in the allocation: `per_node` counts them on each of their nodes, in
    Slurm's rank order. `tflops` is what one device sustains on this model, `memory_bytes` what a
    job may use of its memory, `link_gbs` its device-to-device bandwidth inside a node (one way)."""

    type: str
    per_node: tuple[int, ...]
    tflops: float
    memory_bytes: float
    link_gbs: float

    def __post_init__(self) -> None:
        if not self.per_node or min(self.per_node) < 1:
            raise ValueError(f"{self.type}: per_node must list at least one positive count")
        if self.tflops <= 0 or self.memory_bytes <= 0 or self.link_gbs <= 0:
            raise ValueError(f"{self.type}: tflops, memory_bytes and link_gbs must be positive")

    @property
    def count(self) -> int:
        return sum(self.per_node)

    @property
    def node_size(self) -> int:
        return max(self.per_node)


def ring_allreduce_s(nbytes: float, ranks: int, gbs: float) -> float:
    """Seconds for a ring all-reduce of `nbytes` over `ranks` ranks at `gbs` GB/s per rank."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (ranks - 1) / ranks * nbytes / (gbs * GB)


@dataclass(frozen=True)
class StageSite:
    """Where a pipeline stage runs and what it must hold, everything but its layer range."""

    group: DeviceGroup
    tp: int
    dp: int
    in_flight: int
    micro_batch: int
    first: bool
    last: bool
    shard_optimizer: bool = True


class StageModel:
    """Time (seconds per micro-batch) and memory (bytes per device) of one site over layer ranges
    `[a, e)` with the first `r` layers recomputed, from prefix sums of `costs`."""

    def __init__(self, costs: LayerCosts, site: StageSite) -> None:
        self.costs, self.site, g, pre = costs, site, site.group, costs.prefix
        state = 1.0 + costs.grad_factor + costs.optimizer_factor / (site.dp if site.shard_optimizer else 1)
        extra_params = costs.first_param_bytes * site.first + costs.last_param_bytes * site.last
        b, tp = site.micro_batch, site.tp
        self.alpha = b / (tp * g.tflops * TFLOPS)
        self.comm = b * ring_allreduce_s(costs.boundary_bytes, tp, g.link_gbs)
        self.extra_flops = costs.first_flops * site.first + costs.last_flops * site.last
        self.mu_a = site.in_flight * b / tp
        self.base_mem = state * extra_params / tp + b * costs.last_act_bytes * site.last / tp
        self.transient = b * float(costs.act_bytes.max()) / tp
        self.capacity = g.memory_bytes
        idx = np.arange(costs.layers + 1)
        self._time_array = 3 * self.alpha * pre["flops"] + 4 * self.comm * idx
        self._mem_array = state / tp * pre["params"] + self.mu_a * pre["acts"]
        self._time, self._mem = self._time_array.tolist(), self._mem_array.tolist()
        self._savings = pre["savings"].tolist()

    def times(self, a: int, e: int, r: int) -> tuple[float, float]:
        """Forward and backward seconds per micro-batch."""
        f = self.costs.prefix["flops"]
        work = self.alpha * (f[e] - f[a] + self.extra_flops)
        fwd = work + 2 * self.comm * (e - a)
        bwd = 2 * work + self.alpha * (f[a + r] - f[a]) + 2 * self.comm * (e - a + r)
        return float(fwd), float(bwd)

    def memory(self, a: int, e: int, r: int) -> float:
        """Peak bytes per device."""
        saved = self.mu_a * (self._savings[a + r] - self._savings[a])
        return float(self.base_mem + self._mem[e] - self._mem[a] - saved + (self.transient if r else 0.0))

    def recompute(self, a: int, e: int) -> int:
        """Fewest layers of `[a, e)` to recompute so it fits; `e - a + 1` if none is enough."""
        held = self.base_mem + self._mem[e] - self._mem[a]
        if held <= self.capacity:
            return 0
        short = (held + self.transient - self.capacity) / self.mu_a
        r = bisect.bisect_left(self._savings, self._savings[a] + short, a, e + 1) - a
        return min(r, e - a + 1)

    def _recompute_all(self, a: int, ends: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        mem, savings = self._mem_array, self.costs.prefix["savings"]
        held = self.base_mem + mem[ends] - mem[a]
        short = (held + self.transient - self.capacity) / self.mu_a
        r = np.where(held <= self.capacity, 0, np.searchsorted(savings, savings[a] + short, side="left") - a)
        return np.minimum(r, ends - a + 1).astype(np.int64)

    def fits(self, a: int, e: int, budget: float) -> bool:
        """Whether `[a, e)` fits in memory (recomputing as needed) with fwd + bwd <= `budget`."""
        r = self.recompute(a, e)
        if r > e - a:
            return False
        f = self.costs.prefix["flops"]
        extra = self.alpha * (3 * self.extra_flops + f[a + r] - f[a]) + 2 * self.comm * r
        return bool(self._time[e] - self._time[a] + extra <= budget)

    def max_end(self, a: int, limit: int, budget: float) -> int:
        """Largest `e <= limit` whose range `[a, e)` fits in memory with fwd + bwd <= `budget`
        (recomputing as needed); `a` when not even one layer does."""
        goal = self._time[a] + budget - 3 * self.alpha * self.extra_flops
        e = bisect.bisect_right(self._time, goal, a + 1, limit + 1) - 1
        if e == a or self.base_mem + self._mem[e] - self._mem[a] <= self.capacity:
            return e
        ends = np.arange(a + 1, e + 1)
        r = self._recompute_all(a, ends)
        rr = np.minimum(r, ends - a)
        f = self.costs.prefix["flops"]
        extra = self.alpha * (3 * self.extra_flops + f[a + rr] - f[a]) + 2 * self.comm * rr
        bad = np.flatnonzero((r > ends - a) | (self._time_array[ends] - self._time[a] + extra > budget))
        return a + (int(bad[0]) if bad.size else int(ends.size))


def estimate_1f1b(fwd: FloatArray, bwd: FloatArray, p2p: FloatArray, micro_batches: int) -> float:
    """Closed-form 1F1B step: every stage once (fill and drain) plus `m - 1` bottleneck periods."""
    if micro_batches <= 0:
        return 0.0
    per = fwd + bwd
    return float(per.sum() + 2 * p2p.sum() + (micro_batches - 1) * per.max())


@dataclass(frozen=True)
class Schedule:
    """One replica's 1F1B step, op by op (arrays aligned), and when each stage finishes."""

    stage: npt.NDArray[np.int64]
    micro: npt.NDArray[np.int64]
    backward: npt.NDArray[np.bool_]
    start: FloatArray
    end: FloatArray
    stage_end: FloatArray

    @property
    def makespan(self) -> float:
        return float(self.stage_end.max()) if self.stage_end.size else 0.0


def _op_order(stages: int, index: int, micro_batches: int) -> list[tuple[bool, int]]:
    warmup = min(stages - 1 - index, micro_batches)
    order = [(False, i) for i in range(warmup)]
    for i in range(micro_batches - warmup):
        order += [(False, warmup + i), (True, i)]
    return order + [(True, i) for i in range(micro_batches - warmup, micro_batches)]


def simulate_1f1b(fwd: FloatArray, bwd: FloatArray, p2p: FloatArray, micro_batches: int) -> Schedule:
    """Play out a 1F1B schedule: `fwd[k]`, `bwd[k]` per micro-batch on stage `k`, `p2p[k]` the
    transfer delay between stages `k` and `k + 1` (either way)."""
    p, m = len(fwd), micro_batches
    orders = [_op_order(p, k, m) for k in range(p)]
    done: dict[tuple[bool, int, int], float] = {}
    ops: list[tuple[int, int, bool, float, float]] = []
    ptr, free, sweep = [0] * p, [0.0] * p, 0
    while len(ops) < 2 * p * m:
        before, sweep = len(ops), sweep + 1
        for k in range(p) if sweep % 2 else range(p - 1, -1, -1):
            while ptr[k] < len(orders[k]):
                back, i = orders[k][ptr[k]]
                ready = _ready(done, back, k, i, p, p2p)
                if ready is None:
                    break
                start = max(free[k], ready)
                free[k] = start + (bwd[k] if back else fwd[k])
                done[(back, k, i)] = free[k]
                ops.append((k, i, back, start, free[k]))
                ptr[k] += 1
        if len(ops) == before:
            raise RuntimeError("1F1B schedule deadlocked")  # unreachable for a valid order
    return _schedule(ops, free)


def _ready(
    done: dict[tuple[bool, int, int], float], back: bool, k: int, i: int, p: int, p2p: FloatArray
) -> float | None:
    if not back:
        prev = done.get((False, k - 1, i)) if k else 0.0
        return None if prev is None else prev + (float(p2p[k - 1]) if k else 0.0)
    if k == p - 1:
        return done.get((False, k, i))
    nxt = done.get((True, k + 1, i))
    return None if nxt is None else nxt + float(p2p[k])


def _schedule(ops: list[tuple[int, int, bool, float, float]], free: list[float]) -> Schedule:
    cols = list(zip(*ops, strict=True)) if ops else [(), (), (), (), ()]
    return Schedule(
        stage=np.array(cols[0], dtype=np.int64),
        micro=np.array(cols[1], dtype=np.int64),
        backward=np.array(cols[2], dtype=np.bool_),
        start=np.array(cols[3], dtype=np.float64),
        end=np.array(cols[4], dtype=np.float64),
        stage_end=np.array(free, dtype=np.float64),
    )


def split_samples(
    total: int, replicas: Sequence[int], fill: Sequence[float], period: Sequence[float], micro_batch: int
) -> tuple[int, ...]:
    """Samples per replica (lines in order, `replicas[i]` identical replicas each) that minimize the
    slowest replica's time `fill + (micro-batches - 1) * period` (water-filling; ties: later
    replicas get fewer)."""
    b = micro_batch
    if len(replicas) == 1:
        q, r = divmod(total, replicas[0])
        return tuple(q + (j < r) for j in range(replicas[0]))

    def count(x: float) -> list[int]:
        steps = [math.floor((x - f) / q * (1 + 1e-12)) + 1 for f, q in zip(fill, period, strict=True)]
        return [b * n if x >= f else 0 for n, f in zip(steps, fill, strict=True)]

    def reach(x: float) -> int:
        return sum(r * n for r, n in zip(replicas, count(x), strict=True))

    lo = 0.0
    hi = min(f + (math.ceil(total / (r * b)) - 1) * q for f, q, r in zip(fill, period, replicas, strict=True))
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if reach(mid) >= total else (mid, hi)
    low, high = count(lo), count(hi)
    n = [v for r, v in zip(replicas, high, strict=True) for _ in range(r)]
    surplus, ends = reach(hi) - total, list(itertools.accumulate(replicas))
    for i in reversed(range(len(replicas))):
        for j in range(ends[i] - 1, ends[i] - replicas[i] - 1, -1):
            cut = min(surplus, high[i] - low[i])
            n[j], surplus = n[j] - cut, surplus - cut
    return tuple(n)


@dataclass(frozen=True)
class Shape:
    """A candidate layout without its layer split. `lines`: the pipeline shapes, each a stage list
    of (group index, tensor parallel degree); `replicas[i]` copies of line `i` run side by side
    (data parallel); the first stage of every line holds the embedding, the last the head."""

    kind: str
    lines: tuple[tuple[tuple[int, int], ...], ...]
    replicas: tuple[int, ...]
    micro_batch: int

    @property
    def stages(self) -> int:
        return len(self.lines[0])

    def block(self, line: int, group: int) -> int:
        """Devices of `group` in one replica of `line`."""
        return sum(t for g, t in self.lines[line] if g == group)


def line_p2p(
    groups: Sequence[DeviceGroup], costs: LayerCosts, shape: Shape, line: int, network_gbs: float
) -> FloatArray:
    """Seconds to send one micro-batch's hidden state from each stage of `line` to the next: over
    the device link when both stages are in one group whose replica fits a node, else the network;
    each of the `tp` ranks sends its share."""
    stages, out = shape.lines[line], np.zeros(shape.stages)
    blocks: dict[int, int] = {}
    for g, t in stages:
        blocks[g] = blocks.get(g, 0) + t
    for k in range(len(stages) - 1):
        (g1, t1), (g2, t2) = stages[k], stages[k + 1]
        inside = g1 == g2 and blocks[g1] <= groups[g1].node_size
        gbs = groups[g1].link_gbs if inside else network_gbs
        out[k] = shape.micro_batch * costs.boundary_bytes / (min(t1, t2) * gbs * GB)
    return out


SEARCH_SIMULATE_OPS = 512


def is_short(shape: Shape, global_batch: int) -> bool:
    """Whether a step of `shape` has so few micro-batches that the search simulates it."""
    return 2 * shape.stages * math.ceil(global_batch / shape.micro_batch) <= SEARCH_SIMULATE_OPS


@dataclass(frozen=True)
class LineStats:
    """Per-stage figures of one line for one layer split."""

    fwd: FloatArray
    bwd: FloatArray
    memory: FloatArray
    recompute: npt.NDArray[np.int64]
    p2p: FloatArray


class StepModel:
    """Step time of one `Shape` for any layer split (`bounds`, length stages + 1) and sample split.

    Stage figures are cached per layer range, so moving one boundary costs two stage evaluations.
    """

    SIMULATE_OPS = 200_000
    REFINE_REPLICAS = 4

    def __init__(
        self,
        groups: Sequence[DeviceGroup],
        costs: LayerCosts,
        shape: Shape,
        global_batch: int,
        network_gbs: float,
        shard: bool = True,
    ) -> None:
        self.groups, self.costs, self.shape, self.batch = tuple(groups), costs, shape, global_batch
        self.network_gbs = network_gbs
        p, dp, b = shape.stages, sum(shape.replicas), shape.micro_batch
        busiest = global_batch if len(shape.replicas) > 1 else math.ceil(global_batch / shape.replicas[0])
        cap = math.ceil(busiest / b)  # most micro-batches a replica runs: bounds what a stage holds
        self.models = [
            [
                StageModel(
                    costs, StageSite(self.groups[g], t, dp, min(p - k, cap), b, k == 0, k == p - 1, shard)
                )
                for k, (g, t) in enumerate(line)
            ]
            for line in shape.lines
        ]
        self._p2p = [line_p2p(self.groups, costs, shape, i, network_gbs) for i in range(len(shape.lines))]
        self._ar_gbs = [self._allreduce_gbs(k) for k in range(p)]
        self._cache: dict[tuple[int, int, int, int], tuple[float, float, float, int] | None] = {}

    def _allreduce_gbs(self, k: int) -> float:
        """Bandwidth of stage `k`'s gradient ring: the device link when all its replicas share a
        node, else the network."""
        if len(self.shape.lines) > 1:
            return self.network_gbs
        g, _ = self.shape.lines[0][k]
        spread = self.shape.replicas[0] * self.shape.block(0, g)
        return self.groups[g].link_gbs if spread <= self.groups[g].node_size else self.network_gbs

    def stage(self, line: int, k: int, a: int, e: int) -> tuple[float, float, float, int] | None:
        """(fwd, bwd, memory, recompute) of stage `k` of `line` over `[a, e)`; None if it cannot fit."""
        key = (line, k, a, e)
        if key not in self._cache:
            model = self.models[line][k]
            r = model.recompute(a, e)
            self._cache[key] = None if r > e - a else (*model.times(a, e, r), model.memory(a, e, r), r)
        return self._cache[key]

    def line_stats(self, bounds: Sequence[int]) -> list[LineStats] | None:
        """Stage figures of every line, or None when a stage cannot fit its memory."""
        out = []
        for i in range(len(self.shape.lines)):
            rows = [self.stage(i, k, bounds[k], bounds[k + 1]) for k in range(len(bounds) - 1)]
            if any(row is None for row in rows):
                return None
            cols = np.array(rows, dtype=np.float64).T
            out.append(LineStats(cols[0], cols[1], cols[2], cols[3].astype(np.int64), self._p2p[i]))
        return out

    def allreduce(self, bounds: Sequence[int]) -> FloatArray:
        """Gradient all-reduce seconds of each stage position over all replicas."""
        c, pre = self.costs, self.costs.prefix["params"]
        edges = np.asarray(bounds)
        params = pre[edges[1:]] - pre[edges[:-1]]
        params[0] += c.first_param_bytes
        params[-1] += c.last_param_bytes
        ranks = sum(self.shape.replicas)
        per_rank = [params[k] * c.grad_factor / t for k, (_, t) in enumerate(self.shape.lines[0])]
        return np.array(
            [ring_allreduce_s(v, ranks, gbs) for v, gbs in zip(per_rank, self._ar_gbs, strict=True)]
        )

    def split(self, stats: Sequence[LineStats]) -> tuple[int, ...]:
        """Samples per replica, by speed (identical replicas get equal shares, the first ones +1)."""
        fill = [float((s.fwd + s.bwd).sum() + 2 * s.p2p.sum()) for s in stats]
        period = [float((s.fwd + s.bwd).max()) for s in stats]
        return split_samples(self.batch, self.shape.replicas, fill, period, self.shape.micro_batch)

    @property
    def short(self) -> bool:
        """Whether a step is so few micro-batches that the closed form is unreliable and the search
        simulates it instead (a few hundred operations at most)."""
        return is_short(self.shape, self.batch)

    def score(self, bounds: Sequence[int]) -> float:
        """The search's objective: the closed form, or for `short` steps the simulated step (with
        the sample split refined too when there are at most `REFINE_REPLICAS` replicas)."""
        if not self.short:
            return self.estimate(bounds)
        stats = self.line_stats(bounds)
        if stats is None:
            return math.inf
        samples = self.split(stats)
        if sum(self.shape.replicas) <= self.REFINE_REPLICAS:
            samples = self.refine_split(bounds, samples)
        return self.simulate(bounds, samples)

    def refine_split(self, bounds: Sequence[int], samples: tuple[int, ...]) -> tuple[int, ...]:
        """For `short` steps, move single samples between replicas while the simulated step improves."""
        best = self.simulate(bounds, samples)
        moved = self.short and len(samples) > 1
        while moved:
            moved = False
            for i, j in itertools.permutations(range(len(samples)), 2):
                trial = tuple(n - (k == i) + (k == j) for k, n in enumerate(samples))
                if samples[i] and (value := self.simulate(bounds, trial)) < best * (1 - 1e-9):
                    samples, best, moved = trial, value, True
                    break
        return samples

    def _per_line_max(self, samples: Sequence[int]) -> list[int]:
        out, start = [], 0
        for r in self.shape.replicas:
            out.append(max(samples[start : start + r], default=0))
            start += r
        return out

    def estimate(self, bounds: Sequence[int], samples: Sequence[int] | None = None) -> float:
        """Closed-form step seconds (inf when a stage cannot fit)."""
        stats = self.line_stats(bounds)
        if stats is None:
            return math.inf
        samples = self.split(stats) if samples is None else samples
        ends = []
        for s, n in zip(stats, self._per_line_max(samples), strict=True):
            total = estimate_1f1b(s.fwd, s.bwd, s.p2p, math.ceil(n / self.shape.micro_batch))
            drain = np.concatenate(([0.0], np.cumsum(s.bwd + s.p2p)[:-1]))
            ends.append(np.where(n > 0, total - drain, 0.0))
        return self._step(stats, ends, bounds)

    def simulate(self, bounds: Sequence[int], samples: Sequence[int]) -> float:
        """Simulated step seconds: each line's busiest replica through 1F1B, then the all-reduces."""
        stats = self.line_stats(bounds)
        if stats is None:
            return math.inf
        ms = [math.ceil(n / self.shape.micro_batch) for n in self._per_line_max(samples)]
        return self._step(stats, [self._stage_ends(s, m) for s, m in zip(stats, ms, strict=True)], bounds)

    def _step(self, stats: Sequence[LineStats], ends: Sequence[FloatArray], bounds: Sequence[int]) -> float:
        """Latest end of a stage's all-reduce, which overlaps its last backward (bucketed, as DDP
        and Megatron do) and shows only for the rest."""
        allreduce = self.allreduce(bounds)
        return max(
            float((e + np.maximum(0.0, allreduce - s.bwd)).max()) for s, e in zip(stats, ends, strict=True)
        )

    def _stage_ends(self, s: LineStats, m: int) -> FloatArray:
        p = len(s.fwd)
        if 2 * p * m <= self.SIMULATE_OPS:
            return simulate_1f1b(s.fwd, s.bwd, s.p2p, m).stage_end
        m0 = max(1, self.SIMULATE_OPS // (4 * p))
        e0 = simulate_1f1b(s.fwd, s.bwd, s.p2p, m0).stage_end
        e1 = simulate_1f1b(s.fwd, s.bwd, s.p2p, 2 * m0).stage_end
        return e1 + (e1 - e0) * (m - 2 * m0) / m0  # steady state: equal time per extra micro-batch
