"""A transformer's shape (`ModelSpec`) and its exact parameter counts, as the Transformers modules
allocate them (Phi-3's fused qkv and gate_up matrices hold the same numbers as separate ones)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts by component (numbers of parameters, not bytes); `total` counts tied
    matrices once; `active` is what one token uses (MoE)."""

    embedding: int
    position_embedding: int
    attention: int
    mlp: int
    router: int
    norms: int
    lm_head: int
    largest_module: int
    active: int
    projection: int = 0  # OPT's project_in/project_out between a narrower embedding and the layers

    @property
    def total(self) -> int:
        parts = (self.embedding, self.position_embedding, self.attention, self.mlp, self.router, self.norms)
        return sum(parts) + self.lm_head + self.projection


@dataclass(frozen=True)
class ModelSpec:
    """The shape of one transformer. `layers` counts decoder layers; `encoder_layers` is 0 except
    for encoder-decoder models (T5). `intermediate` is the width of one (expert) MLP."""

    name: str
    family: str
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    tie_embeddings: bool
    gated_mlp: bool
    num_experts: int = 1
    experts_per_token: int = 1
    encoder_layers: int = 0
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    relative_buckets: int = 0
    norm_bias: bool = False  # LayerNorm (gain and bias); else RMSNorm (gain only)
    norms_per_layer: int = 2
    final_norm: bool = True
    learned_positions: int = 0  # rows of a learned position table (GPT-2, OPT, GPT-Neo)
    embed_dim: int = 0  # token-table width when it differs from hidden (OPT-350m), else 0
    lm_head_bias: bool = False
    fused_qkv: bool = False  # one qkv module (ZeRO-3's largest-module count)
    shared_intermediate: int = 0  # shared experts' MLP width, used by every token (DeepSeek, Qwen-MoE)
    shared_gate: bool = False  # Qwen-MoE's sigmoid gate on the shared expert (hidden x 1)
    router_bias: bool = False  # DeepSeek-V3's expert-score correction bias
    dense_layers: int = 0  # first layers with a dense MLP instead of experts (first_k_dense_replace)
    dense_intermediate: int = 0
    kv_lora_rank: int = 0  # multi-head latent attention (DeepSeek-V2/V3) when > 0
    q_lora_rank: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    window: int = 0  # tokens a local (sliding-window) attention layer attends to; 0: none
    local_layers: tuple[int, ...] = ()  # decoder layers with local attention (of `window`)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def total_layers(self) -> int:
        return self.encoder_layers + self.layers

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def embed_width(self) -> int:
        return self.embed_dim or self.hidden

    @property
    def mlp_width(self) -> int:
        """MLP width one token goes through in an expert layer: its routed experts and the shared ones."""
        return self.experts_per_token * self.intermediate + self.shared_intermediate

    def dense_view(self) -> ModelSpec:
        return dataclasses.replace(
            self, num_experts=1, experts_per_token=1, intermediate=self.dense_intermediate,
            shared_intermediate=0, shared_gate=False, router_bias=False, dense_layers=0,
        )  # fmt: skip

    def attention_window(self, index: int) -> int:
        return self.window if index in self.local_layers else 0

    def decoder_layer_spec(self, index: int) -> ModelSpec:
        return self.dense_view() if index < self.dense_layers else self

    @property
    def params(self) -> ParamCounts:
        return param_counts(self)


def attention_weights(spec: ModelSpec) -> int:
    """Matmul weights of one attention block (no biases or norms): what a token multiplies by."""
    if spec.is_mla:
        nope = spec.head_dim - spec.qk_rope_dim
        q = (
            spec.hidden * spec.q_dim
            if not spec.q_lora_rank
            else spec.q_lora_rank * (spec.hidden + spec.q_dim)
        )
        kv = spec.hidden * (spec.kv_lora_rank + spec.qk_rope_dim) + spec.kv_lora_rank * spec.heads * (
            nope + spec.v_head_dim
        )
        return q + kv + spec.heads * spec.v_head_dim * spec.hidden
    return spec.hidden * (2 * spec.q_dim + 2 * spec.kv_dim)


def _attention_params(spec: ModelSpec) -> int:
    if spec.is_mla:  # and the RMSNorm gains of kv_a_layernorm, q_a_layernorm
        return attention_weights(spec) + spec.kv_lora_rank + spec.q_lora_rank
    biases = (spec.q_dim + 2 * spec.kv_dim) * spec.qkv_bias + spec.hidden * spec.o_bias
    return attention_weights(spec) + biases


def _expert_mlp_params(spec: ModelSpec, width: int | None = None) -> int:
    matrices = 3 if spec.gated_mlp else 2
    inner = spec.intermediate if width is None else width
    weights = matrices * spec.hidden * inner
    biases = ((matrices - 1) * inner + spec.hidden) if spec.mlp_bias else 0
    return weights + biases


def _mlp_params(spec: ModelSpec) -> int:
    """Every expert of one layer, and its shared experts (one MLP of their summed width) and gate."""
    shared = _expert_mlp_params(spec, spec.shared_intermediate) if spec.shared_intermediate else 0
    return spec.num_experts * _expert_mlp_params(spec) + shared + spec.hidden * spec.shared_gate


def _norm_params(spec: ModelSpec) -> int:
    return 2 * spec.hidden if spec.norm_bias else spec.hidden


def _largest_module(spec: ModelSpec) -> int:
    """DeepSpeed's `largest_layer_params` (what ZeRO-3 gathers at once); Transformers 5 keeps a MoE
    layer's experts in one module."""
    attention = spec.hidden * (spec.q_dim + 2 * spec.kv_dim) if spec.fused_qkv else spec.hidden * spec.q_dim
    mlp = spec.hidden * spec.intermediate + (spec.intermediate if spec.mlp_bias else 0)
    experts = spec.num_experts * _expert_mlp_params(spec) if spec.is_moe else 0
    return max(spec.vocab * spec.hidden, attention, mlp, experts)


def _router_params(spec: ModelSpec) -> int:
    return spec.num_experts * (spec.hidden + spec.router_bias) if spec.is_moe else 0


def layer_params(spec: ModelSpec, cross: bool = False) -> int:
    """One layer as `spec` describes it (an expert layer when MoE); `cross`: a decoder layer of an
    encoder-decoder model, with cross-attention and its norm."""
    layer = (1 + cross) * _attention_params(spec) + _mlp_params(spec) + _router_params(spec)
    return layer + (spec.norms_per_layer + cross) * _norm_params(spec)


def decoder_layer_params(spec: ModelSpec) -> list[int]:
    return [layer_params(spec.decoder_layer_spec(i), spec.encoder_layers > 0) for i in range(spec.layers)]


@cache
def param_counts(spec: ModelSpec) -> ParamCounts:
    """An encoder-decoder model (T5) has a final norm and relative-position bias in each stack."""
    norm, dense, cross = _norm_params(spec), spec.dense_view(), spec.encoder_layers > 0
    moe_layers, width = spec.layers - spec.dense_layers, spec.embed_width
    lm_head = 0 if spec.tie_embeddings else spec.vocab * width + (spec.vocab if spec.lm_head_bias else 0)
    inactive = (spec.num_experts - spec.experts_per_token) * _expert_mlp_params(spec) * moe_layers
    position = spec.learned_positions * spec.hidden + (1 + cross) * spec.relative_buckets * spec.heads
    layer_norms = spec.norms_per_layer * spec.total_layers + cross * spec.layers
    counts = ParamCounts(
        embedding=spec.vocab * width,
        position_embedding=position,
        attention=(spec.total_layers + cross * spec.layers) * _attention_params(spec),
        mlp=(spec.encoder_layers + moe_layers) * _mlp_params(spec) + spec.dense_layers * _mlp_params(dense),
        router=moe_layers * _router_params(spec),
        norms=(layer_norms + (1 + cross) * spec.final_norm) * norm,
        lm_head=lm_head,
        largest_module=_largest_module(spec),
        active=0,
        projection=2 * width * spec.hidden if width != spec.hidden else 0,
    )
    return dataclasses.replace(counts, active=counts.total - inactive)
