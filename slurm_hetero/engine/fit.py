"""Memory a transformer needs per device (bytes), for inference or training, and which device types
of an inventory hold it with how few devices. Per-layer figures come from `engine.modelcost`, as the
layout solver's do, so `fit` and `plan` agree (docs/fit.md: every formula and its source).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

from slurm_hetero.core.errors import ConfigError
from slurm_hetero.core.model import SlurmNode
from slurm_hetero.engine.modelcost import (
    ACT_BYTES,
    BYTES_PER_VALUE,
    DEFAULT_OVERHEAD,
    CostSettings,
    LayerTable,
    Recompute,
    check_choice,
    check_layout,
    check_positive,
    gradient_copies,
    layer_table,
    zero_divisors,
)
from slurm_hetero.engine.modelspec import ModelSpec
from slurm_hetero.engine.reasons import ReasonCode

INT4_GROUP = 128


@dataclass(frozen=True)
class Breakdown:
    """Memory per device, in bytes, by component; `devices` is how many devices the job spans."""

    mode: str
    weights: float = 0.0
    gradients: float = 0.0
    optimizer_states: float = 0.0
    gather_buffer: float = 0.0
    activations: float = 0.0
    kv_cache: float = 0.0
    workspace: float = 0.0
    overhead: float = 0.0
    devices: int = 1

    _TRAIN = ("weights", "gradients", "optimizer_states", "gather_buffer", "activations", "overhead")
    _INFER = ("weights", "kv_cache", "workspace", "overhead")

    def components(self) -> dict[str, float]:
        names = self._TRAIN if self.mode == "train" else self._INFER
        return {name: float(getattr(self, name)) for name in names}

    @property
    def total(self) -> float:
        return float(sum(getattr(self, f.name) for f in fields(self) if f.name not in ("mode", "devices")))

    @property
    def model_states(self) -> float:
        """DeepSpeed's "params, optim states and gradients"."""
        return self.weights + self.gradients + self.optimizer_states + self.gather_buffer


# ------------------------------------------------------------------------------------ inference
def _weight_bytes(spec: ModelSpec, dtype: str) -> float:
    p = spec.params
    if dtype not in ("int8", "int4"):
        return p.total * BYTES_PER_VALUE[dtype]
    linear = p.attention + p.mlp + p.router
    scales = 2.0 / spec.hidden if dtype == "int8" else 4.0 / INT4_GROUP
    return linear * (BYTES_PER_VALUE[dtype] + scales) + (p.total - linear) * 2.0


def kv_cache_bytes(spec: ModelSpec, batch: int, seq: int, kv_dtype: str = "bf16", tp: int = 1) -> float:
    heads = math.ceil(spec.kv_heads / tp)
    caches = 2 if spec.encoder_layers else 1  # T5 decoders also cache cross-attention K/V
    return 2.0 * spec.layers * caches * heads * spec.head_dim * batch * seq * BYTES_PER_VALUE[kv_dtype]


def _workspace_bytes(spec: ModelSpec, batch: int, seq: int, tp: int) -> float:
    mlp = spec.experts_per_token * spec.intermediate * (2 if spec.gated_mlp else 1)
    split = (spec.q_dim + 2 * spec.kv_dim + mlp) / tp
    return batch * seq * (4 * spec.hidden + split) * ACT_BYTES + batch * spec.vocab * 4.0 / tp


def inference_memory(
    spec: ModelSpec,
    dtype: str = "bf16",
    batch: int = 1,
    seq: int = 2048,
    kv_dtype: str | None = None,
    tp: int = 1,
    overhead_bytes: float = DEFAULT_OVERHEAD,
) -> Breakdown:
    """Bytes per device to serve `batch` sequences of up to `seq` tokens (prompt plus output)."""
    check_positive(batch=batch, seq=seq, tp=tp)
    check_layout(spec, tp)
    check_choice("dtype", dtype, BYTES_PER_VALUE)
    kv_dtype = kv_dtype or ("bf16" if dtype in ("int8", "int4") else dtype)
    check_choice("kv_dtype", kv_dtype, BYTES_PER_VALUE)
    return Breakdown(
        mode="infer",
        weights=_weight_bytes(spec, dtype) / tp,
        kv_cache=kv_cache_bytes(spec, batch, seq, kv_dtype, tp),
        workspace=_workspace_bytes(spec, batch, seq, tp),
        overhead=float(overhead_bytes),
        devices=tp,
    )


# ------------------------------------------------------------------------------------- training
def _stage_params(table: LayerTable, pp: int) -> float:
    """The largest stage's: its layers plus the embedding or the head (a tied head counted once when
    one stage holds both ends)."""
    if pp == 1:
        return float(table.params.sum()) - table.tied_params
    layers = table.params[1:-1]
    return float(layers.mean()) * math.ceil(layers.size / pp) + float(max(table.params[0], table.params[-1]))


def _activations(table: LayerTable, pp: int) -> float:
    """The fullest stage's: under 1F1B the first holds `pp` micro-batches, the last one plus the
    logits; a fully recomputed stage also holds one layer's while recomputing."""
    kept, layers = table.kept_bytes[1:-1], table.activation_bytes[1:-1]
    per_layer, logits = float(kept.mean()), float(table.activation_bytes[-1])
    stage_layers = math.ceil(kept.size / pp)
    transient = float(layers.max()) if table.settings.recompute == Recompute.FULL else 0.0
    first = per_layer * stage_layers * pp + (logits if pp == 1 else 0.0)
    return max(first, per_layer * stage_layers + logits) + transient


def training_memory(
    spec: ModelSpec,
    settings: CostSettings | None = None,
    micro_batch: int = 1,
    seq: int = 2048,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
) -> Breakdown:
    """Bytes per device to train `spec` (docs/fit.md: every term and its source)."""
    settings = settings or CostSettings()
    check_positive(micro_batch=micro_batch, seq=seq, dp=dp, tp=tp, pp=pp)
    check_layout(spec, tp, pp)
    check_choice("recompute", settings.recompute, [r.value for r in Recompute])
    table = layer_table(spec, seq, settings, micro_batch, tp)
    params, shards = _stage_params(table, pp), zero_divisors(settings.zero_stage, dp)
    w, g, o = (params * b / n for b, n in zip(table.state_per_param, shards))
    return Breakdown(
        mode="train",
        weights=w,
        gradients=g * gradient_copies(settings.zero_stage),
        optimizer_states=o,
        gather_buffer=table.gather_bytes,
        activations=_activations(table, pp),
        overhead=float(settings.overhead_bytes),
        devices=dp * tp * pp,
    )


DEEPSPEED_FORMULAS = ("0.19", "docs")


def deepspeed_model_states(
    total_params: int, largest_layer_params: int, zero_stage: int, gpus: int, formula: str = "0.19"
) -> int:
    """DeepSpeed's own estimate of 16-bit model states with Adam and no offload, ZeRO 1-3, for
    comparison (docs/fit.md): `estimate_zero{2,3}_model_states_mem_needs` of DeepSpeed 0.19, or the
    published memory-requirements page (`formula="docs"`)."""
    check_positive(gpus=gpus)
    check_choice("formula", formula, DEEPSPEED_FORMULAS)
    if zero_stage == 3:
        return 4 * largest_layer_params + int(18 * total_params / gpus)
    if zero_stage in (1, 2) and formula == "docs":
        return 4 * total_params + int(16 * total_params / gpus)
    if zero_stage in (1, 2):
        return 2 * total_params + int(18 * total_params / gpus)
    raise ConfigError(f"DeepSpeed estimates ZeRO stages 1-3, not {zero_stage!r}", key_path="zero_stage")


# ------------------------------------------------------------------------------- device options
MIB = 2**20


@dataclass(frozen=True)
class DeviceOption:
    """`memory_bytes` is the type's smallest; `needed` the fewest devices that hold the job (None
    when no count up to the limit does)."""

    type: str
    vendor: str
    memory_bytes: float | None = None
    available: int = 0
    needed: int | None = None
    per_device_bytes: float | None = None
    reason: ReasonCode | None = None

    @property
    def fits(self) -> bool:
        return self.reason is None


def _group_devices(nodes: Sequence[SlurmNode]) -> list[DeviceOption]:
    """One option per type, not yet sized."""
    groups: dict[str, DeviceOption] = {}
    for node in nodes:
        for device in node.devices:
            group = groups.get(device.type) or DeviceOption(device.type, device.vendor.name)
            memory = float(device.memory_mib) * MIB
            smallest = memory if group.memory_bytes is None else min(group.memory_bytes, memory)
            groups[device.type] = replace(
                group, memory_bytes=smallest, available=group.available + node.hosts
            )
        for left_out in node.left_out:
            name = left_out.type or left_out.model
            groups.setdefault(name, DeviceOption(name, left_out.vendor))
    return list(groups.values())


Estimate = Callable[[int], "Breakdown | None"]


def _option(group: DeviceOption, estimate: Estimate, limit: int) -> DeviceOption:
    if group.memory_bytes is None:  # every device of the type is left out: none to count on
        return replace(group, reason=ReasonCode.UNHEALTHY)
    for count in range(1, max(limit, group.available) + 1):
        breakdown = estimate(count)
        if breakdown is not None and breakdown.total <= group.memory_bytes:
            short = ReasonCode.NOT_ENOUGH_DEVICES if count > group.available else None
            return replace(group, needed=count, per_device_bytes=breakdown.total, reason=short)
    return replace(group, reason=ReasonCode.INSUFFICIENT_MEMORY)


def device_options(nodes: Sequence[SlurmNode], estimate: Estimate, limit: int = 1024) -> list[DeviceOption]:
    """Counts tried up to ``max(limit, available)``; `estimate(n)` None: not a valid layout. Fitting
    types first, fewest devices first."""
    options = [_option(g, estimate, limit) for g in _group_devices(nodes)]
    return sorted(options, key=lambda o: (not o.fits, o.needed or math.inf, -(o.memory_bytes or 0.0), o.type))
