"""Readers for the model families beyond Llama, GPT-2 and T5 (`engine.modelspec`): OPT, GPT-Neo,
GPT-J, Falcon, Gemma, Gemma 2, Qwen-MoE (qwen2_moe) and DeepSeek (deepseek, deepseek_v2,
deepseek_v3), and `from_hf_config`, which reads any supported config through `READERS` by
`model_type`. Pure: a config dict in, a `ModelSpec` out.

Each is built as its Transformers module allocates it (counts checked against the model cards in
tests/unit/test_modelfamilies.py). What the configs do not say: OPT's position table has 2 extra
rows; GPT-J and Falcon with `parallel_attn` have one LayerNorm per layer (Falcon's new
architecture two); Qwen-MoE's shared expert has a sigmoid gate; DeepSeek's multi-token-prediction
layers are not built by Transformers and not counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from slurm_hetero.core.errors import ConfigError
from slurm_hetero.engine.modelspec import (
    LLAMA_TYPES,
    ModelSpec,
    gpt2_spec,
    llama_spec,
    read_flag,
    read_head_dim,
    read_int,
    read_kv_heads,
    t5_spec,
)

Reader = Callable[[Mapping[str, Any], str], ModelSpec]


def _optional(config: Mapping[str, Any], key: str, name: str) -> int:
    """A count that may be absent, null or 0 (then 0)."""
    return read_int(config, key, name) if config.get(key) else 0


def _opt(config: Mapping[str, Any], name: str) -> ModelSpec:
    hidden, heads = read_int(config, "hidden_size", name), read_int(config, "num_attention_heads", name)
    positions = read_int(config, "max_position_embeddings", name, 2048)
    bias = read_flag(config, name, "enable_bias", True)
    pre_norm = read_flag(config, name, "do_layer_norm_before", True)
    return ModelSpec(
        name=name, family="opt", model_type="opt", hidden=hidden,
        layers=read_int(config, "num_hidden_layers", name), heads=heads, kv_heads=heads,
        head_dim=read_head_dim({}, name, hidden, heads), intermediate=read_int(config, "ffn_dim", name),
        vocab=read_int(config, "vocab_size", name), max_positions=positions,
        tie_embeddings=read_flag(config, name, "tie_word_embeddings", True), gated_mlp=False,
        qkv_bias=bias, o_bias=bias, mlp_bias=bias,
        norm_bias=read_flag(config, name, "layer_norm_elementwise_affine", True),
        final_norm=pre_norm and not read_flag(config, name, "_remove_final_layer_norm", False),
        learned_positions=positions + 2, embed_dim=read_int(config, "word_embed_proj_dim", name, hidden),
    )  # fmt: skip


def _gpt_neo(config: Mapping[str, Any], name: str) -> ModelSpec:
    hidden, heads = read_int(config, "hidden_size", name), read_int(config, "num_heads", name)
    inner = config.get("intermediate_size")
    positions = read_int(config, "max_position_embeddings", name, 2048)
    return ModelSpec(
        name=name, family="gpt_neo", model_type="gpt_neo", hidden=hidden,
        layers=read_int(config, "num_layers", name), heads=heads, kv_heads=heads,
        head_dim=read_head_dim({}, name, hidden, heads),
        intermediate=read_int(config, "intermediate_size", name) if inner is not None else 4 * hidden,
        vocab=read_int(config, "vocab_size", name), max_positions=positions,
        tie_embeddings=read_flag(config, name, "tie_word_embeddings", True), gated_mlp=False,
        qkv_bias=False, o_bias=True, mlp_bias=True, norm_bias=True, learned_positions=positions,
        window=read_int(config, "window_size", name, 256), local_layers=_neo_local_layers(config, name),
    )  # fmt: skip


def _neo_local_layers(config: Mapping[str, Any], name: str) -> tuple[int, ...]:
    """GPT-Neo's local layers: `attention_layers`, else `attention_types` ([[kinds], repeat] pairs)."""
    kinds = config.get("attention_layers")
    if kinds is None:
        try:
            kinds = [
                k
                for pattern, repeat in config.get("attention_types", [])
                for _ in range(repeat)
                for k in pattern
            ]
        except (TypeError, ValueError):
            raise ConfigError("must list [[kinds], repeat] pairs", name, "attention_types") from None
    if not isinstance(kinds, list) or any(k not in ("global", "local") for k in kinds):
        raise ConfigError("must list 'global' or 'local' per layer", name, "attention_layers")
    return tuple(i for i, kind in enumerate(kinds) if kind == "local")


def _gptj(config: Mapping[str, Any], name: str) -> ModelSpec:
    hidden, heads = read_int(config, "n_embd", name), read_int(config, "n_head", name)
    inner = config.get("n_inner")
    return ModelSpec(
        name=name, family="gptj", model_type="gptj", hidden=hidden,
        layers=read_int(config, "n_layer", name), heads=heads, kv_heads=heads,
        head_dim=read_head_dim({}, name, hidden, heads),
        intermediate=read_int(config, "n_inner", name) if inner is not None else 4 * hidden,
        vocab=read_int(config, "vocab_size", name), max_positions=read_int(config, "n_positions", name, 2048),
        tie_embeddings=read_flag(config, name, "tie_word_embeddings", False), gated_mlp=False,
        mlp_bias=True, norm_bias=True, norms_per_layer=1, lm_head_bias=True,
    )  # fmt: skip


def _falcon(config: Mapping[str, Any], name: str) -> ModelSpec:
    # RefinedWeb configs spell n_layer, n_head and n_head_kv
    renamed = {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head", "num_kv_heads": "n_head_kv"}
    config = {
        **config,
        **{k: config[o] for k, o in renamed.items() if config.get(k) is None and config.get(o) is not None},
    }
    hidden, heads = read_int(config, "hidden_size", name), read_int(config, "num_attention_heads", name)
    # RefinedWeb (Falcon-40B's first release) is the new decoder architecture, RefinedWebModel (7B) not
    new = read_flag(config, name, "new_decoder_architecture", config.get("model_type") == "RefinedWeb")
    if new:
        kv_heads = read_kv_heads(config, name, heads, "num_kv_heads")
    else:
        kv_heads = 1 if read_flag(config, name, "multi_query", True) else heads
    parallel = read_flag(config, name, "parallel_attn", True)
    bias = read_flag(config, name, "bias", False)
    inner = config.get("ffn_hidden_size")
    return ModelSpec(
        name=name, family="falcon", model_type="falcon", hidden=hidden,
        layers=read_int(config, "num_hidden_layers", name), heads=heads, kv_heads=kv_heads,
        head_dim=read_head_dim({}, name, hidden, heads),  # transformers derives it, always
        intermediate=read_int(config, "ffn_hidden_size", name) if inner is not None else 4 * hidden,
        vocab=read_int(config, "vocab_size", name),
        max_positions=read_int(config, "max_position_embeddings", name, 2048),
        tie_embeddings=read_flag(config, name, "tie_word_embeddings", True), gated_mlp=False,
        qkv_bias=bias, o_bias=bias, mlp_bias=bias, norm_bias=True,
        norms_per_layer=2 if new or not parallel else 1, fused_qkv=True,
    )  # fmt: skip


def _gemma(config: Mapping[str, Any], name: str) -> ModelSpec:
    model_type = str(config["model_type"])
    tied = {**config, "tie_word_embeddings": read_flag(config, name, "tie_word_embeddings", True)}
    spec = llama_spec(tied, name, model_type)  # Gemma 2's sliding window too (`sliding_window`)
    return spec if model_type == "gemma" else dataclasses.replace(spec, norms_per_layer=4)


def _qwen2_moe(config: Mapping[str, Any], name: str) -> ModelSpec:
    if read_int(config, "decoder_sparse_step", name, 1) != 1 or config.get("mlp_only_layers"):
        raise ConfigError(
            "only configs whose every layer is sparse are supported", name, "decoder_sparse_step"
        )
    dense = {k: v for k, v in config.items() if k not in ("moe_intermediate_size", "num_experts")}
    base = llama_spec({**dense, "model_type": "qwen2"}, name, "qwen2")
    return dataclasses.replace(
        base, family="qwen2_moe", model_type="qwen2_moe",
        intermediate=read_int(config, "moe_intermediate_size", name),
        num_experts=read_int(config, "num_experts", name),
        experts_per_token=read_int(config, "num_experts_per_tok", name),
        shared_intermediate=_optional(config, "shared_expert_intermediate_size", name),
        shared_gate=bool(config.get("shared_expert_intermediate_size")),
    )  # fmt: skip


def _mla(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    rope, nope = read_int(config, "qk_rope_head_dim", name), read_int(config, "qk_nope_head_dim", name)
    q_lora = config.get("q_lora_rank")
    return {
        "kv_lora_rank": read_int(config, "kv_lora_rank", name),
        "q_lora_rank": read_int(config, "q_lora_rank", name) if q_lora is not None else 0,
        "qk_rope_dim": rope,
        "head_dim": rope + nope,
        "v_head_dim": read_int(config, "v_head_dim", name),
    }


def _deepseek(config: Mapping[str, Any], name: str) -> ModelSpec:
    model_type = str(config["model_type"])
    if read_int(config, "moe_layer_freq", name, 1) != 1:
        raise ConfigError("only moe_layer_freq 1 is supported", name, "moe_layer_freq")
    hidden, heads = read_int(config, "hidden_size", name), read_int(config, "num_attention_heads", name)
    expert = read_int(config, "moe_intermediate_size", name)
    layers = read_int(config, "num_hidden_layers", name)
    spec = ModelSpec(
        name=name, family="deepseek", model_type=model_type, hidden=hidden,
        layers=layers, heads=heads, kv_heads=read_kv_heads(config, name, heads),
        head_dim=read_head_dim({}, name, hidden, heads), intermediate=expert,
        vocab=read_int(config, "vocab_size", name),
        max_positions=read_int(config, "max_position_embeddings", name, 4096),
        tie_embeddings=read_flag(config, name, "tie_word_embeddings", False), gated_mlp=True,
        num_experts=read_int(config, "n_routed_experts", name),
        experts_per_token=read_int(config, "num_experts_per_tok", name),
        qkv_bias=read_flag(config, name, "attention_bias", False),
        o_bias=read_flag(config, name, "attention_bias", False),
        shared_intermediate=_optional(config, "n_shared_experts", name) * expert,
        router_bias=model_type == "deepseek_v3",
        dense_layers=min(_optional(config, "first_k_dense_replace", name), layers),
        dense_intermediate=read_int(config, "intermediate_size", name),
    )  # fmt: skip
    return dataclasses.replace(spec, **_mla(config, name)) if model_type != "deepseek" else spec


def _llama(config: Mapping[str, Any], name: str) -> ModelSpec:
    if config.get("moe_intermediate_size") or config.get("shared_expert_intermediate_size"):
        raise ConfigError(
            "shared/fine-grained experts: use model_type qwen2_moe or deepseek_v2",
            name,
            "moe_intermediate_size",
        )
    return llama_spec(config, name, str(config["model_type"]))


READERS: dict[str, Reader] = {
    **dict.fromkeys(LLAMA_TYPES, _llama),
    "gpt2": gpt2_spec,
    "t5": t5_spec,
    "opt": _opt,
    "gpt_neo": _gpt_neo,
    "gptj": _gptj,
    "falcon": _falcon,
    "RefinedWeb": _falcon,
    "RefinedWebModel": _falcon,
    "gemma": _gemma,
    "gemma2": _gemma,
    "qwen2_moe": _qwen2_moe,
    "deepseek": _deepseek,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
}


# Layers a model may have: 50 times the deepest published models (about 200), small enough that
# per-layer tables and the layer split stay bounded.
MAX_LAYERS = 10_000


def from_hf_config(config: Mapping[str, Any], name: str) -> ModelSpec:
    """The `ModelSpec` of a Hugging Face `config.json` (already parsed); a `ConfigError` naming
    the key (and `name`) for anything it cannot take."""
    if not isinstance(config, Mapping):
        raise ConfigError("a config.json must hold a JSON object", name)
    model_type = str(config.get("model_type", "gpt2" if "n_embd" in config else ""))
    if model_type not in READERS:
        supported = ", ".join(sorted(READERS))
        raise ConfigError(
            f"unsupported model_type {model_type!r}; supported: {supported}", name, "model_type"
        )
    spec = READERS[model_type](config, name)
    if spec.total_layers > MAX_LAYERS:
        raise ConfigError(f"{spec.total_layers} layers; at most {MAX_LAYERS:,} are supported", name, "layers")
    if spec.experts_per_token > spec.num_experts:
        raise ConfigError(
            f"{spec.experts_per_token} experts per token but only {spec.num_experts} experts",
            name,
            "num_experts_per_tok",
        )
    return spec
