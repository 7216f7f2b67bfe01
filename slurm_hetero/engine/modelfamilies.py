"""Readers of Hugging Face `config.json` files, one per `model_type` (`READERS`): a config dict in,
a `ModelSpec` out, built as the family's Transformers module allocates it (what the config does not
say, such as Qwen2's q/k/v biases, is the module's). DeepSeek's multi-token-prediction layers are
not built by Transformers and not counted."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from slurm_hetero.core.errors import ConfigError
from slurm_hetero.engine.modelspec import ModelSpec

# Any one size in a model config (hidden, vocabulary, positions, heads...): the largest published
# are about 10**7 (positions); far larger ones overflow the float cost model.
MAX_CONFIG_INT = 2**40


def read_int(config: Mapping[str, Any], key: str, name: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        raise ConfigError(f"missing required key {key!r}", name, key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{key} must be a positive integer, got {repr(value)[:40]}", name, key)
    if value > MAX_CONFIG_INT:
        raise ConfigError(f"{key} is {str(value)[:20]}...; at most 2**40 is supported", name, key)
    return value


def read_flag(config: Mapping[str, Any], name: str, key: str, default: bool) -> bool:
    """Absent or null: `default`; the string "false" is refused, not read as true."""
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {repr(value)[:40]}", name, key)
    return value


def _optional(config: Mapping[str, Any], key: str, name: str) -> int:
    return read_int(config, key, name) if config.get(key) else 0


LLAMA_KEYS = {
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "layers": "num_hidden_layers",
    "intermediate": "intermediate_size",
    "max_positions": "max_position_embeddings",
}
GPT_KEYS = {
    "hidden": "n_embd",
    "heads": "n_head",
    "layers": "n_layer",
    "intermediate": "n_inner",
    "max_positions": "n_positions",
}


def _spec(
    config: Mapping[str, Any],
    name: str,
    family: str,
    keys: Mapping[str, str] = LLAMA_KEYS,
    *,
    positions: int | None = 2048,
    tied: bool = True,
    wide: bool = False,
    kv_key: str | None = None,
    **fields: Any,
) -> ModelSpec:
    """The fields every family has, under the family's `keys` (Llama's, updated); `wide`: an absent
    intermediate width is 4 x hidden (GPT-2's n_inner); `fields` set the rest."""
    key = {**LLAMA_KEYS, **keys}
    hidden, heads = read_int(config, key["hidden"], name), read_int(config, key["heads"], name)
    kv_heads = read_int(config, kv_key, name, heads) if kv_key else heads
    if heads % kv_heads:  # grouped-query attention's K/V heads
        raise ConfigError(f"{heads} attention heads are not a multiple of {kv_heads} kv heads", name, kv_key)
    if hidden % heads and "head_dim" not in fields:
        raise ConfigError(f"hidden size {hidden} is not divisible by {heads} heads", name, key["heads"])
    inner = config.get(key["intermediate"])
    common = {
        "name": name,
        "family": family,
        "model_type": family,
        "hidden": hidden,
        "layers": read_int(config, key["layers"], name),
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": hidden // heads,
        "intermediate": 4 * hidden if wide and inner is None else read_int(config, key["intermediate"], name),
        "vocab": read_int(config, "vocab_size", name),
        "max_positions": read_int(config, key["max_positions"], name, positions),
        "tie_embeddings": read_flag(config, name, "tie_word_embeddings", tied),
        "gated_mlp": False,
    }
    return ModelSpec(**{**common, **fields})


def llama_spec(config: Mapping[str, Any], name: str, model_type: str) -> ModelSpec:
    bias = read_flag(config, name, "attention_bias", False)
    own: dict[str, Any] = {}  # Gemma's head width of its own
    if config.get("head_dim") is not None:
        own["head_dim"] = read_int(config, "head_dim", name)
    return _spec(
        config, name, "llama", positions=4096, tied=model_type.startswith("gemma"),
        kv_key="num_key_value_heads", model_type=model_type, gated_mlp=True, **own,
        num_experts=read_int(config, "num_local_experts", name, 1),
        experts_per_token=read_int(config, "num_experts_per_tok", name, 1),
        qkv_bias=bias or model_type == "qwen2", o_bias=bias,
        norms_per_layer=4 if model_type == "gemma2" else 2,
        mlp_bias=read_flag(config, name, "mlp_bias", False), **_sliding_window(config, name, model_type),
    )  # fmt: skip


def _sliding_window(config: Mapping[str, Any], name: str, model_type: str) -> dict[str, Any]:
    """As Transformers applies `sliding_window`: every layer, Qwen2's from `max_window_layers` on
    when `use_sliding_window`, Gemma 2's even ones."""
    if config.get("sliding_window") is None or (
        model_type == "qwen2" and not config.get("use_sliding_window")
    ):
        return {}
    window, layers = read_int(config, "sliding_window", name), read_int(config, "num_hidden_layers", name)
    first = read_int(config, "max_window_layers", name, 0) if model_type == "qwen2" else 0
    step = 2 if model_type == "gemma2" else 1
    return {"window": window, "local_layers": tuple(range(first, layers, step))}


def _gpt2(config: Mapping[str, Any], name: str) -> ModelSpec:
    return _spec(
        config, name, "gpt2", GPT_KEYS, positions=None, wide=True, qkv_bias=True, o_bias=True,
        mlp_bias=True, norm_bias=True, learned_positions=read_int(config, "n_positions", name),
        fused_qkv=True,
    )  # fmt: skip


def _t5(config: Mapping[str, Any], name: str) -> ModelSpec:
    keys = {"hidden": "d_model", "heads": "num_heads", "layers": "num_decoder_layers", "intermediate": "d_ff"}
    encoder = read_int(config, "num_layers", name)  # and the decoder's, unless num_decoder_layers
    return _spec(
        {"num_decoder_layers": encoder, **config}, name, "t5", {**keys, "max_positions": "n_positions"},
        positions=512, encoder_layers=encoder, head_dim=read_int(config, "d_kv", name),
        gated_mlp=str(config.get("feed_forward_proj", "relu")).startswith("gated"),
        relative_buckets=read_int(config, "relative_attention_num_buckets", name, 32),
    )  # fmt: skip


def _opt(config: Mapping[str, Any], name: str) -> ModelSpec:
    bias = read_flag(config, name, "enable_bias", True)
    pre_norm = read_flag(config, name, "do_layer_norm_before", True)
    hidden = read_int(config, "hidden_size", name)
    return _spec(
        config, name, "opt", {"intermediate": "ffn_dim"}, qkv_bias=bias, o_bias=bias, mlp_bias=bias,
        norm_bias=read_flag(config, name, "layer_norm_elementwise_affine", True),
        final_norm=pre_norm and not read_flag(config, name, "_remove_final_layer_norm", False),
        learned_positions=read_int(config, "max_position_embeddings", name, 2048) + 2,
        embed_dim=read_int(config, "word_embed_proj_dim", name, hidden),
    )  # fmt: skip


def _gpt_neo(config: Mapping[str, Any], name: str) -> ModelSpec:
    return _spec(
        config, name, "gpt_neo", {"heads": "num_heads", "layers": "num_layers"}, wide=True,
        o_bias=True, mlp_bias=True, norm_bias=True,
        learned_positions=read_int(config, "max_position_embeddings", name, 2048),
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
    return _spec(
        config, name, "gptj", GPT_KEYS, tied=False, wide=True, mlp_bias=True, norm_bias=True,
        norms_per_layer=1, lm_head_bias=True,
    )  # fmt: skip


def _falcon(config: Mapping[str, Any], name: str) -> ModelSpec:
    # RefinedWeb configs spell n_layer, n_head and n_head_kv
    renamed = {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head", "num_kv_heads": "n_head_kv"}
    config = {
        **config,
        **{k: config[o] for k, o in renamed.items() if config.get(k) is None and config.get(o) is not None},
    }
    # RefinedWeb (Falcon-40B's first release) is the new decoder architecture, RefinedWebModel (7B) not
    new = read_flag(config, name, "new_decoder_architecture", config.get("model_type") == "RefinedWeb")
    multi_query = not new and read_flag(config, name, "multi_query", True)
    parallel = read_flag(config, name, "parallel_attn", True)
    bias = read_flag(config, name, "bias", False)
    spec = _spec(
        config, name, "falcon", {"intermediate": "ffn_hidden_size"}, wide=True,
        kv_key="num_kv_heads" if new else None, qkv_bias=bias, o_bias=bias, mlp_bias=bias,
        norm_bias=True, norms_per_layer=2 if new or not parallel else 1, fused_qkv=True,
    )  # fmt: skip
    return dataclasses.replace(spec, kv_heads=1) if multi_query else spec


def _qwen2_moe(config: Mapping[str, Any], name: str) -> ModelSpec:
    if read_int(config, "decoder_sparse_step", name, 1) != 1 or config.get("mlp_only_layers"):
        raise ConfigError(
            "only configs whose every layer is sparse are supported", name, "decoder_sparse_step"
        )
    base = llama_spec(config, name, "qwen2")
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
    expert = read_int(config, "moe_intermediate_size", name)
    bias = read_flag(config, name, "attention_bias", False)
    spec = _spec(
        config, name, "deepseek", {"intermediate": "moe_intermediate_size"}, positions=4096, tied=False,
        kv_key="num_key_value_heads", model_type=model_type, gated_mlp=True,
        num_experts=read_int(config, "n_routed_experts", name),
        experts_per_token=read_int(config, "num_experts_per_tok", name), qkv_bias=bias, o_bias=bias,
        shared_intermediate=_optional(config, "n_shared_experts", name) * expert,
        router_bias=model_type == "deepseek_v3",
        dense_layers=min(
            _optional(config, "first_k_dense_replace", name), read_int(config, "num_hidden_layers", name)
        ),
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


READERS: dict[str, Callable[[Mapping[str, Any], str], ModelSpec]] = {
    **dict.fromkeys(("llama", "mistral", "qwen2", "phi3", "mixtral", "gemma", "gemma2"), _llama),
    "gpt2": _gpt2,
    "t5": _t5,
    "opt": _opt,
    "gpt_neo": _gpt_neo,
    "gptj": _gptj,
    "falcon": _falcon,
    "RefinedWeb": _falcon,
    "RefinedWebModel": _falcon,
    "qwen2_moe": _qwen2_moe,
    "deepseek": _deepseek,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
}


# Layers a model may have: 50 times the deepest published models (about 200), small enough that
# per-layer tables and the layer split stay bounded.
MAX_LAYERS = 10_000


def from_hf_config(config: Mapping[str, Any], name: str) -> ModelSpec:
    """A `ConfigError` naming the key (and `name`) for anything it cannot take."""
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
