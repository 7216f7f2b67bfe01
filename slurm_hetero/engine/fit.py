"""Memory a transformer needs per device, for inference or training, and which devices hold it.

Pure: `ModelSpec` and numbers in, frozen dataclasses and NumPy arrays out. All sizes are bytes
(GiB = 2**30 bytes in the CLI); FLOPs are floating-point operations (a multiply-add is 2).

Inference (`inference_memory`), per device over `tp` tensor-parallel ranks:

- weights: every parameter at `dtype`; for int8/int4 only the transformer blocks' linear
  weights are quantized (embeddings, norms, biases and the lm_head stay 16-bit, as GPTQ/AWQ and
  bitsandbytes do) and the scales are counted: int8 one fp16 scale per output row, int4 one fp16
  scale and one fp16 zero point per group of 128 weights. Divided by `tp`.
- kv_cache: ``2 (K and V) x layers x kv_heads x head_dim x batch x seq x bytes(kv_dtype)`` with
  ``ceil(kv_heads / tp)`` heads per rank (K/V heads are replicated when tp exceeds them).
  Grouped-query attention enters through `kv_heads`. Encoder-decoder models also cache the
  cross-attention K/V (assumed as long as `seq`).
- workspace: the prefill peak of one layer with fused (flash) attention, no s^2 scores:
  ``batch x seq x (4 h + (q + 2 kv + mlp_out) / tp) x 2`` bytes plus fp32 logits of the last
  position, ``batch x vocab x 4 / tp``.
- overhead: a fixed `overhead_bytes` (default 1 GiB) for the CUDA/ROCm context, library
  workspaces and allocator slack.

Training (`training_memory`), per device with data (`dp`), tensor (`tp`) and pipeline (`pp`)
parallelism; the device holding the largest pipeline stage is reported:

- model states (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models"): with 16-bit mixed precision and Adam, 2 (weights) + 2 (gradients) + 12
  (fp32 master weights, momentum, variance) = 16 bytes per parameter; fp32 training keeps no
  master copy (4 + 4 + 8). SGD keeps a momentum (4 bytes), Adafactor factored second moments
  (about ``4 x (rows + cols)`` per matrix, counted as ``8 / hidden`` bytes per parameter).
  ZeRO-1 divides the optimizer states (with the master weights) by `dp`, ZeRO-2 also the
  gradients, ZeRO-3 also the weights and adds a gather buffer of the largest module's 16-bit
  weights and gradients (``4 x largest_module`` bytes, as DeepSpeed's estimator does).
- activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", arXiv:2205.05198, Section 4): per layer and micro-batch, 16-bit activations,
  ``s b h (34 + 5 a s / h)`` bytes for a GPT layer without recomputation. The 34 is generalized
  term by term: replicated ``10 s b h`` (layer norms 4, the two matmul inputs 2+2, two dropout
  masks 1+1), Q, K, V and the attention output ``2 s b (2 q + 2 kv)`` (GQA shrinks K and V),
  the MLP ``4 s b I`` (ungated: activation input and output) or ``6 s b I`` (gated: gate, up
  and their product) times the experts per token, and the attention core ``5 a s^2 b``.
  With tensor parallelism and sequence parallelism everything is divided by `tp`; without
  sequence parallelism the replicated ``10 s b h`` is not. Selective recomputation drops the
  ``5 a s^2 b`` core; full recomputation keeps only each layer's input ``2 s b h``. With 1F1B
  pipelining the first stage holds `pp` micro-batches of its ``ceil(L / pp)`` layers, i.e.
  about all ``L`` layers' worth; the last stage adds fp32 logits ``4 s b V / tp``.
- overhead as for inference.

`layer_costs` gives the same figures per layer for the pipeline layout solver, and
`device_options` (`engine.fit_options`, re-exported here) turns a breakdown into the device types
of an inventory that can hold it.
`deepspeed_model_states` reproduces DeepSpeed's own estimator, for comparison (docs/fit.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields
from functools import partial

import numpy as np
import numpy.typing as npt

from slurm_hetero.compat import StrEnum

# Re-exported (`X as X`): the device options live in engine.fit_options.
from slurm_hetero.engine.fit_options import DeviceOption as DeviceOption
from slurm_hetero.engine.fit_options import Estimate as Estimate
from slurm_hetero.engine.fit_options import device_options as device_options
from slurm_hetero.engine.fit_options import fits as fits
from slurm_hetero.engine.modelspec import ModelSpec, ParamCounts
from slurm_hetero.errors import ConfigError

GIB = 2**30
MIB = 2**20
DEFAULT_OVERHEAD = 1 * GIB
BYTES_PER_VALUE = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
TRAIN_DTYPES = ("bf16", "fp16", "fp32")
INT4_GROUP = 128
ACT_BYTES = 2  # 16-bit activations

FloatArray = npt.NDArray[np.float64]


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class Optimizer(StrEnum):
    ADAM = "adam"
    SGD = "sgd"
    ADAFACTOR = "adafactor"


@dataclass(frozen=True)
class Breakdown:
    """Memory per device, in bytes, by component. `devices` is how many devices the job spans
    (tp for inference; dp x tp x pp for training). Components a mode does not use stay 0."""

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
        """The components of this mode, in bytes, in display order."""
        names = self._TRAIN if self.mode == "train" else self._INFER
        return {name: float(getattr(self, name)) for name in names}

    @property
    def total(self) -> float:
        """Bytes per device."""
        return float(sum(getattr(self, f.name) for f in fields(self) if f.name not in ("mode", "devices")))

    @property
    def model_states(self) -> float:
        """Weights, gradients, optimizer states and the ZeRO-3 gather buffer (what DeepSpeed's
        estimator calls "params, optim states and gradients")."""
        return self.weights + self.gradients + self.optimizer_states + self.gather_buffer


def _check(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"must be a positive integer, got {value!r}", key_path=name)


def _check_choice(name: str, value: str, choices: Iterable[str]) -> None:
    valid = list(choices)
    if value not in valid:
        raise ConfigError(f"{value!r} is not one of {', '.join(valid)}", key_path=name)


def check_layout(spec: ModelSpec, tp: int = 1, pp: int = 1) -> None:
    """Tensor parallelism splits attention heads, pipeline parallelism layers: `ConfigError` when
    `tp` does not divide the heads or `pp` exceeds the layers."""
    if spec.heads % tp:
        message = f"tp={tp} does not divide the {spec.heads} attention heads of {spec.name}"
        raise ConfigError(message, key_path="tp")
    if pp > spec.total_layers:
        raise ConfigError(f"pp={pp} exceeds the {spec.total_layers} layers of {spec.name}", key_path="pp")


# ------------------------------------------------------------------------------------ inference
def _block_linear_params(p: ParamCounts) -> int:
    return p.attention + p.mlp + p.router


def _weight_bytes(spec: ModelSpec, dtype: str) -> float:
    p = spec.params
    if dtype not in ("int8", "int4"):
        return p.total * BYTES_PER_VALUE[dtype]
    linear = _block_linear_params(p)
    scales = 2.0 / spec.hidden if dtype == "int8" else 4.0 / INT4_GROUP
    return linear * (BYTES_PER_VALUE[dtype] + scales) + (p.total - linear) * 2.0


def kv_cache_bytes(spec: ModelSpec, batch: int, seq: int, kv_dtype: str = "bf16", tp: int = 1) -> float:
    """K and V of every decoder layer for `batch` sequences of `seq` tokens, per tp rank."""
    heads = math.ceil(spec.kv_heads / tp)
    caches = 2 if spec.encoder_layers else 1  # T5 decoders also cache cross-attention K/V
    return 2.0 * spec.layers * caches * heads * spec.head_dim * batch * seq * BYTES_PER_VALUE[kv_dtype]


def _mlp_width(spec: ModelSpec) -> int:
    return spec.experts_per_token * spec.intermediate * (2 if spec.gated_mlp else 1)


def _workspace_bytes(spec: ModelSpec, batch: int, seq: int, tp: int) -> float:
    split = (spec.q_dim + 2 * spec.kv_dim + _mlp_width(spec)) / tp
    per_token = 4 * spec.hidden + split
    return batch * seq * per_token * ACT_BYTES + batch * spec.vocab * 4.0 / tp


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
    _check(batch=batch, seq=seq, tp=tp)
    check_layout(spec, tp)
    _check_choice("dtype", dtype, BYTES_PER_VALUE)
    kv_dtype = kv_dtype or ("bf16" if dtype in ("int8", "int4") else dtype)
    _check_choice("kv_dtype", kv_dtype, BYTES_PER_VALUE)
    return Breakdown(
        mode="infer",
        weights=_weight_bytes(spec, dtype) / tp,
        kv_cache=kv_cache_bytes(spec, batch, seq, kv_dtype, tp),
        workspace=_workspace_bytes(spec, batch, seq, tp),
        overhead=float(overhead_bytes),
        devices=tp,
    )


# ------------------------------------------------------------------------------------- training
def layer_activation_bytes(
    spec: ModelSpec,
    seq: int,
    micro_batch: int,
    tp: int = 1,
    recompute: str = "none",
    sequence_parallel: bool = True,
    cross_attention: bool = False,
) -> float:
    """Activation bytes one layer keeps for the backward pass, per micro-batch and tp rank
    (Korthikanti et al. 2022, generalized to GQA, gated and MoE MLPs; see the module doc)."""
    _check_choice("recompute", recompute, [r.value for r in Recompute])
    sbh = float(seq * micro_batch * spec.hidden)
    unsplit = tp if sequence_parallel else 1
    if recompute == Recompute.FULL:
        return 2 * sbh / unsplit
    attentions = 2 if cross_attention else 1  # a decoder layer of T5 also attends to the encoder
    replicated = (10 + 5 * (attentions - 1)) * sbh  # norm inputs, matmul inputs, dropout masks
    sb = float(seq * micro_batch)
    attention = 2 * sb * (2 * spec.q_dim + 2 * spec.kv_dim)  # Q, K, V, attention output
    mlp = sb * spec.experts_per_token * spec.intermediate * (6 if spec.gated_mlp else 4)
    core = 0.0 if recompute == Recompute.SELECTIVE else 5.0 * spec.heads * seq * seq * micro_batch
    return replicated / unsplit + (attentions * (attention + core) + mlp) / tp


def _stage_params(spec: ModelSpec, pp: int) -> float:
    """Parameters of the largest pipeline stage: its share of layers plus the embedding (first
    stage) or the final norm and lm_head (last stage; a tied head is a copy there when pp > 1)."""
    p = spec.params
    body = p.attention + p.mlp + p.router + p.norms
    ends = p.embedding + p.position_embedding + p.lm_head
    if pp == 1:
        return float(body + ends)
    head = spec.vocab * spec.hidden
    per_layer = body / spec.total_layers
    return per_layer * math.ceil(spec.total_layers / pp) + max(p.embedding + p.position_embedding, head)


def _state_bytes_per_param(dtype: str, optimizer: str, hidden: int) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states incl. fp32 master weights) bytes per parameter."""
    weight = BYTES_PER_VALUE[dtype]
    master = 4.0 if weight < 4 else 0.0
    per_optimizer = {Optimizer.ADAM: 8.0, Optimizer.SGD: 4.0, Optimizer.ADAFACTOR: 8.0 / hidden}
    states = per_optimizer[Optimizer(optimizer)]
    return weight, weight, master + states


def _activations(
    spec: ModelSpec, seq: int, micro_batch: int, tp: int, pp: int, recompute: str, sp: bool
) -> float:
    enc = layer_activation_bytes(spec, seq, micro_batch, tp, recompute, sp) * spec.encoder_layers
    cross = spec.encoder_layers > 0
    dec = layer_activation_bytes(spec, seq, micro_batch, tp, recompute, sp, cross) * spec.layers
    per_layer = (enc + dec) / spec.total_layers
    stage_layers = math.ceil(spec.total_layers / pp)
    logits = 4.0 * seq * micro_batch * spec.vocab / tp
    first = per_layer * stage_layers * pp + (logits if pp == 1 else 0.0)
    last = per_layer * stage_layers + logits
    return max(first, last)


def training_memory(
    spec: ModelSpec,
    dtype: str = "bf16",
    optimizer: str = "adam",
    micro_batch: int = 1,
    seq: int = 2048,
    zero_stage: int = 0,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    recompute: str = "none",
    sequence_parallel: bool = True,
    overhead_bytes: float = DEFAULT_OVERHEAD,
) -> Breakdown:
    """Bytes per device to train `spec` (see the module doc for every term and its source)."""
    _check(micro_batch=micro_batch, seq=seq, dp=dp, tp=tp, pp=pp)
    check_layout(spec, tp, pp)
    _check_choice("dtype", dtype, TRAIN_DTYPES)
    _check_choice("optimizer", optimizer, [o.value for o in Optimizer])
    _check_choice("recompute", recompute, [r.value for r in Recompute])
    if zero_stage not in (0, 1, 2, 3):
        raise ConfigError(f"must be 0, 1, 2 or 3, got {zero_stage!r}", key_path="zero_stage")
    params = _stage_params(spec, pp) / tp
    w, g, o = (params * b for b in _state_bytes_per_param(dtype, optimizer, spec.hidden))
    o = o / dp if zero_stage >= 1 else o
    g = g / dp if zero_stage >= 2 else g
    w = w / dp if zero_stage >= 3 else w
    gather = 2 * BYTES_PER_VALUE[dtype] * spec.params.largest_module / tp if zero_stage == 3 else 0.0
    acts = _activations(spec, seq, micro_batch, tp, pp, recompute, sequence_parallel)
    return Breakdown(
        mode="train",
        weights=w,
        gradients=g,
        optimizer_states=o,
        gather_buffer=gather,
        activations=acts,
        overhead=float(overhead_bytes),
        devices=dp * tp * pp,
    )


DEEPSPEED_FORMULAS = ("0.19", "docs")


def deepspeed_model_states(
    total_params: int, largest_layer_params: int, zero_stage: int, gpus: int, formula: str = "0.19"
) -> int:
    """DeepSpeed's own estimate of GPU bytes for 16-bit params, gradients and Adam states without
    offload, for comparison (docs/fit.md). ZeRO-3 (`estimate_zero3_model_states_mem_needs`):
    ``4 L + 18 P / N``. ZeRO-1/2 (`estimate_zero2_model_states_mem_needs`): ``2 P + 18 P / N`` in
    the code of DeepSpeed 0.19 (`formula="0.19"`), ``4 P + 16 P / N`` in the published
    memory-requirements page and the releases it was written with (`formula="docs"`).
    P = total parameters, L = largest module's parameters, N = GPUs; DeepSpeed truncates with int()."""
    _check(gpus=gpus)
    _check_choice("formula", formula, DEEPSPEED_FORMULAS)
    if zero_stage == 3:
        return 4 * largest_layer_params + int(18 * total_params / gpus)
    if zero_stage in (1, 2) and formula == "docs":
        return 4 * total_params + int(16 * total_params / gpus)
    if zero_stage in (1, 2):
        return 2 * total_params + int(18 * total_params / gpus)
    raise ConfigError(f"DeepSpeed estimates ZeRO stages 1-3, not {zero_stage!r}", key_path="zero_stage")


# ---------------------------------------------------------------------------------- layer costs
@dataclass(frozen=True)
class LayerCosts:
    """Per-layer costs for the pipeline layout solver, in model order: ``embedding``, the
    transformer layers (``layer.N``, or ``encoder.N`` then ``decoder.N``), ``head`` (final norm,
    lm_head and loss). Every array has one entry per name, per tensor-parallel rank:

    - `flops`: forward FLOPs for one micro-batch (backward is about twice that; multiply-add = 2);
      matmuls ``2 x tokens x weights`` with MoE counting the active experts, attention
      ``4 x micro_batch x seq^2 x q_dim`` (full, not causal-halved, as Korthikanti et al. count).
    - `param_bytes`: weights at `dtype` (multiply by the model-state bytes per weight for
      training). A tied lm_head is counted again in ``head``: pipelines keep a copy there.
    - `activation_bytes`: what the layer keeps for backward for one micro-batch
      (`layer_activation_bytes`); ``head`` holds the fp32 logits, ``embedding`` 0.
    """

    names: tuple[str, ...]
    flops: FloatArray
    param_bytes: FloatArray
    activation_bytes: FloatArray


def _layer_flops(spec: ModelSpec, seq: int, micro_batch: int, cross: bool) -> float:
    expert = 3 if spec.gated_mlp else 2
    attn = spec.hidden * (2 * spec.q_dim + 2 * spec.kv_dim)
    matmul = attn * (2 if cross else 1) + spec.experts_per_token * expert * spec.hidden * spec.intermediate
    matmul += spec.hidden * spec.num_experts if spec.is_moe else 0
    scores = 4.0 * micro_batch * seq * seq * spec.q_dim * (2 if cross else 1)
    return 2.0 * seq * micro_batch * matmul + scores


def _layer_rows(spec: ModelSpec) -> list[tuple[str, bool, int]]:
    """(name, has cross-attention, parameters) of each transformer layer, in model order."""
    p = spec.params
    rows = [(f"encoder.{i}", False, p.encoder_per_layer) for i in range(spec.encoder_layers)]
    kind = "decoder" if spec.encoder_layers else "layer"
    return rows + [(f"{kind}.{i}", spec.encoder_layers > 0, p.per_layer) for i in range(spec.layers)]


def layer_costs(
    spec: ModelSpec,
    seq: int,
    micro_batch: int,
    tp: int = 1,
    dtype: str = "bf16",
    recompute: str = "none",
    sequence_parallel: bool = True,
) -> LayerCosts:
    """FLOPs, weight bytes and activation bytes per layer (units and order: see `LayerCosts`)."""
    _check(seq=seq, micro_batch=micro_batch, tp=tp)
    check_layout(spec, tp)
    _check_choice("dtype", dtype, BYTES_PER_VALUE)
    p, wb, tokens = spec.params, BYTES_PER_VALUE[dtype], float(seq * micro_batch)
    rows = _layer_rows(spec)
    names = ("embedding", *(name for name, _, _ in rows), "head")
    flops = [0.0, *(_layer_flops(spec, seq, micro_batch, cross) for _, cross, _ in rows)]
    params = [(p.embedding + p.position_embedding) * wb, *(count * wb for _, _, count in rows)]
    per_layer = partial(layer_activation_bytes, spec, seq, micro_batch, tp, recompute, sequence_parallel)
    acts = [0.0, *(tp * per_layer(cross) for _, cross, _ in rows)]
    flops.append(2.0 * tokens * spec.hidden * spec.vocab)
    params.append(float(spec.vocab * spec.hidden) * wb)
    acts.append(4.0 * tokens * spec.vocab)
    per_rank = (np.asarray(values, dtype=np.float64) / tp for values in (flops, params, acts))
    return LayerCosts(names, *per_rank)
