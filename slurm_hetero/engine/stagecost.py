"""What one pipeline stage costs: the model's per-layer costs, the device groups, and the time and
memory of a stage over any range of layers. Pure numpy; what it counts: docs/plan.md, "What the
step time counts".
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from slurm_hetero.core.compat import StrEnum
from slurm_hetero.engine.modelcost import (
    AUTO,
    BYTES_PER_VALUE,
    LayerTable,
    Recompute,
    gradient_copies,
    optimizer_step_bytes,
    zero_divisors,
)

FloatArray = npt.NDArray[np.float64]
GB = 1e9
TFLOPS = 1e12
REFERENCE_ELEMENTS = 4096.0 * 4096.0  # b x s x h/tp of the shape sustained TFLOPS are quoted at
DEFAULT_GEMM_HALF = 2.0 * 2**20  # an A100's elements at half speed (docs/plan.md)
A100_RIDGE = 312e12 / 2039e9
DEFAULT_MEMORY_GBS = 2039.0  # an A100's, where the catalog has no figure


def _frozen(values: npt.ArrayLike, name: str) -> FloatArray:
    array = np.array(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0 or not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(f"{name} must be a non-empty 1-d array of finite non-negative numbers")
    array.setflags(write=False)  # the prefix sums are cached
    return array


class Checkpointing(StrEnum):
    """Which layers the solver may recompute whole: the fewest that make a stage fit, none, or all."""

    AS_NEEDED = "as-needed"
    NEVER = "never"
    ALL = "all"


CHECKPOINTING = {
    AUTO: Checkpointing.AS_NEEDED,
    Recompute.NONE: Checkpointing.NEVER,
    Recompute.SELECTIVE: Checkpointing.NEVER,
    Recompute.FULL: Checkpointing.ALL,
}


@dataclass(frozen=True, eq=False)
class LayerCosts:
    """Per-layer costs of a model for one sample (one sequence of the training length).

    `param_bytes`: weights (gradients `grad_factor` times that, optimizer state `optimizer_factor`
    times); `ckpt_bytes`: what a recomputed layer keeps of `act_bytes`. `first_*` / `last_*`: the
    embedding and the head; `tied_param_bytes` is in both and held once by a stage with both.
    `extra_bwd_flops`: forward FLOPs every layer redoes in backward (selective recomputation)."""

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
    zero_stage: int = 1
    checkpointing: Checkpointing = Checkpointing.AS_NEEDED
    extra_bwd_flops: FloatArray | None = None
    tied_param_bytes: float = 0.0
    gather_bytes: float = 0.0
    overhead_bytes: float = 0.0
    value_bytes: float = 2.0  # bytes of one activation value (`boundary_bytes` is seq x hidden of them)
    step_factor: float = 0.0  # memory traffic of the optimizer step per weight byte (0: not priced)

    def __post_init__(self) -> None:
        if self.extra_bwd_flops is None:
            object.__setattr__(self, "extra_bwd_flops", np.zeros(np.size(self.flops)))
        for name in ("flops", "param_bytes", "act_bytes", "ckpt_bytes", "extra_bwd_flops"):
            object.__setattr__(self, name, _frozen(getattr(self, name), name))
        sizes = {getattr(self, n).size for n in ("flops", "param_bytes", "act_bytes", "ckpt_bytes")}
        if len(sizes | {self.extra.size}) != 1:
            raise ValueError("flops, param_bytes, act_bytes and ckpt_bytes must have one entry per layer")
        if np.any(self.ckpt_bytes > self.act_bytes):
            raise ValueError("ckpt_bytes must not exceed act_bytes")

    @classmethod
    def from_table(cls, table: LayerTable) -> LayerCosts:
        """The solver's costs from the table of one sample: its first and last rows become the extras."""
        if table.micro_batch != 1 or table.tp != 1:
            raise ValueError(
                "the solver scales one sample over micro-batches and tp: use micro_batch=1, tp=1"
            )
        s, (w, g, o) = table.settings, table.state_per_param
        params, acts = table.param_bytes, table.activation_bytes
        return cls(
            flops=table.flops[1:-1],
            param_bytes=params[1:-1],
            act_bytes=acts[1:-1],
            ckpt_bytes=table.checkpoint_bytes[1:-1],
            boundary_bytes=table.boundary_bytes,
            first_flops=float(table.flops[0]),
            last_flops=float(table.flops[-1]),
            first_param_bytes=float(params[0]),
            last_param_bytes=float(params[-1]),
            last_act_bytes=float(acts[-1]),
            grad_factor=g / w,
            optimizer_factor=o / w,
            zero_stage=s.zero_stage,
            checkpointing=CHECKPOINTING[s.recompute],
            extra_bwd_flops=table.recompute_flops[1:-1],
            tied_param_bytes=table.tied_params * w,
            gather_bytes=table.gather_bytes,
            overhead_bytes=s.overhead_bytes,
            value_bytes=BYTES_PER_VALUE[s.dtype],
            step_factor=optimizer_step_bytes(s.dtype, s.optimizer) / w,
        )

    @property
    def extra(self) -> FloatArray:
        assert self.extra_bwd_flops is not None
        return self.extra_bwd_flops

    @property
    def layers(self) -> int:
        return int(self.flops.size)

    @property
    def elements_per_sample(self) -> float:
        """seq x hidden: the activation matrix of one sample."""
        return self.boundary_bytes / self.value_bytes

    @cached_property  # the search's bounds ask for it at every shape
    def step_flops_per_sample(self) -> float:
        """FLOPs of one sample's step, with the recomputation the settings impose, none the solver's."""
        forward = float(self.flops.sum()) + self.first_flops + self.last_flops
        recomputed = float(self.flops.sum()) if self.checkpointing == Checkpointing.ALL else 0.0
        return 3.0 * forward + float(self.extra.sum()) + recomputed

    def state_factor(self, dp: int) -> float:
        """Bytes of weights, gradients and optimizer state per weight byte on one of `dp` replicas."""
        w, g, o = zero_divisors(self.zero_stage, dp)
        return 1.0 / w + self.grad_factor * gradient_copies(self.zero_stage) / g + self.optimizer_factor / o

    def model_state_bytes(self, dp: int) -> float:
        """Weights, gradients and optimizer state of the whole model on one of `dp` replicas."""
        params = float(self.param_bytes.sum()) + self.first_param_bytes + self.last_param_bytes
        return params * self.state_factor(dp)

    @cached_property
    def prefix(self) -> dict[str, FloatArray]:
        """Prefix sums (length layers + 1) of the per-layer arrays."""
        savings = self.act_bytes - self.ckpt_bytes
        sums = {
            "flops": self.flops,
            "params": self.param_bytes,
            "acts": self.act_bytes,
            "savings": savings if self.checkpointing != Checkpointing.NEVER else np.zeros_like(savings),
            "extra": self.extra,
        }
        return {k: np.concatenate(([0.0], np.cumsum(v))) for k, v in sums.items()}


@dataclass(frozen=True)
class DeviceGroup:
    """Devices of one type in the allocation, `per_node` in Slurm's rank order; `tflops` is what one device
    sustains on this model, `memory_bytes` what a job may use, `link_gbs` inside a node (one way)."""

    type: str
    per_node: tuple[int, ...]
    tflops: float
    memory_bytes: float
    link_gbs: float
    gemm_half: float = 0.0  # GEMM elements at half speed (`gemm_efficiency`); 0: size does not matter
    nic_gbs: float = 0.0  # this type's share of its node's network, GB/s one way; 0: the spec's figure
    price_per_hour: float = 0.0  # USD per device-hour (the cost objective); 0: unknown
    vendor: str = ""  # whose collective library it runs; "": a vendor of its own
    # `--measured` shapes: (tp, micro_batch, TFLOPS one device sustains, tp all-reduces included)
    speeds: tuple[tuple[int, float, float], ...] = ()
    memory_gbs: float = 0.0  # device memory bandwidth, GB/s (the optimizer step); 0: DEFAULT_MEMORY_GBS

    def __post_init__(self) -> None:
        if not self.per_node or min(self.per_node) < 1:
            raise ValueError(f"{self.type}: per_node must list at least one positive count")
        if self.tflops <= 0 or self.memory_bytes <= 0 or self.link_gbs <= 0:
            raise ValueError(f"{self.type}: tflops, memory_bytes and link_gbs must be positive")
        if self.gemm_half < 0 or self.nic_gbs < 0 or self.price_per_hour < 0:
            raise ValueError(f"{self.type}: gemm_half, nic_gbs and price_per_hour must be >= 0")

    @property
    def count(self) -> int:
        return sum(self.per_node)

    @property
    def node_size(self) -> int:
        return max(self.per_node)

    @property
    def bandwidth_gbs(self) -> float:
        return self.memory_gbs or DEFAULT_MEMORY_GBS


def gemm_efficiency(half: float, elements: float) -> float:
    """GEMM speed at `elements` relative to `REFERENCE_ELEMENTS` (no faster beyond it)."""
    if half <= 0:
        return 1.0
    return min(1.0, (elements / (elements + half)) / (REFERENCE_ELEMENTS / (REFERENCE_ELEMENTS + half)))


def measured_shape(speeds: Sequence[tuple[int, float, float]], tp: int, b: float) -> tuple[float, str] | None:
    """TFLOPS per device at degree `tp` and micro-batch `b` from measured points of that degree, and
    how it was found (docs/plan.md, "Measured speeds"); None when the degree has none."""
    points = sorted((m, r) for t, m, r in speeds if t == tp)
    if not points:
        return None
    for m, r in points:
        if abs(m - b) <= 1e-9 * m:
            return r, "measured"
    i = bisect.bisect_left([m for m, _ in points], b)
    if i == 0 or i == len(points):
        return points[min(i, len(points) - 1)][1], "extrapolated"
    (m0, r0), (m1, r1) = points[i - 1], points[i]
    t0, t1 = m0 / r0, m1 / r1  # seconds per micro-batch, per FLOP unit
    return b / (t0 + (t1 - t0) * (b - m0) / (m1 - m0)), "interpolated"


def fallback_degree(speeds: Sequence[tuple[int, float, float]], tp: int) -> int:
    """The measured degree whose speed a degree without points takes: the nearest lower, else the least."""
    degrees = sorted({t for t, _, _ in speeds})
    return max((t for t in degrees if t < tp), default=degrees[0])


def device_rate(group: DeviceGroup, tp: int, b: float, elements_per_sample: float) -> tuple[float, bool]:
    """TFLOPS one device of `group` sustains in a stage of `tp` devices at micro-batch `b`, and whether
    it includes the tensor-parallel all-reduces (a measured shape does)."""

    def curve(degree: int) -> float:
        return gemm_efficiency(group.gemm_half, b * elements_per_sample / degree)

    if not group.speeds:
        return group.tflops * curve(tp), False
    found = measured_shape(group.speeds, tp, b)
    if found is not None:
        return found[0], True
    base = fallback_degree(group.speeds, tp)
    found = measured_shape(group.speeds, base, b)
    assert found is not None
    return found[0] * (curve(tp) / curve(base)), False


def peak_rate(group: DeviceGroup, elements: float) -> float:
    """The most TFLOPS one device of `group` sustains alone at any shape up to `elements`."""
    if group.speeds:
        return max(r for _, _, r in group.speeds)
    return group.tflops * gemm_efficiency(group.gemm_half, elements)


def default_gemm_half(peak_tflops: float | None, bandwidth_gbs: float | None) -> float:
    """`DEFAULT_GEMM_HALF` scaled by the device's ridge point (unscaled when the catalog lacks a figure)."""
    if not peak_tflops or not bandwidth_gbs:
        return DEFAULT_GEMM_HALF
    return DEFAULT_GEMM_HALF * (peak_tflops * 1e12 / (bandwidth_gbs * 1e9)) / A100_RIDGE


RING_STEP_S = 2e-6  # seconds each ring step costs beyond its bytes (the alpha of the alpha-beta model)


def ring_allreduce_s(nbytes: float, ranks: int, gbs: float) -> float:
    """Seconds for a ring all-reduce of `nbytes` over `ranks` ranks at `gbs` GB/s."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (ranks - 1) * (nbytes / ranks / (gbs * GB) + RING_STEP_S)


def hierarchical_allreduce_s(
    nbytes: float,
    sizes: Sequence[int],
    local_gbs: Sequence[float],
    cross_gbs: float,
    cross_copy_s: float = 0.0,
) -> float:
    """Seconds for an all-reduce over groups of `sizes` ranks: reduce-scatter inside each group, an
    all-reduce of each shard among one rank per group at `cross_gbs` (the largest shard also paying
    `cross_copy_s` per byte, a cpu-relay's copies), all-gather inside each group."""
    if len(sizes) <= 1 or nbytes <= 0:
        return ring_allreduce_s(nbytes, sum(sizes), min(local_gbs, default=cross_gbs))
    local = max(ring_allreduce_s(nbytes, n, gbs) for n, gbs in zip(sizes, local_gbs))
    shard = nbytes / min(sizes)
    return local + ring_allreduce_s(shard, len(sizes), cross_gbs) + cross_copy_s * shard


@dataclass(frozen=True)
class StageSite:
    """Where a pipeline stage runs and what it must hold, everything but its layer range."""

    group: DeviceGroup
    tp: int
    dp: int
    in_flight: int
    micro_batch: float  # samples per device and micro-batch (staged: the busiest rank's ceil(M / dp))
    first: bool
    last: bool


class StageModel:
    """Seconds per micro-batch and bytes per device of one site over layers `[a, e)`, `r` recomputed."""

    NEED_STARTS = 64  # starts whose `_needs` are kept
    FIT_RANGES = 65_536  # ranges whose `fits` figure is kept (a search asks at many budgets)

    def __init__(self, costs: LayerCosts, site: StageSite) -> None:
        self.costs, self.site, g, pre = costs, site, site.group, costs.prefix
        state = costs.state_factor(site.dp)
        tied = costs.tied_param_bytes * (site.first and site.last)
        extra_params = costs.first_param_bytes * site.first + costs.last_param_bytes * site.last - tied
        b, tp = site.micro_batch, site.tp
        self.all = costs.checkpointing == Checkpointing.ALL
        rate, measured = device_rate(g, tp, b, costs.elements_per_sample)
        self.alpha = b / (tp * rate * TFLOPS)
        self.comm = 0.0 if measured else ring_allreduce_s(b * costs.boundary_bytes, tp, g.link_gbs)
        self.extra_flops = costs.first_flops * site.first + costs.last_flops * site.last
        self.mu_a = site.in_flight * b / tp
        fixed = costs.gather_bytes / tp + costs.overhead_bytes
        self.base_mem = state * extra_params / tp + b * costs.last_act_bytes * site.last / tp + fixed
        self.transient = b * float(costs.act_bytes.max()) / tp
        self.capacity = g.memory_bytes
        idx = np.arange(costs.layers + 1)
        self._time_array = self.alpha * (3 * pre["flops"] + pre["extra"]) + 4 * self.comm * idx
        self._mem_array = state / tp * pre["params"] + self.mu_a * pre["acts"]
        self._time, self._mem = self._time_array.tolist(), self._mem_array.tolist()
        self._savings = pre["savings"].tolist()
        self._need: dict[int, tuple[int, list[float]]] = {}
        self._fit: dict[tuple[int, int], float] = {}

    def times(self, a: int, e: int, r: int) -> tuple[float, float]:
        f, x = self.costs.prefix["flops"], self.costs.prefix["extra"]
        work = self.alpha * (f[e] - f[a] + self.extra_flops)
        fwd = work + 2 * self.comm * (e - a)
        bwd = 2 * work + self.alpha * (f[a + r] - f[a] + x[e] - x[a]) + 2 * self.comm * (e - a + r)
        return float(fwd), float(bwd)

    def memory(self, a: int, e: int, r: int) -> float:
        saved = self.mu_a * (self._savings[a + r] - self._savings[a])
        return float(self.base_mem + self._mem[e] - self._mem[a] - saved + (self.transient if r else 0.0))

    def recompute(self, a: int, e: int) -> int:
        """Fewest layers of `[a, e)` to recompute so it fits (all if the costs say); `e - a + 1`: none do."""
        held = self.base_mem + self._mem[e] - self._mem[a]
        if self.all:
            kept = held - self.mu_a * (self._savings[e] - self._savings[a]) + self.transient
            return e - a if kept <= self.capacity or e == a else e - a + 1
        if held <= self.capacity:
            return 0
        short = (held + self.transient - self.capacity) / self.mu_a
        r = bisect.bisect_left(self._savings, self._savings[a] + short, a, e + 1) - a
        return min(r, e - a + 1)

    def _recompute_all(self, a: int, ends: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        mem, savings = self._mem_array, self.costs.prefix["savings"]
        held = self.base_mem + mem[ends] - mem[a]
        if self.all:
            kept = held - self.mu_a * (savings[ends] - savings[a]) + self.transient
            over: npt.NDArray[np.int64] = (kept > self.capacity).astype(np.int64)
            return ends - a + over
        short = (held + self.transient - self.capacity) / self.mu_a
        r = np.where(held <= self.capacity, 0, np.searchsorted(savings, savings[a] + short, side="left") - a)
        return np.minimum(r, ends - a + 1).astype(np.int64)

    def fits(self, a: int, e: int, budget: float) -> bool:
        """Whether `[a, e)` fits in memory (recomputing as needed) with fwd + bwd <= `budget`."""
        need = self._fit.get((a, e))
        if need is None:
            need = self._fit[(a, e)] = self._fit_need(a, e)
            if len(self._fit) > self.FIT_RANGES:
                self._fit.clear()
        return need <= budget  # NaN (no fit) is under no budget

    def _fit_need(self, a: int, e: int) -> float:
        """fwd + bwd of `[a, e)` with the recomputation it needs; NaN when nothing makes it fit."""
        r = self.recompute(a, e)
        if r > e - a:
            return math.nan
        f = self.costs.prefix["flops"]
        extra = self.alpha * (3 * self.extra_flops + f[a + r] - f[a]) + 2 * self.comm * r
        return float(self._time[e] - self._time[a] + extra)

    def max_end(self, a: int, limit: int, budget: float) -> int:
        """Largest `e <= limit` whose range `[a, e)` fits in memory with fwd + bwd <= `budget` (else `a`)."""
        goal = self._time[a] + budget - 3 * self.alpha * self.extra_flops
        e = bisect.bisect_right(self._time, goal, a + 1, limit + 1) - 1
        if e == a or (not self.all and self.base_mem + self._mem[e] - self._mem[a] <= self.capacity):
            return e
        fitting, need = self._needs(a, e)
        return a + min(fitting, bisect.bisect_right(need, budget, 0, e - a))

    def _needs(self, a: int, e: int) -> tuple[int, list[float]]:
        """For the ranges `[a, a + 1)` ... `[a, e)`: how many leading ones fit in memory, and the running
        maximum of their fwd + bwd, kept per start (the balanced split asks at many budgets)."""
        found = self._need.get(a)
        if found is None or len(found[1]) < e - a:
            ends = np.arange(a + 1, e + 1)
            r = self._recompute_all(a, ends)
            rr = np.minimum(r, ends - a)
            f = self.costs.prefix["flops"]
            extra = self.alpha * (3 * self.extra_flops + f[a + rr] - f[a]) + 2 * self.comm * rr
            over = np.flatnonzero(r > ends - a)
            need = np.maximum.accumulate(self._time_array[ends] - self._time[a] + extra)
            if len(self._need) >= self.NEED_STARTS:
                self._need.clear()
            found = self._need[a] = (int(over[0]) if over.size else int(ends.size), need.tolist())
        return found
