"""What each layer of a transformer costs to train: the one source `engine.fit` and the layout
solver both read, so they count every byte and FLOP the same way (formulas, sources: docs/fit.md).
Attention FLOPs are full, not causal-halved, as Korthikanti et al. count.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from slurm_hetero.core.compat import StrEnum
from slurm_hetero.core.errors import ConfigError
from slurm_hetero.engine.modelspec import ModelSpec, attention_weights, decoder_layer_params, layer_params

GIB = 2**30
DEFAULT_OVERHEAD = 1 * GIB
BYTES_PER_VALUE = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
TRAIN_DTYPES = ("bf16", "fp16", "fp32")
ACT_BYTES = 2  # 16-bit activations (mixed precision and inference)
AUTO = "auto"  # recompute mode of the layout solver only: whole layers, where memory is short

FloatArray = npt.NDArray[np.float64]


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class Optimizer(StrEnum):
    ADAM = "adam"
    SGD = "sgd"
    ADAFACTOR = "adafactor"


class Attention(StrEnum):
    """`flash`: fused, the s x s scores never stored; `eager`: materialized."""

    FLASH = "flash"
    EAGER = "eager"


DEFAULT_ATTENTION = Attention.FLASH


def check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"must be a positive integer, got {value!r}", key_path=name)


def check_choice(name: str, value: str, choices: Iterable[str]) -> None:
    valid = list(choices)
    if value not in valid:
        raise ConfigError(f"{value!r} is not one of {', '.join(valid)}", key_path=name)


def check_layout(spec: ModelSpec, tp: int = 1, pp: int = 1) -> None:
    """Each tp rank holds kv_heads / tp K/V heads, or one replicated when tp is a multiple of them
    (as Megatron and vLLM do)."""
    if spec.heads % tp:
        message = f"tp={tp} does not divide the {spec.heads} attention heads of {spec.name}"
        raise ConfigError(message, key_path="tp")
    if not spec.is_mla and spec.kv_heads % tp and tp % spec.kv_heads:
        message = f"tp={tp} splits the {spec.kv_heads} kv heads of {spec.name} unevenly"
        raise ConfigError(f"{message} (tp must divide them or be a multiple of them)", key_path="tp")
    if pp > spec.total_layers:
        raise ConfigError(f"pp={pp} exceeds the {spec.total_layers} layers of {spec.name}", key_path="pp")


def usable_tp_sizes(spec: ModelSpec, sizes: Iterable[int]) -> tuple[int, ...]:
    """When `check_layout` accepts none of `sizes`, its error for the smallest."""
    sizes = sorted(set(sizes))
    usable = []
    for tp in sizes:
        with contextlib.suppress(ConfigError):
            check_layout(spec, tp)
            usable.append(tp)
    if not usable and sizes:
        check_layout(spec, sizes[0])
    return tuple(usable)


@dataclass(frozen=True)
class CostSettings:
    """Defaults: `slurm-hetero fit`'s."""

    dtype: str = "bf16"
    optimizer: str = Optimizer.ADAM
    zero_stage: int = 0
    recompute: str = Recompute.NONE
    attention: str = DEFAULT_ATTENTION
    sequence_parallel: bool = True
    overhead_bytes: float = DEFAULT_OVERHEAD

    def __post_init__(self) -> None:
        check_choice("dtype", self.dtype, TRAIN_DTYPES)
        check_choice("optimizer", self.optimizer, [o.value for o in Optimizer])
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise ConfigError(f"must be 0, 1, 2 or 3, got {self.zero_stage!r}", key_path="zero_stage")
        check_choice("recompute", self.recompute, [*(r.value for r in Recompute), AUTO])
        check_choice("attention", self.attention, [a.value for a in Attention])
        if not 0 <= self.overhead_bytes < math.inf:
            raise ConfigError(f"must be >= 0, got {self.overhead_bytes!r}", key_path="overhead")


# What `plan` and `launch` default to: ZeRO-1 (a distributed optimizer, as Megatron and DeepSpeed
# runs use) and whole layers recomputed only where memory is short.
SOLVER_SETTINGS = CostSettings(zero_stage=1, recompute=AUTO)


# ------------------------------------------------------------------------------- the formulas
def state_bytes_per_param(dtype: str, optimizer: str, hidden: int) -> tuple[float, float, float]:
    """Optimizer states include the fp32 master weights; Adafactor's factored second moments are
    about ``8 / hidden``."""
    weight = BYTES_PER_VALUE[dtype]
    master = 4.0 if weight < 4 else 0.0
    per_optimizer = {Optimizer.ADAM: 8.0, Optimizer.SGD: 4.0, Optimizer.ADAFACTOR: 8.0 / hidden}
    return weight, weight, master + per_optimizer[Optimizer(optimizer)]


# 4-byte passes of a torch `foreach` optimizer step per parameter; mixed precision adds the 16-bit
# gradient read and weight copy written. The step is bandwidth-bound.
OPTIMIZER_PASSES = {Optimizer.ADAM: 18, Optimizer.SGD: 8, Optimizer.ADAFACTOR: 18}
MIXED_PRECISION_STEP_BYTES = 12.0


def optimizer_step_bytes(dtype: str, optimizer: str) -> float:
    mixed = MIXED_PRECISION_STEP_BYTES if BYTES_PER_VALUE[dtype] < 4 else 0.0
    return 4.0 * OPTIMIZER_PASSES[Optimizer(optimizer)] + mixed


def gradient_copies(zero_stage: int) -> int:
    """Without ZeRO also the flat buffer gradients are all-reduced through (DDP's buckets); ZeRO's
    fixed buckets (DeepSpeed) or views of one buffer (Megatron) add none."""
    return 2 if zero_stage == 0 else 1


def zero_divisors(zero_stage: int, dp: int) -> tuple[int, int, int]:
    """Divisors of (weights, gradients, optimizer states) on each of `dp` ranks."""
    return (dp if zero_stage >= 3 else 1, dp if zero_stage >= 2 else 1, dp if zero_stage >= 1 else 1)


def layer_activation_bytes(
    spec: ModelSpec,
    seq: int,
    micro_batch: int,
    tp: int = 1,
    recompute: str = "none",
    sequence_parallel: bool = True,
    cross_attention: bool = False,
    attention: str = DEFAULT_ATTENTION,
    value_bytes: float = ACT_BYTES,
) -> float:
    """Bytes one layer keeps for backward, per micro-batch and tp rank (docs/fit.md)."""
    check_choice("recompute", recompute, [r.value for r in Recompute])
    check_choice("attention", attention, [a.value for a in Attention])
    sbh, wide = float(seq * micro_batch * spec.hidden), value_bytes / ACT_BYTES
    unsplit = tp if sequence_parallel else 1
    if recompute == Recompute.FULL:
        return 2 * sbh * wide / unsplit
    attentions = 2 if cross_attention else 1  # a decoder layer of T5 also attends to the encoder
    masks = (1 + attentions) * sbh  # the dropout masks after attention(s) and MLP, a byte each
    replicated = (10 + 5 * (attentions - 1)) * sbh - masks  # norm and matmul inputs
    sb = float(seq * micro_batch)
    projections = 2 * sb * (2 * spec.q_dim + 2 * spec.kv_dim)  # Q, K, V, attention output
    mlp = sb * spec.mlp_width * (6 if spec.gated_mlp else 4)
    if recompute == Recompute.SELECTIVE:
        core = 0.0
    elif attention == Attention.EAGER:  # softmax and dropout outputs and the dropout mask
        core = (4.0 * wide + 1.0) * spec.heads * seq * seq * micro_batch
    else:  # an fp32 log-sum-exp per head and token
        core = 4.0 * spec.heads * seq * micro_batch
    return (replicated * wide + masks) / unsplit + (
        attentions * (projections * wide + core) + mlp * wide
    ) / tp


def attention_core_flops(
    spec: ModelSpec, seq: int, micro_batch: int, cross: bool = False, window: int = 0
) -> float:
    """Forward FLOPs of the scores and their product with the values; `window`: keys per query (0: all)."""
    span = min(seq, window) if window else seq
    return 4.0 * micro_batch * seq * (span + (seq if cross else 0)) * spec.q_dim


def layer_flops(spec: ModelSpec, seq: int, micro_batch: int, cross: bool = False, window: int = 0) -> float:
    """Forward FLOPs of one layer for one micro-batch (no tensor parallelism)."""
    expert = 3 if spec.gated_mlp else 2
    attn = attention_weights(spec)
    matmul = attn * (2 if cross else 1) + expert * spec.hidden * spec.mlp_width
    matmul += spec.hidden * spec.num_experts if spec.is_moe else 0
    return 2.0 * seq * micro_batch * matmul + attention_core_flops(spec, seq, micro_batch, cross, window)


# ------------------------------------------------------------------------------- the table
@dataclass(frozen=True, eq=False)
class LayerTable:
    """Per-layer costs in model order (``embedding``, ``layer.N`` or ``encoder.N`` then
    ``decoder.N``, ``head``), per tp rank and micro-batch (docs/fit.md). A tied lm_head is counted
    again in ``head`` (pipelines keep a copy there); `tied_params` is that copy.
    `checkpoint_bytes` is what a layer keeps under full recomputation; `recompute_flops` what
    selective recomputation redoes; `boundary_bytes` the whole hidden state between stages."""

    names: tuple[str, ...]
    flops: FloatArray
    params: FloatArray
    activation_bytes: FloatArray
    checkpoint_bytes: FloatArray
    recompute_flops: FloatArray
    boundary_bytes: float
    gather_bytes: float
    tied_params: float
    state_per_param: tuple[float, float, float]
    settings: CostSettings
    seq: int
    micro_batch: int
    tp: int

    @property
    def param_bytes(self) -> FloatArray:
        return self.params * self.state_per_param[0]

    @property
    def kept_bytes(self) -> FloatArray:
        full = self.settings.recompute == Recompute.FULL
        return self.checkpoint_bytes if full else self.activation_bytes


Row = tuple[str, bool, int, ModelSpec, int]


def _layer_rows(spec: ModelSpec, flash: bool) -> list[Row]:
    """(name, has cross-attention, parameters, its spec, keys a query attends to (0: all)) of each
    layer. Only fused attention skips what a local layer does not attend to; eager masks it."""
    rows = [(f"encoder.{i}", False, layer_params(spec), spec, 0) for i in range(spec.encoder_layers)]
    cross, kind = spec.encoder_layers > 0, "decoder" if spec.encoder_layers else "layer"
    return rows + [
        (f"{kind}.{i}", cross, n, spec.decoder_layer_spec(i), spec.attention_window(i) * flash)
        for i, n in enumerate(decoder_layer_params(spec))
    ]


def _param_counts(spec: ModelSpec, rows: list[Row]) -> list[float]:
    """The head holds the lm_head (or a tied copy), the final norms and OPT's projections."""
    p, head = spec.params, spec.vocab * spec.embed_width
    ends = p.embedding + p.position_embedding
    rest = p.total - ends - sum(row[2] for row in rows) - p.lm_head  # final norm(s)
    lm_head = p.lm_head or head
    return [float(ends), *(float(row[2]) for row in rows), float(lm_head + rest)]


def layer_table(
    spec: ModelSpec, seq: int, settings: CostSettings | None = None, micro_batch: int = 1, tp: int = 1
) -> LayerTable:
    s = settings or CostSettings()
    check_positive(seq=seq, micro_batch=micro_batch, tp=tp)
    check_layout(spec, tp)
    rows, tokens = _layer_rows(spec, s.attention == Attention.FLASH), float(seq * micro_batch)
    mode = Recompute.NONE if s.recompute in (AUTO, Recompute.FULL) else s.recompute

    value = BYTES_PER_VALUE[s.dtype]  # activations in the training dtype (fp32 keeps 4 bytes)

    def acts(cross: bool, layer: ModelSpec, recompute: str = mode) -> float:
        sp, att = s.sequence_parallel, s.attention
        return layer_activation_bytes(layer, seq, micro_batch, tp, recompute, sp, cross, att, value)

    logits = 4.0 * tokens * spec.vocab / tp
    selective = s.recompute == Recompute.SELECTIVE
    extra = [attention_core_flops(r[3], seq, micro_batch, r[1], r[4]) / tp * selective for r in rows]
    tied = spec.vocab * spec.embed_width / tp if spec.params.lm_head == 0 else 0.0
    flops = [0.0, *(layer_flops(r[3], seq, micro_batch, r[1], r[4]) / tp for r in rows)]
    return LayerTable(
        names=("embedding", *(row[0] for row in rows), "head"),
        flops=_array([*flops, 2.0 * tokens * spec.embed_width * spec.vocab / tp]),
        params=_array(_param_counts(spec, rows)) / tp,
        activation_bytes=_array([0.0, *(acts(r[1], r[3]) for r in rows), logits]),
        checkpoint_bytes=_array([0.0, *(acts(r[1], r[3], Recompute.FULL) for r in rows), logits]),
        recompute_flops=_array([0.0, *extra, 0.0]),
        boundary_bytes=value * tokens * spec.hidden,
        # ZeRO-3's buffer for the largest module's gathered weights and gradients (dtype values)
        gather_bytes=2 * value * spec.params.largest_module / tp if s.zero_stage == 3 else 0.0,
        tied_params=tied,
        state_per_param=state_bytes_per_param(s.dtype, s.optimizer, spec.hidden),
        settings=s,
        seq=seq,
        micro_batch=micro_batch,
        tp=tp,
    )


def _array(values: list[float]) -> FloatArray:
    return np.asarray(values, dtype=np.float64)
