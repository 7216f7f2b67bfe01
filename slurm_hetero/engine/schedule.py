"""The step-time model behind the layout solver: how one step of a candidate shape plays out.

Pure numpy. A step is a 1F1B schedule; the search uses its closed form except for steps of few
micro-batches (`is_short`), where it is least accurate and simulating is cheap. The assumptions
are docs/plan.md's, "What the step time counts".
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from slurm_hetero.core.compat import StrEnum
from slurm_hetero.engine.modelcost import zero_divisors
from slurm_hetero.engine.stagecost import (
    GB,
    DeviceGroup,
    FloatArray,
    LayerCosts,
    StageModel,
    StageSite,
    hierarchical_allreduce_s,
    ring_allreduce_s,
)


def stage_periods(fwd: FloatArray, bwd: FloatArray, p2p: FloatArray) -> FloatArray:
    """Seconds each stage is busy per micro-batch in the steady state, receiving its input and its
    output's gradient included (a blocking receive, as NCCL's and gloo's matched send/receive do)."""
    out: FloatArray = fwd + bwd + p2p
    out[1:] += p2p[:-1]
    return out


def estimate_1f1b(fwd: FloatArray, bwd: FloatArray, p2p: FloatArray, micro_batches: int) -> float:
    """Closed-form 1F1B step: every stage once plus `m - 1` bottleneck periods (`stage_periods`)."""
    if micro_batches <= 0:
        return 0.0
    return float((fwd + bwd).sum() + 2 * p2p.sum() + (micro_batches - 1) * stage_periods(fwd, bwd, p2p).max())


@dataclass(frozen=True)
class Schedule:
    """One replica's 1F1B step, op by op (arrays aligned), and when each stage finishes."""

    stage: npt.NDArray[np.int64]
    backward: npt.NDArray[np.bool_]
    start: FloatArray
    end: FloatArray
    stage_end: FloatArray


def _op_order(stages: int, index: int, micro_batches: int) -> list[tuple[bool, int]]:
    warmup = min(stages - 1 - index, micro_batches)
    order = [(False, i) for i in range(warmup)]
    for i in range(micro_batches - warmup):
        order += [(False, warmup + i), (True, i)]
    return order + [(True, i) for i in range(micro_batches - warmup, micro_batches)]


def simulate_1f1b(fwd: FloatArray, bwd: FloatArray, p2p: FloatArray, micro_batches: int) -> Schedule:
    """Play out a 1F1B schedule; `p2p[k]`, between stages `k` and `k + 1`, is part of the receiving op."""
    p, m = len(fwd), micro_batches
    orders = [_op_order(p, k, m) for k in range(p)]
    times = (np.asarray(fwd, dtype=np.float64).tolist(), np.asarray(bwd, dtype=np.float64).tolist())
    delay = np.asarray(p2p, dtype=np.float64).tolist()  # Python floats: the same sums, faster
    done: list[list[list[float | None]]] = [[[None] * m for _ in range(p)] for _ in range(2)]  # fwd, bwd
    ops: list[tuple[int, int, bool, float, float]] = []
    ptr, free, sweep = [0] * p, [0.0] * p, 0
    while len(ops) < 2 * p * m:
        before, sweep = len(ops), sweep + 1
        for k in range(p) if sweep % 2 else range(p - 1, -1, -1):
            while ptr[k] < len(orders[k]):
                back, i = orders[k][ptr[k]]
                if back:
                    ready = done[False][k][i] if k == p - 1 else done[True][k + 1][i]
                else:
                    ready = done[False][k - 1][i] if k else 0.0
                if ready is None:
                    break
                start = max(free[k], ready)
                receive = (delay[k] if k < p - 1 else 0.0) if back else (delay[k - 1] if k else 0.0)
                free[k] = start + receive + times[back][k]
                done[back][k][i] = free[k]
                ops.append((k, i, back, start, free[k]))
                ptr[k] += 1
        if len(ops) == before:
            raise RuntimeError("1F1B schedule deadlocked")  # unreachable for a valid order
    return _schedule(ops, free)


def _schedule(ops: list[tuple[int, int, bool, float, float]], free: list[float]) -> Schedule:
    cols = list(zip(*ops)) if ops else [(), (), (), (), ()]
    return Schedule(
        stage=np.array(cols[0], dtype=np.int64),
        backward=np.array(cols[2], dtype=np.bool_),
        start=np.array(cols[3], dtype=np.float64),
        end=np.array(cols[4], dtype=np.float64),
        stage_end=np.array(free, dtype=np.float64),
    )


def split_samples(
    total: int, replicas: Sequence[int], fill: Sequence[float], period: Sequence[float], micro_batch: int
) -> tuple[int, ...]:
    """Samples per replica (lines in order, `replicas[i]` replicas each) that minimize the slowest
    replica's `fill + (micro-batches - 1) * period` (water-filling; ties: later replicas get fewer)."""
    b = micro_batch
    if len(replicas) == 1:
        q, r = divmod(total, replicas[0])
        return tuple(q + (j < r) for j in range(replicas[0]))

    lines = [(float(f), float(q)) for f, q in zip(fill, period)]

    def count(x: float) -> list[int]:  # samples per replica of each line done by time x
        return [b * (int(max(x - f, 0.0) / q * (1 + 1e-12)) + 1) if x >= f else 0 for f, q in lines]

    def reach(x: float) -> int:
        return sum(r * n for r, n in zip(replicas, count(x)))

    lo = 0.0
    hi = min(f + (math.ceil(total / (r * b)) - 1) * q for f, q, r in zip(fill, period, replicas))
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


class LayoutKind(StrEnum):
    """The layout families (`Shape.kind`; docs/plan.md describes them)."""

    PIPELINE = "pipeline"
    DATA = "data"
    STAGED = "staged"


@dataclass(frozen=True)
class Shape:
    """A candidate layout without its layer split. `lines`: the pipeline shapes, each a stage list of
    (group index, tensor parallel degree); `replicas[i]` copies of line `i` run side by side."""

    kind: str
    lines: tuple[tuple[tuple[int, int], ...], ...]
    replicas: tuple[int, ...]
    micro_batch: int
    stage_dp: tuple[int, ...] = ()  # `staged`: data-parallel degree of each stage (splits the micro-batch)

    @property
    def stages(self) -> int:
        return len(self.lines[0])

    def dp(self, k: int) -> int:
        """Data-parallel degree inside stage `k` (1 outside the staged family)."""
        return self.stage_dp[k] if self.stage_dp else 1

    def block(self, line: int, group: int) -> int:
        """Devices of `group` in one replica of `line`."""
        return sum(t for g, t in self.lines[line] if g == group)


PairGbs = Mapping[tuple[int, int], float]


def network_between(
    groups: Sequence[DeviceGroup], pair_gbs: PairGbs, default: float, g1: int, g2: int
) -> float:
    """GB/s one way between devices of groups `g1` and `g2` on different nodes: the pair's figure
    (the communicator chosen between them), else the slower NIC share, else `default`."""
    if g1 != g2 and (key := (min(g1, g2), max(g1, g2))) in pair_gbs:
        return pair_gbs[key]
    return min(groups[g].nic_gbs or default for g in {g1, g2})


def sender_nodes(groups: Sequence[DeviceGroup], shape: Shape, line: int) -> list[npt.NDArray[np.int64]]:
    """Per stage of `line`, replicas x stage degree: the node of each sender of the boundary (tp rank 0),
    ranks placed as `engine.layout.assign_ranks` places them."""
    stages, out = shape.lines[line], []
    ends: dict[int, npt.NDArray[np.int64]] = {}
    for k, (g, t) in enumerate(stages):
        if g not in ends:
            ends[g] = np.cumsum(groups[g].per_node)
        before = sum(r * shape.block(i, g) for i, r in enumerate(shape.replicas[:line]))
        within = sum(tk * shape.dp(j) for j, (gj, tk) in enumerate(stages[:k]) if gj == g)
        block = sum(tk * shape.dp(j) for j, (gj, tk) in enumerate(stages) if gj == g)
        first = before + within + block * np.arange(shape.replicas[line])[:, None]
        ranks = first + t * np.arange(shape.dp(k))[None, :]
        out.append(np.searchsorted(ends[g], ranks, side="right"))
    return out


def line_p2p(
    groups: Sequence[DeviceGroup],
    costs: LayerCosts,
    shape: Shape,
    line: int,
    network_gbs: float,
    pair_gbs: PairGbs | None = None,
) -> FloatArray:
    """Seconds to send one micro-batch's hidden state from each stage of `line` to the next."""
    stages, out = shape.lines[line], np.zeros(shape.stages)
    nodes = sender_nodes(groups, shape, line)
    for k in range(len(stages) - 1):
        g1, g2 = stages[k][0], stages[k + 1][0]
        both = np.concatenate((nodes[k], nodes[k + 1]), axis=1)
        inside = g1 == g2 and bool((both == both[:, :1]).all())
        gbs = groups[g1].link_gbs if inside else network_between(groups, pair_gbs or {}, network_gbs, g1, g2)
        samples = math.ceil(shape.micro_batch / min(shape.dp(k), shape.dp(k + 1)))
        out[k] = samples * costs.boundary_bytes / (gbs * GB)
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


class _Maxima:
    """A sample split (one entry per replica) with each line's largest entry kept in O(1) per move."""

    def __init__(self, replicas: Sequence[int], samples: Sequence[int]) -> None:
        self.samples = list(samples)
        self.line_of = [line for line, r in enumerate(replicas) for _ in range(r)]
        self.held: list[Counter[int]] = [Counter() for _ in replicas]
        for line, n in zip(self.line_of, self.samples):
            self.held[line][n] += 1
        self.maxima = [max(held, default=0) for held in self.held]

    def move(self, source: int, target: int) -> None:
        self._shift(source, -1)
        self._shift(target, 1)

    def _shift(self, replica: int, by: int) -> None:
        line, was = self.line_of[replica], self.samples[replica]
        held = self.held[line]
        held[was] -= 1
        held[was + by] += 1
        self.samples[replica] = was + by
        if by > 0:
            self.maxima[line] = max(self.maxima[line], was + by)
        elif was == self.maxima[line] and not held[was]:
            self.maxima[line] = was + by


class StepModel:
    """Step time of one `Shape` for any layer split (`bounds`, length stages + 1) and sample split;
    stage figures are cached per layer range, so moving one boundary costs two stage evaluations."""

    SIMULATE_OPS = 20_000
    # A simulated operation costs about its pipeline's stages: beyond this many operations x stages
    # one simulated step takes seconds, and the closed form prices it instead.
    MOST_SIMULATED_WORK = 8_000_000
    REFINE_REPLICAS = 4
    REFINE_SIMULATIONS = 1024  # trials of one `refine_split` (bounded planning time)

    def __init__(
        self,
        groups: Sequence[DeviceGroup],
        costs: LayerCosts,
        shape: Shape,
        global_batch: int,
        network_gbs: float,
        pair_gbs: PairGbs | None = None,
    ) -> None:
        self.groups, self.costs, self.shape, self.batch = tuple(groups), costs, shape, global_batch
        self.network_gbs, self.pair_gbs = network_gbs, dict(pair_gbs or {})
        self.simulations = 0  # what the search's `Budget` counts
        p, dp, b = shape.stages, sum(shape.replicas), shape.micro_batch
        busiest = global_batch if len(shape.replicas) > 1 else math.ceil(global_batch / shape.replicas[0])
        cap = math.ceil(busiest / b)  # most micro-batches a replica runs: bounds what a stage holds

        def site(k: int, g: int, t: int) -> StageSite:
            d = shape.dp(k)
            return StageSite(self.groups[g], t, dp * d, min(p - k, cap), math.ceil(b / d), k == 0, k == p - 1)

        def step_s(k: int, g: int, t: int) -> float:  # optimizer step seconds per weight byte
            shards = zero_divisors(costs.zero_stage, dp * shape.dp(k))[2]
            return costs.step_factor / (t * shards * self.groups[g].bandwidth_gbs * GB)

        self.models = [
            [StageModel(costs, site(k, *stage)) for k, stage in enumerate(line)] for line in shape.lines
        ]
        self._step_s = [np.array([step_s(k, *stage) for k, stage in enumerate(line)]) for line in shape.lines]
        self._p2p = [
            line_p2p(self.groups, costs, shape, i, network_gbs, self.pair_gbs)
            for i in range(len(shape.lines))
        ]
        # Stage positions with one column of (group, tp) and one degree share their ring (staged
        # stages do not: their spread is their own); priced once per column.
        columns = [
            (tuple(line[k] for line in shape.lines), shape.dp(k), k if shape.stage_dp else -1)
            for k in range(p)
        ]
        first = {column: k for k, column in reversed(list(enumerate(columns)))}
        rings = {column: (self._allreduce_gbs(k), self._hierarchy(k)) for column, k in first.items()}
        self._ar_gbs = [rings[column][0] for column in columns]
        self._ar_groups = [rings[column][1] for column in columns]
        self._cache: dict[tuple[int, int, int, int], tuple[float, float, float, int] | None] = {}
        self._grad_cache: dict[tuple[int, int, int], tuple[float, float]] = {}
        # `simulate`'s memo: the layer split last priced, its stats and tails, line ends by (line, m)
        self._sim_bounds: tuple[int, ...] | None = None
        self._sim_stats: tuple[list[LineStats], list[FloatArray]] | None = None
        self._sim_lines: dict[tuple[int, int], float] = {}

    def _allreduce_gbs(self, k: int) -> tuple[float, float]:
        """Bandwidth of stage `k`'s gradient ring and the seconds per byte it pays once on top: a cpu-relay
        copies the gradient to the host and back once (as `slurm_hetero.training` does), not per hop."""
        members = self._members(k)
        if len(members) > 1:
            nic, copies = math.inf, 0.0
            for a, b in itertools.combinations(members, 2):
                pair = network_between(self.groups, self.pair_gbs, self.network_gbs, a, b)
                hop = network_between(self.groups, {}, self.network_gbs, a, b)
                nic, copies = min(nic, hop), max(copies, 1.0 / (pair * GB) - 1.0 / (hop * GB))
            return nic, max(0.0, copies)
        return self._local_gbs(k, members[0]), 0.0

    def _members(self, k: int) -> list[int]:
        """The device groups whose replicas hold stage `k`."""
        return sorted({line[k][0] for line in self.shape.lines})

    def _local_gbs(self, k: int, g: int) -> float:
        """Bandwidth of a ring among group `g`'s ranks of stage `k`."""
        if self.shape.stage_dp:  # staged: the stage's own devices
            spread = self.shape.replicas[0] * self.shape.lines[0][k][1] * self.shape.dp(k)
        else:
            spread = sum(r * self.shape.block(i, g) for i, r in enumerate(self.shape.replicas))
        inside = spread <= self.groups[g].node_size
        return self.groups[g].link_gbs if inside else network_between(self.groups, {}, self.network_gbs, g, g)

    def _hierarchy(self, k: int) -> tuple[list[int], list[float]] | None:
        """The hierarchical all-reduce's parts when stage `k`'s ring spans vendors (ranks per vendor and
        each vendor's ring bandwidth, as `slurm_hetero.training` forms them); else None."""
        parts: dict[str, list[int]] = {}
        for g in self._members(k):
            parts.setdefault(self.groups[g].vendor or self.groups[g].type, []).append(g)
        if len(parts) < 2:
            return None
        lines = list(zip(self.shape.lines, self.shape.replicas))
        sizes, local = [], []
        for part in parts.values():
            sizes.append(sum(r for line, r in lines if line[k][0] in part) * self.shape.dp(k))
            between = [
                network_between(self.groups, {}, self.network_gbs, a, b) for a in part for b in part if a < b
            ]
            local.append(min([self._local_gbs(k, g) for g in part] + between))
        return sizes, local

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
        """Gradient all-reduce seconds of each stage position."""
        return np.array([self._gradient(k, a, e)[1] for k, (a, e) in enumerate(zip(bounds, bounds[1:]))])

    def _gradient(self, k: int, a: int, e: int) -> tuple[float, float]:
        """(gradient bytes per rank, all-reduce seconds) of stage position `k` over `[a, e)`; mixed tp
        degrees: the least degree's rank."""
        key = (k, a, e)
        if key not in self._grad_cache:
            c, pre = self.costs, self.costs.prefix["params"]
            params = pre[e] - pre[a]
            params += c.first_param_bytes if k == 0 else 0.0
            params += c.last_param_bytes if k == self.shape.stages - 1 else 0.0
            v = float(params * c.grad_factor / float(min(line[k][1] for line in self.shape.lines)))
            (gbs, copies), n = self._ar_gbs[k], sum(self.shape.replicas) * self.shape.dp(k)
            flat = ring_allreduce_s(v, n, gbs) + (copies * v if n > 1 else 0.0)
            if (groups := self._ar_groups[k]) is not None:
                flat = hierarchical_allreduce_s(v, *groups, gbs, copies)
            self._grad_cache[key] = (v, flat)
        return self._grad_cache[key]

    def split(self, stats: Sequence[LineStats]) -> tuple[int, ...]:
        """Samples per replica, by speed (identical replicas get equal shares, the first ones +1)."""
        fill = [float((s.fwd + s.bwd).sum() + 2 * s.p2p.sum()) for s in stats]
        period = [float(stage_periods(s.fwd, s.bwd, s.p2p).max()) for s in stats]
        return split_samples(self.batch, self.shape.replicas, fill, period, self.shape.micro_batch)

    def score(self, bounds: Sequence[int], below: float = math.inf) -> float:
        """The search's objective: the closed form, or the simulated step when `is_short`; with `below`,
        possibly a lower bound at least it."""
        if not is_short(self.shape, self.batch):
            return self.estimate(bounds, below=below)
        stats = self.line_stats(bounds)
        if stats is None:
            return math.inf
        samples = self.split(stats)
        if sum(self.shape.replicas) <= self.REFINE_REPLICAS:
            samples = self.refine_split(bounds, samples)
        return self.simulate(bounds, samples)

    def refine_split(
        self, bounds: Sequence[int], samples: tuple[int, ...], budget: int | None = None
    ) -> tuple[int, ...]:
        """When `is_short`, move single samples between replicas while the simulated step improves."""
        best = self.simulate(bounds, samples)
        moved = is_short(self.shape, self.batch) and len(samples) > 1
        budget = self.REFINE_SIMULATIONS if budget is None else budget
        split = _Maxima(self.shape.replicas, samples)
        while moved and budget > 0:
            moved = False
            # permutations' order, from replicas holding a sample only (many empty ones: not quadratic)
            count = len(samples)
            for i, j in ((i, j) for i in range(count) if split.samples[i] for j in range(count) if j != i):
                budget -= 1
                split.move(i, j)
                if (value := self._simulate_maxima(bounds, split.maxima)) < best * (1 - 1e-9):
                    best, moved = value, True
                    break
                split.move(j, i)
                if budget <= 0:
                    break
        return tuple(split.samples)

    def _per_line_max(self, samples: Sequence[int]) -> list[int]:
        ends = list(itertools.accumulate(self.shape.replicas, initial=0))
        return [max(samples[a:b], default=0) for a, b in zip(ends, ends[1:])]

    def estimate(
        self, bounds: Sequence[int], samples: Sequence[int] | None = None, below: float = math.inf
    ) -> float:
        """Closed-form step seconds (inf when a stage cannot fit); when the busiest line's 1F1B alone is
        at least `below`, that lower bound without the all-reduces."""
        stats = self.line_stats(bounds)
        if stats is None:
            return math.inf
        samples = self.split(stats) if samples is None else samples
        lines = list(zip(stats, self._per_line_max(samples)))
        totals = [estimate_1f1b(s.fwd, s.bwd, s.p2p, math.ceil(n / self.shape.micro_batch)) for s, n in lines]
        if max(totals) >= below:
            return max(totals)
        tails = self.tail(bounds)
        for (s, n), total, tail in zip(lines, totals, tails):
            drain = np.concatenate(([0.0], np.cumsum(s.bwd + s.p2p)[:-1]))
            tail += np.where(n > 0, total - drain, 0.0)
        return max(float(tail.max()) for tail in tails)

    def simulate(self, bounds: Sequence[int], samples: Sequence[int]) -> float:
        """Simulated step seconds: each line's busiest replica through 1F1B, then the all-reduces."""
        return self._simulate_maxima(bounds, self._per_line_max(samples))

    def _simulate_maxima(self, bounds: Sequence[int], maxima: Sequence[int]) -> float:
        """`simulate` from each line's busiest replica's samples."""
        self.simulations += 1
        key = tuple(bounds)
        if key != self._sim_bounds:
            stats = self.line_stats(bounds)
            self._sim_bounds, self._sim_lines = key, {}
            self._sim_stats = None if stats is None else (stats, self.tail(bounds))
        if self._sim_stats is None:
            return math.inf
        stats, tail = self._sim_stats
        ms = [math.ceil(n / self.shape.micro_batch) for n in maxima]
        for i, m in enumerate(ms):
            if (i, m) not in self._sim_lines:
                self._sim_lines[(i, m)] = float((self._stage_ends(stats[i], m) + tail[i]).max())
        return max(self._sim_lines[(i, m)] for i, m in enumerate(ms))

    def tail(self, bounds: Sequence[int]) -> list[FloatArray]:
        """Per line, each stage's seconds after its last backward: its all-reduce and optimizer step."""
        allreduce = self.allreduce(bounds)
        return [allreduce + self.optimizer_s(i, bounds) for i in range(len(self.shape.lines))]

    def optimizer_s(self, line: int, bounds: Sequence[int]) -> FloatArray:
        """Seconds of each stage's optimizer step on a device of `line` (memory-bound)."""
        c, pre = self.costs, self.costs.prefix["params"]
        edges = np.asarray(bounds)
        weights = pre[edges[1:]] - pre[edges[:-1]]
        weights[0] += c.first_param_bytes
        weights[-1] += c.last_param_bytes
        out: FloatArray = weights * self._step_s[line]
        return out

    def _stage_ends(self, s: LineStats, m: int) -> FloatArray:
        p = len(s.fwd)
        m0 = max(4 * p, self.SIMULATE_OPS // (4 * p))  # past the warm-up: the steady state
        direct = 2 * p * m <= self.SIMULATE_OPS or m <= 2 * m0  # (never more micro-batches than the step's)
        if 2 * p * p * (m if direct else 3 * m0) > self.MOST_SIMULATED_WORK:  # hundreds of stages
            drain = np.concatenate(([0.0], np.cumsum(s.bwd + s.p2p)[:-1]))
            return estimate_1f1b(s.fwd, s.bwd, s.p2p, m) - drain
        if direct:
            return simulate_1f1b(s.fwd, s.bwd, s.p2p, m).stage_end
        e0 = simulate_1f1b(s.fwd, s.bwd, s.p2p, m0).stage_end
        e1 = simulate_1f1b(s.fwd, s.bwd, s.p2p, 2 * m0).stage_end
        return e1 + (e1 - e0) * (m - 2 * m0) / m0  # steady state: equal time per extra micro-batch
