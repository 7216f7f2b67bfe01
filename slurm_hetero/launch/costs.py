"""The layout solver's inputs from names: a model's per-layer costs and the allocation's device groups.

`layer_costs_for(model, seq)` is a small built-in fallback until the fit engine provides these
figures: a decoder-only transformer described by hidden size, layers, heads, KV heads, FFN size
and vocabulary, with the usual formulas (bf16 weights and activations, flash attention):

- forward FLOPs per layer and sample: ``2 * params_layer * seq + 4 * seq**2 * hidden`` (matmuls
  plus attention scores and values); the head adds ``2 * seq * hidden * vocab`` on the last stage;
- weights 2 bytes per parameter; gradients 1x and Adam state 6x that (fp32 master, m, v);
- activations kept per layer and sample: ``seq * (12 h + 4 kv + 4 heads + 6 ffn)`` bytes for a
  gated (SwiGLU) MLP, ``4 ffn`` for a plain one; a recomputed layer keeps its input, ``2 seq h``;
- the embedding sits on the first stage, the head and its logits (``6 seq vocab`` bytes) on the last.

`device_groups` turns ``[(type, count), ...]`` into `DeviceGroup`s from the catalog: sustained
TFLOPS = bf16 (else fp16) peak x `MFU`, unless a measured figure is given for the type (what
`calibrate` writes); usable memory = capacity x `MEMORY_USABLE`; link = the catalog's
bidirectional interconnect figure halved (one way), PCIe when the catalog has none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from slurm_hetero.devicespec import Catalog, DeviceSpec
from slurm_hetero.engine.schedule import DeviceGroup, LayerCosts
from slurm_hetero.errors import RequestError

MFU = 0.45  # sustained share of the dense bf16/fp16 peak in transformer training (Megatron: 0.4-0.55)
MEMORY_USABLE = 0.9  # the rest: runtime context, communication buffers, fragmentation
PCIE_GBS = 25.0  # PCIe 4.0 x16, one way
BYTES = 2  # bf16


@dataclass(frozen=True)
class TransformerShape:
    """A decoder-only transformer, as its config describes it."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    context: int
    gated: bool = True
    learned_positions: bool = False

    @property
    def layer_params(self) -> int:
        kv = self.kv_heads * self.hidden // self.heads
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * kv
        return attention + (3 if self.gated else 2) * self.hidden * self.ffn + 2 * self.hidden


MODELS: dict[str, TransformerShape] = {
    "llama-3-8b": TransformerShape(4096, 32, 32, 8, 14336, 128256, 8192),
    "llama-2-7b": TransformerShape(4096, 32, 32, 32, 11008, 32000, 4096),
    "llama-2-13b": TransformerShape(5120, 40, 40, 40, 13824, 32000, 4096),
    "llama-3-70b": TransformerShape(8192, 80, 64, 8, 28672, 128256, 8192),
    "gpt2": TransformerShape(768, 12, 12, 12, 3072, 50257, 1024, gated=False, learned_positions=True),
}


def model_shape(model: str) -> TransformerShape:
    """The shape of `model`: built in, else any model the fit engine reads (a bundled name or a
    Hugging Face config.json path), so plan, launch and fit describe models the same way."""
    if model in MODELS:
        return MODELS[model]
    from slurm_hetero.modelconfigs import load_model

    spec = load_model(model)
    if spec.encoder_layers or spec.num_experts > 1:
        raise RequestError(model, "the layout solver handles dense decoder-only models (no MoE, no encoder)")
    return TransformerShape(
        spec.hidden,
        spec.layers,
        spec.heads,
        spec.kv_heads,
        spec.intermediate,
        spec.vocab,
        spec.max_positions,
        gated=spec.gated_mlp,
        learned_positions=spec.family == "gpt2",
    )


def transformer_costs(shape: TransformerShape, seq: int, micro_batch: int = 1) -> LayerCosts:
    """Per-layer costs of `micro_batch` sequences of `seq` tokens (the solver's unit of batch)."""
    h, s, v, b = shape.hidden, seq, shape.vocab, micro_batch
    kv = shape.kv_heads * h // shape.heads
    per_token = 12 * h + 4 * kv + 4 * shape.heads + (6 if shape.gated else 4) * shape.ffn
    ones = np.ones(shape.layers)
    embedding = BYTES * h * (v + (shape.context if shape.learned_positions else 0))
    return LayerCosts(
        flops=ones * b * (2.0 * shape.layer_params * s + 4.0 * s * s * h),
        param_bytes=ones * BYTES * shape.layer_params,
        act_bytes=ones * b * s * per_token,
        ckpt_bytes=ones * b * BYTES * s * h,
        boundary_bytes=float(b * BYTES * s * h),
        last_flops=2.0 * b * s * h * v,
        first_param_bytes=float(embedding),
        last_param_bytes=float(BYTES * h * (v + 1)),
        last_act_bytes=float(b * s * v * 6),
    )


def layer_costs_for(model: str, seq: int, micro_batch: int = 1) -> LayerCosts:
    """Costs of a named model (see `MODELS`) for micro-batches of `micro_batch` sequences."""
    shape = model_shape(model)
    if not 1 <= seq <= shape.context:
        raise RequestError(f"--seq {seq}", f"{model} takes 1 to {shape.context} tokens")
    return transformer_costs(shape, seq, micro_batch)


def device_tflops(spec: DeviceSpec, measured: Mapping[str, float], mfu: float = MFU) -> float:
    """Sustained TFLOPS of one device on this model: measured, else the catalog peak x `mfu`."""
    if spec.type in measured:
        return float(measured[spec.type])
    peak = spec.bf16_tflops if spec.bf16_tflops is not None else spec.fp16_tflops
    if peak is None:
        raise RequestError(
            spec.type,
            f"the catalog has no bf16/fp16 TFLOPS for it; pass --measured FILE "
            f"with a line '{spec.type}: TFLOPS'",
        )
    return peak * mfu


def device_groups(
    devices: Sequence[tuple[str, int]],
    catalog: Catalog,
    measured: Mapping[str, float] | None = None,
    per_node: int = 8,
    mfu: float = MFU,
) -> tuple[DeviceGroup, ...]:
    """One group per device type (counts of repeated types added, first appearance order), on
    nodes of `per_node` devices (the last node takes the rest)."""
    counts: dict[str, int] = {}
    specs: dict[str, DeviceSpec] = {}
    for name, count in devices:
        spec = catalog.by_type(name)
        if spec is None:
            raise RequestError(name, f"unknown device type; known: {', '.join(catalog.types())}")
        specs[spec.type] = spec
        counts[spec.type] = counts.get(spec.type, 0) + count
    rates = {_canonical(catalog, k): float(v) for k, v in (measured or {}).items()}
    return tuple(_group(specs[t], n, rates, per_node, mfu) for t, n in counts.items())


def _canonical(catalog: Catalog, name: str) -> str:
    spec = catalog.by_type(name)
    return spec.type if spec else name


def _group(
    spec: DeviceSpec, count: int, measured: Mapping[str, float], per_node: int, mfu: float
) -> DeviceGroup:
    full, rest = divmod(count, per_node)
    nodes = (per_node,) * full + ((rest,) if rest else ())
    link = spec.interconnect_gbs / 2 if spec.interconnect_gbs else PCIE_GBS
    memory = spec.memory_gib * 2**30 * MEMORY_USABLE
    return DeviceGroup(spec.type, nodes, device_tflops(spec, measured, mfu), memory, link)
