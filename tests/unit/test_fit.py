"""The fit engine: parameter counts, memory formulas, DeepSpeed comparison, device options, CLI.

Reference numbers and where they come from:

- Exact parameter totals: each bundled config built with Transformers 5.23 on the meta device,
  counted as ``sum(p.numel() for p in model.parameters())`` (tied weights once); they round to the
  totals the model cards publish (Llama-3-8B 8.03B, Llama-2-7B 6.74B, Mistral-7B 7.24B,
  Mixtral-8x7B 46.7B with 12.9B active, Qwen2-7B 7.6B, GPT-2 124M, ...).
- DeepSpeed: the tables published in DeepSpeed's docs/code-docs/source/memory.rst (t5-3b on one
  node of 8 GPUs; the t5-large worked example on 4 GPUs) and in the Transformers DeepSpeed guide
  (bigscience/T0_3B on 1 and 2 GPUs), plus DeepSpeed 0.19.8's own estimator run for docs/fit.md.

Where and why we differ from DeepSpeed (also in docs/fit.md): our model states follow the ZeRO
paper, 2 (16-bit weights) + 2 (16-bit gradients) + 12 (fp32 master, momentum, variance) bytes per
parameter. DeepSpeed's estimator also counts a 4-byte fp32 copy of the gradients (it converts
the gradient partition to fp32 for the optimizer step): ZeRO-3 ``18 P / N`` (fp32 instead of
16-bit gradients: +2 bytes) and, in DeepSpeed 0.19, ZeRO-2 ``2 P + 18 P / N`` (+4 bytes, on top
of the partitioned 16-bit gradients). The published memory page predates that and shows ZeRO-2
as ``4 P + 16 P / N`` (16-bit gradients not partitioned). The ZeRO-3 gather buffer, 4 bytes per
parameter of the largest module, is DeepSpeed's and ours alike. So the differences are exact:
tests check them to the byte (DeepSpeed truncates with int()), and the published GB figures to
their two printed decimals (0.005 GiB).
"""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_hetero.cli import cli
from slurm_hetero.cli.fit import bundled_names, load_model
from slurm_hetero.core.errors import ConfigError
from slurm_hetero.core.model import ClusterInventory, Device, Health, NodeInventory
from slurm_hetero.engine import fit, modelcost
from slurm_hetero.engine.modelfamilies import from_hf_config
from slurm_hetero.engine.modelspec import ModelSpec
from slurm_hetero.engine.reasons import ReasonCode
from slurm_hetero.engine.stagecost import LayerCosts
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.nodes import slurm_nodes

GIB = 2**30

# (bundled name, exact total from Transformers, published total, its rounding unit)
PARAMS = [
    ("llama-2-7b", 6_738_415_616, 6.74e9, 1e7),
    ("llama-2-13b", 13_015_864_320, 13.0e9, 1e8),
    ("llama-2-70b", 68_976_648_192, 69.0e9, 1e8),
    ("llama-3-8b", 8_030_261_248, 8.03e9, 1e7),
    ("llama-3-70b", 70_553_706_496, 70.6e9, 1e8),
    ("mistral-7b", 7_241_732_096, 7.24e9, 1e7),
    ("mixtral-8x7b", 46_702_792_704, 46.7e9, 1e8),
    ("qwen2-7b", 7_615_616_512, 7.6e9, 1e8),
    ("qwen2-72b", 72_706_203_648, 72.7e9, 1e8),
    ("phi-3-mini", 3_821_079_552, 3.8e9, 1e8),
    ("gpt2", 124_439_808, 124e6, 1e6),
    ("gpt2-xl", 1_557_611_200, 1.56e9, 1e7),
    ("t5-3b", 2_851_598_336, 2851.5e6, 1e6),  # DeepSpeed prints int(P / 1e6): "2851M total params"
    ("t5-large", 737_668_096, 737.67e6, 1e4),  # DeepSpeed memory.rst: "737.67M"
    # the families of engine.modelfamilies (tests/unit/test_modelfamilies.py: counted by hand from
    # the Transformers module layout)
    ("opt-350m", 331_196_416, 331e6, 1e6),
    ("gpt-neo-2.7b", 2_651_307_520, 2.65e9, 1e7),
    ("gpt-j-6b", 6_050_882_784, 6.05e9, 1e7),
    ("falcon-7b", 6_921_720_704, 6.92e9, 1e7),
    ("gemma-2b", 2_506_172_416, 2.51e9, 1e7),
    ("qwen1.5-moe-a2.7b", 14_315_784_192, 14.3e9, 1e8),
    ("deepseek-v2-lite", 15_706_484_224, 15.7e9, 1e8),
]

# bigscience/T0_3B's architecture fields (its config as re-saved by a fine-tune that names it as
# _name_or_path); DeepSpeed ran `AutoModel` = T5Model, which has no lm_head.
T0_3B = {
    "architectures": ["T5ForConditionalGeneration"],
    "d_ff": 5120,
    "d_kv": 64,
    "d_model": 2048,
    "feed_forward_proj": "gated-gelu",
    "model_type": "t5",
    "num_decoder_layers": 24,
    "num_heads": 32,
    "num_layers": 24,
    "relative_attention_num_buckets": 32,
    "tie_word_embeddings": False,
    "vocab_size": 32128,
}


def spec(name: str) -> ModelSpec:
    return load_model(name)


def t0_3b_automodel() -> ModelSpec:
    """T0_3B as DeepSpeed counted it: T5Model (AutoModel) has no lm_head, like a tied head."""
    return from_hf_config({**T0_3B, "tie_word_embeddings": True}, "T0_3B")


# ------------------------------------------------------------------------------ parameter counts
def test_every_bundled_config_is_counted() -> None:
    assert sorted(bundled_names()) == sorted(name for name, *_ in PARAMS)


@pytest.mark.parametrize(("name", "exact", "published", "unit"), PARAMS)
def test_param_counts_match_transformers_and_published_totals(
    name: str, exact: int, published: float, unit: float
) -> None:
    total = spec(name).params.total
    assert total == exact
    assert abs(total - published) <= unit / 2


def test_moe_counts_active_experts_and_router() -> None:
    p = spec("mixtral-8x7b").params
    assert round(p.active / 1e9, 1) == 12.9  # Mistral AI: 12.9B active parameters per token
    assert p.router == 32 * 4096 * 8
    assert p.mlp == 32 * 8 * 3 * 4096 * 14336


def test_gqa_shrinks_k_and_v_and_qwen2_has_qkv_biases() -> None:
    llama3, llama2 = spec("llama-3-8b"), spec("llama-2-7b")
    assert llama3.kv_dim == 1024 and llama2.kv_dim == 4096
    assert llama3.params.attention == 32 * (4096 * 4096 * 2 + 2 * 4096 * 1024)
    qwen = spec("qwen2-7b")
    assert qwen.qkv_bias and not qwen.o_bias
    assert qwen.params.attention == 28 * (2 * 3584 * 3584 + 2 * 3584 * 512 + 3584 + 2 * 512)


def test_tied_head_is_counted_once() -> None:
    gpt2 = spec("gpt2").params
    assert gpt2.lm_head == 0 and gpt2.position_embedding == 1024 * 768
    untied = from_hf_config({**json.loads(json.dumps(T0_3B))}, "T0_3B").params
    assert untied.lm_head == 32128 * 2048


def test_largest_module_is_what_deepspeed_gathers() -> None:
    assert spec("t5-3b").params.largest_module == 32_899_072  # "32M largest layer params"
    assert t0_3b_automodel().params.largest_module == 65_798_144  # "65M largest layer params"
    assert t0_3b_automodel().params.total == 2_783_959_040  # "2783M total params"
    assert spec("mixtral-8x7b").params.largest_module == 8 * 3 * 4096 * 14336  # fused experts


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 128,
            },
            "vocab_size",
        ),
        ({"model_type": "bert", "hidden_size": 64}, "unsupported model_type 'bert'"),
        (
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 3,
                "intermediate_size": 128,
                "vocab_size": 10,
            },
            "not a multiple",
        ),
        (
            {
                "model_type": "gpt2",
                "n_embd": -5,
                "n_layer": 2,
                "n_head": 1,
                "vocab_size": 5,
                "n_positions": 8,
            },
            "positive integer",
        ),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_configs_name_the_problem(config: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_hf_config(config, "x")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ DeepSpeed
def ds_gib(total: int, largest: int, stage: int, gpus: int, formula: str = "docs") -> float:
    return round(fit.deepspeed_model_states(total, largest, stage, gpus, formula) / GIB, 2)


@pytest.mark.parametrize(
    ("total", "largest", "stage", "gpus", "formula", "published_gib"),
    [
        (2_851_598_336, 32_899_072, 2, 8, "docs", 15.93),  # memory.rst, t5-3b, live
        (2_851_598_336, 32_899_072, 3, 8, "docs", 6.10),  # memory.rst, t5-3b, live
        (2851 * 10**6, 32 * 10**6, 2, 8, "docs", 15.93),  # memory.rst, t5-3b, cold
        (2851 * 10**6, 32 * 10**6, 3, 8, "docs", 6.09),  # memory.rst, t5-3b, cold
        (2_783_959_040, 65_798_144, 3, 1, "docs", 46.91),  # Transformers guide, T0_3B, 1 GPU
        (2_783_959_040, 65_798_144, 3, 2, "docs", 23.58),  # Transformers guide, T0_3B, 2 GPUs
        (2_851_598_336, 32_899_072, 2, 8, "0.19", 11.29),  # DeepSpeed 0.19.8 run, t5-3b
    ],
)
def test_deepspeed_estimator_is_reproduced(
    total: int, largest: int, stage: int, gpus: int, formula: str, published_gib: float
) -> None:
    assert ds_gib(total, largest, stage, gpus, formula) == pytest.approx(published_gib, abs=0.005)


def test_deepspeed_t5_large_example_in_mib() -> None:
    # memory.rst: 737.67M params, 32.90M largest layer, 4 GPUs: "case1 gpu memory: 3291MB"
    p = spec("t5-large").params
    assert fit.deepspeed_model_states(p.total, p.largest_module, 3, 4) >> 20 == 3291


def our_states(model: ModelSpec, stage: int, gpus: int) -> float:
    return fit.training_memory(model, modelcost.CostSettings(zero_stage=stage), dp=gpus).model_states


@pytest.mark.parametrize(("model", "gpus"), [("t5-3b", 8), ("t0_3b", 1), ("t0_3b", 2), ("llama-3-8b", 8)])
def test_zero3_differs_from_deepspeed_by_the_fp32_gradient_bytes(model: str, gpus: int) -> None:
    m = t0_3b_automodel() if model == "t0_3b" else spec(model)
    p = m.params
    deepspeed = fit.deepspeed_model_states(p.total, p.largest_module, 3, gpus)
    ours = our_states(m, 3, gpus)
    assert deepspeed - ours == pytest.approx(2 * p.total / gpus, abs=1)  # 18 vs 16 bytes / param / N
    gather = 4 * p.largest_module  # the same in both
    assert (ours - gather) / (deepspeed - gather) == pytest.approx(16 / 18, abs=1e-6)


@pytest.mark.parametrize("gpus", [1, 2, 8, 64])
def test_zero2_differs_from_deepspeed_as_explained(gpus: int) -> None:
    m = spec("t5-3b")
    p = m.params
    ours = our_states(m, 2, gpus)
    current = fit.deepspeed_model_states(p.total, p.largest_module, 2, gpus, "0.19")
    published = fit.deepspeed_model_states(p.total, p.largest_module, 2, gpus, "docs")
    assert current - ours == pytest.approx(4 * p.total / gpus, abs=1)  # fp32 gradient partition
    assert published - ours == pytest.approx(2 * p.total + 2 * p.total / gpus, abs=1)  # unpartitioned grads


def test_t5_3b_numbers_side_by_side() -> None:
    m = spec("t5-3b")
    assert round(our_states(m, 2, 8) / GIB, 2) == 9.96  # DeepSpeed: 15.93 (docs), 11.29 (0.19)
    assert round(our_states(m, 3, 8) / GIB, 2) == 5.43  # DeepSpeed: 6.10


# ------------------------------------------------------------------------------- model states
def test_mixed_precision_adam_is_16_bytes_per_param_and_the_all_reduce_buckets() -> None:
    """The ZeRO paper's 2 + 2 + 12 bytes, and without ZeRO a second gradient-sized buffer: the
    flat buckets DDP all-reduces the gradients through."""
    m = spec("llama-2-7b")
    b = fit.training_memory(m, modelcost.CostSettings(dtype="bf16", optimizer="adam"))
    assert b.model_states == 18 * m.params.total
    assert (b.weights, b.gradients, b.optimizer_states) == (
        2 * m.params.total,
        2 * 2 * m.params.total,
        12 * m.params.total,
    )
    assert (
        fit.training_memory(m, modelcost.CostSettings(dtype="fp32")).model_states == 20 * m.params.total
    )  # 4 + 2 x 4 + 8
    assert (
        fit.training_memory(m, modelcost.CostSettings(optimizer="sgd")).model_states == 14 * m.params.total
    )  # 2 + 2 x 2 + 4 + 4
    assert (
        fit.training_memory(m, modelcost.CostSettings(zero_stage=1)).model_states == 16 * m.params.total
    )  # dp 1, no buckets


@pytest.mark.parametrize("dp", [2, 8, 64])
def test_zero_stages_partition_states_across_dp(dp: int) -> None:
    m = spec("mistral-7b")
    one = fit.training_memory(m, modelcost.CostSettings(zero_stage=3), dp=1)
    for stage, divided in [
        (1, {"optimizer_states"}),
        (2, {"optimizer_states", "gradients"}),
        (3, {"optimizer_states", "gradients", "weights"}),
    ]:
        b = fit.training_memory(m, modelcost.CostSettings(zero_stage=stage), dp=dp)
        for name in ("weights", "gradients", "optimizer_states"):
            expected = getattr(one, name) / (dp if name in divided else 1)
            assert getattr(b, name) == pytest.approx(expected)
    assert (
        fit.training_memory(m, modelcost.CostSettings(zero_stage=3), dp=dp).gather_buffer
        == 4 * m.params.largest_module
    )


def test_tensor_and_pipeline_parallel_shard_states() -> None:
    m = spec("llama-2-70b")
    base = fit.training_memory(m).weights
    assert fit.training_memory(m, tp=8).weights == pytest.approx(base / 8)
    staged = fit.training_memory(m, pp=4).weights
    assert base / 4 < staged < base / 4 * 1.05  # the largest stage also holds an embedding


# --------------------------------------------------------------------------------- activations
def gpt_like(hidden: int = 1024, heads: int = 16, layers: int = 4) -> ModelSpec:
    return from_hf_config(
        {
            "model_type": "gpt2",
            "n_embd": hidden,
            "n_head": heads,
            "n_layer": layers,
            "n_positions": 2048,
            "vocab_size": 1000,
        },
        "gpt-like",
    )


@pytest.mark.parametrize(("s", "b", "t"), [(2048, 1, 1), (2048, 4, 1), (1024, 2, 4), (4096, 1, 8)])
def test_activations_follow_korthikanti_for_gpt_layers(s: int, b: int, t: int) -> None:
    m = gpt_like()
    h, a = m.hidden, m.heads
    eager = partial(modelcost.layer_activation_bytes, m, s, b, tp=t, attention="eager")
    paper = s * b * h * (34 + 5 * a * s / h) / t  # Table 2, tensor + sequence parallel
    assert eager() == pytest.approx(paper)
    no_sp = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))  # tensor parallel only
    assert eager(sequence_parallel=False) == pytest.approx(no_sp)
    assert eager(recompute="selective") == pytest.approx(s * b * h * 34 / t)
    assert eager(recompute="full") == pytest.approx(2 * s * b * h / t)


@pytest.mark.parametrize(("s", "b", "t"), [(2048, 1, 1), (4096, 2, 4)])
def test_flash_attention_keeps_softmax_statistics_not_scores(s: int, b: int, t: int) -> None:
    m = gpt_like()
    h, a = m.hidden, m.heads
    flash = modelcost.layer_activation_bytes(m, s, b, tp=t)  # flash is the default
    assert flash == pytest.approx(s * b * h * 34 / t + 4 * a * s * b / t)
    assert modelcost.layer_activation_bytes(m, s, b, tp=t, recompute="selective") == pytest.approx(
        s * b * h * 34 / t
    )


def test_flash_and_eager_for_llama_2_7b_at_4096() -> None:
    """The figures of issue 7: 0.53 GiB of activations per layer with flash attention, 3.03 with
    eager (Korthikanti's formula), no recomputation, micro-batch 1."""
    m = spec("llama-2-7b")
    assert modelcost.layer_activation_bytes(m, 4096, 1) / GIB == pytest.approx(0.534, abs=1e-3)
    assert modelcost.layer_activation_bytes(m, 4096, 1, attention="eager") / GIB == pytest.approx(
        3.033, abs=1e-3
    )


@pytest.mark.parametrize("name", ["llama-3-8b", "mixtral-8x7b", "gpt2-xl", "t5-3b"])
def test_recompute_reduces_activations(name: str) -> None:
    m = spec(name)
    acts = [
        fit.training_memory(m, modelcost.CostSettings(recompute=r), seq=4096).activations
        for r in ("none", "selective", "full")
    ]
    assert acts[0] > acts[1] > acts[2] > 0


# -------------------------------------------------------------------------------------- inference
def test_kv_cache_of_llama3_8b_by_hand() -> None:
    m = spec("llama-3-8b")
    per_token = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads (GQA), head_dim 128, bf16
    assert per_token == 128 * 1024
    b = fit.inference_memory(m, batch=1, seq=8192)
    assert b.kv_cache == per_token * 8192 == GIB
    assert fit.inference_memory(m, batch=4, seq=8192, kv_dtype="fp8").kv_cache == 2 * GIB
    assert fit.inference_memory(m, batch=1, seq=8192, tp=8).kv_cache == GIB / 8
    mha = spec("llama-2-7b")
    assert fit.kv_cache_bytes(mha, 1, 1) == 2 * 32 * 32 * 128 * 2  # 4x Llama-3's per token


def test_kv_heads_are_replicated_when_tp_exceeds_them() -> None:
    m = spec("llama-3-70b")  # 8 KV heads
    assert fit.kv_cache_bytes(m, 1, 1000, tp=16) == fit.kv_cache_bytes(m, 1, 1000, tp=8)


def test_quantized_weights() -> None:
    m = spec("llama-2-7b")
    bf16 = fit.inference_memory(m, "bf16").weights
    int8 = fit.inference_memory(m, "int8").weights
    int4 = fit.inference_memory(m, "int4").weights
    assert bf16 == 2 * m.params.total
    assert bf16 / 2 < int8 < bf16 * 0.53  # embeddings and lm_head stay 16-bit
    assert bf16 / 4 < int4 < int8 * 0.6
    assert fit.inference_memory(m, "int4").kv_cache == fit.inference_memory(m, "bf16").kv_cache


MODELS = st.sampled_from(["gpt2", "llama-3-8b", "mixtral-8x7b", "qwen2-7b", "t5-large"])


@settings(max_examples=60, deadline=None)
@given(
    MODELS,
    st.integers(1, 64),
    st.integers(1, 16384),
    st.integers(1, 64),
    st.integers(1, 16384),
    st.sampled_from(["bf16", "fp8", "int8", "int4", "fp32"]),
)
def test_inference_memory_is_monotone_and_never_negative(
    name: str, b1: int, s1: int, b2: int, s2: int, dtype: str
) -> None:
    m = spec(name)
    small = fit.inference_memory(m, dtype, min(b1, b2), min(s1, s2))
    large = fit.inference_memory(m, dtype, max(b1, b2), max(s1, s2))
    assert all(v >= 0 for v in small.components().values())
    assert 0 < small.total <= large.total


@settings(max_examples=60, deadline=None)
@given(
    MODELS,
    st.integers(1, 16),
    st.integers(1, 8192),
    st.integers(1, 16),
    st.integers(1, 8192),
    st.sampled_from(["none", "selective", "full"]),
    st.integers(0, 3),
    st.sampled_from([1, 2, 8]),
)
def test_training_memory_is_monotone_and_never_negative(
    name: str, b1: int, s1: int, b2: int, s2: int, recompute: str, stage: int, dp: int
) -> None:
    m = spec(name)
    kw = {"settings": modelcost.CostSettings(recompute=recompute, zero_stage=stage), "dp": dp}
    small = fit.training_memory(m, micro_batch=min(b1, b2), seq=min(s1, s2), **kw)  # type: ignore[arg-type]
    large = fit.training_memory(m, micro_batch=max(b1, b2), seq=max(s1, s2), **kw)  # type: ignore[arg-type]
    assert all(v >= 0 for v in small.components().values())
    assert 0 < small.total <= large.total
    assert (
        fit.training_memory(m, modelcost.CostSettings(zero_stage=stage), dp=dp * 2).total
        <= fit.training_memory(m, modelcost.CostSettings(zero_stage=stage), dp=dp).total
    )


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [({"batch": 0}, "batch"), ({"seq": -3}, "seq"), ({"tp": 3}, "tp"), ({"dtype": "int3"}, "dtype")],
)
def test_absurd_inference_arguments_raise_config_errors(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        fit.inference_memory(spec("llama-3-8b"), **kwargs)  # type: ignore[arg-type]


def test_absurd_training_arguments_raise_config_errors() -> None:
    m = spec("gpt2")
    cases = [({"zero_stage": 4}, {}), ({}, {"pp": 13}), ({"dtype": "int8"}, {}), ({}, {"micro_batch": -1})]
    for options, kwargs in [*cases, ({"recompute": "x"}, {})]:
        with pytest.raises(ConfigError):
            fit.training_memory(m, modelcost.CostSettings(**options), **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- layer costs
def test_layer_table_covers_the_model() -> None:
    m = spec("llama-3-8b")
    c = modelcost.layer_table(m, seq=4096, micro_batch=2)
    assert c.names[0] == "embedding" and c.names[-1] == "head" and c.names[1] == "layer.0"
    assert len(c.names) == m.layers + 2 == c.flops.shape[0] == c.param_bytes.shape[0]
    assert c.params.sum() == m.params.total and c.param_bytes.sum() == pytest.approx(2 * m.params.total)
    assert c.state_per_param == (2.0, 2.0, 12.0)
    layer = modelcost.layer_activation_bytes(m, 4096, 2)
    assert np.allclose(c.activation_bytes[1:-1], layer)
    assert np.allclose(c.checkpoint_bytes[1:-1], 2 * 2 * 4096 * m.hidden)
    dense = 2 * 4096 * 2 * (c.params[1] - 2 * m.hidden)  # 2 x tokens x matmul weights
    assert c.flops[1] == pytest.approx(dense + 4 * 2 * 4096**2 * m.q_dim)
    assert c.boundary_bytes == 2 * 2 * 4096 * m.hidden and not c.recompute_flops.any()
    tp = modelcost.layer_table(m, seq=4096, micro_batch=2, tp=4)
    assert np.allclose(tp.flops, c.flops / 4) and np.allclose(tp.param_bytes, c.param_bytes / 4)
    assert np.allclose(tp.activation_bytes, c.activation_bytes / 4)


def test_fp32_training_keeps_and_sends_four_byte_activations() -> None:
    m, sbh = spec("llama-3-8b"), 4096 * 2 * spec("llama-3-8b").hidden
    half = modelcost.layer_table(
        m, seq=4096, micro_batch=2, settings=modelcost.CostSettings(attention="eager")
    )
    full = modelcost.layer_table(
        m, seq=4096, micro_batch=2, settings=modelcost.CostSettings("fp32", attention="eager")
    )
    assert full.boundary_bytes == 2 * half.boundary_bytes == 4 * sbh
    masks = 2 * sbh + m.heads * 4096**2 * 2  # two dropout masks and the attention one, a byte each
    assert full.activation_bytes[1] == pytest.approx(2 * half.activation_bytes[1] - masks)
    assert full.activation_bytes[-1] == half.activation_bytes[-1]  # fp32 logits either way
    assert np.allclose(full.checkpoint_bytes[1:-1], 2 * half.checkpoint_bytes[1:-1])
    costs = LayerCosts.from_table(modelcost.layer_table(m, 4096, modelcost.CostSettings("fp32")))
    assert costs.elements_per_sample == 4096 * m.hidden


def test_layer_table_shards_states_by_zero_stage() -> None:
    m = spec("llama-2-7b")
    for stage, per_param in ((0, 18), (1, 2 + 2 + 12 / 8), (2, 2 + 14 / 8), (3, 16 / 8)):
        b = fit.training_memory(m, modelcost.CostSettings(zero_stage=stage), 1, 4096, dp=8)
        assert b.weights + b.gradients + b.optimizer_states == pytest.approx(per_param * m.params.total)
    assert (
        modelcost.layer_table(m, 4096, modelcost.CostSettings(zero_stage=3)).gather_bytes
        == 4 * m.params.largest_module
    )


def test_selective_recomputation_redoes_the_attention_core() -> None:
    m = spec("llama-2-7b")
    c = modelcost.layer_table(m, 4096, modelcost.CostSettings(recompute="selective"))
    assert np.allclose(c.recompute_flops[1:-1], 4 * 4096**2 * m.q_dim)
    assert c.recompute_flops[0] == c.recompute_flops[-1] == 0


def test_tied_head_is_a_copy_the_last_stage_keeps() -> None:
    m = spec("gpt2")
    c = modelcost.layer_table(m, 1024)
    assert c.tied_params == m.vocab * m.hidden and c.params.sum() - c.tied_params == m.params.total


def test_layer_table_of_moe_counts_active_experts_and_t5_both_stacks() -> None:
    moe = modelcost.layer_table(spec("mixtral-8x7b"), seq=1, micro_batch=1)
    assert moe.flops[1] == pytest.approx(
        2 * (4096 * (2 * 4096 + 2 * 1024) + 2 * 3 * 4096 * 14336 + 4096 * 8) + 4 * 4096
    )
    t5 = modelcost.layer_table(spec("t5-large"), seq=512, micro_batch=1)
    assert t5.names[1] == "encoder.0" and t5.names[25] == "decoder.0" and len(t5.names) == 50
    assert t5.flops[25] > t5.flops[1]  # decoder layers also attend to the encoder


# ------------------------------------------------------------------------------ device options
def device(
    type_: str,
    index: int,
    memory_mib: int | None,
    vendor: str = "nvidia",
    health: Health = Health.OK,
    model: str = "",
) -> Device:
    return Device(
        vendor=vendor,
        model=model or type_,
        index=index,
        file=f"/dev/x{index}",
        type=type_,
        memory_mib=memory_mib,
        health=health,
    )


INVENTORY = ClusterInventory(
    nodes=(
        NodeInventory("a100-[01-02]", tuple(device("a100_80g", i, 81920) for i in range(4))),
        NodeInventory("l4-01", (device("l4", 0, 23034),)),
        NodeInventory("bad-01", (device("t4", 0, 15360, health=Health.UNHEALTHY),)),
    )
)


def tp_estimate(model: ModelSpec) -> fit.Estimate:
    return lambda n: fit.inference_memory(model, seq=4096, tp=n) if model.heads % n == 0 else None


def test_device_options_count_devices_and_give_reasons() -> None:
    estimate = tp_estimate(spec("llama-3-70b"))
    options = {o.type: o for o in fit.device_options(slurm_nodes(INVENTORY, load_catalog()), estimate)}
    a100 = options["a100_80g"]
    assert (a100.available, a100.memory_bytes, a100.needed, a100.fits) == (8, 80 * GIB, 2, True)
    assert a100.per_device_bytes is not None and a100.per_device_bytes <= 80 * GIB
    assert options["l4"].reason == ReasonCode.NOT_ENOUGH_DEVICES and options["l4"].needed == 8
    assert options["t4"].reason == ReasonCode.UNHEALTHY
    assert list(options)[0] == "a100_80g"  # fitting types first


def test_device_options_without_a_fitting_count() -> None:
    never = fit.device_options(slurm_nodes(INVENTORY, load_catalog()), lambda n: None, limit=4)
    assert {o.reason for o in never if o.type in ("a100_80g", "l4")} == {ReasonCode.INSUFFICIENT_MEMORY}


@pytest.mark.parametrize(("weights", "fits"), [(80 * GIB, True), (80 * GIB + 1, False)])
def test_device_options_fit_up_to_the_device_memory(weights: float, fits: bool) -> None:
    estimate = lambda n: fit.Breakdown("infer", weights)  # noqa: E731
    options = {
        o.type: o for o in fit.device_options(slurm_nodes(INVENTORY, load_catalog()), estimate, limit=1)
    }
    assert options["a100_80g"].fits is fits


# ------------------------------------------------------------------------------------------ CLI
def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["fit", *args])
    return result.exit_code, result.stdout, result.stderr


def test_cli_lists_bundled_models() -> None:
    code, out, _ = run("--list-models")
    assert code == 0 and out.split() == bundled_names()
    assert json.loads(run("--list-models", "--json")[1]) == bundled_names()


def test_cli_inference_table_and_json() -> None:
    code, out, _ = run("--model", "llama-3-8b", "--seq", "8192")
    assert code == 0
    assert "kv_cache" in out and "1.00" in out and "total per device (1 devices)" in out
    code, out, _ = run("--model", "llama-3-8b", "--seq", "8192", "--json")
    data = json.loads(out)
    assert data["breakdown_bytes"]["kv_cache"] == GIB and data["model"]["params"] == 8_030_261_248
    assert data["total_bytes"] == pytest.approx(sum(data["breakdown_bytes"].values()))


def test_cli_training_shows_deepspeed_comparison() -> None:
    code, out, _ = run("--model", "t5-3b", "--mode", "train", "--zero", "3", "--dp", "8", "--json")
    data = json.loads(out)
    assert code == 0 and data["devices"] == 8
    assert round(data["deepspeed_model_states_bytes"] / GIB, 2) == 6.10
    assert round(data["model_states_bytes"] / GIB, 2) == 5.43
    code, out, _ = run("--model", "t5-3b", "--mode", "train", "--zero", "3", "--dp", "8")
    assert "DeepSpeed 0.19 estimator: 6.10 GiB" in out


def test_cli_reads_a_config_file_and_an_inventory(tmp_path: Path) -> None:
    config = tmp_path / "my-model" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({**T0_3B}))
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "nodes": [
                    {
                        "name": "n1",
                        "devices": [
                            {
                                "vendor": "nvidia",
                                "model": "NVIDIA A100-SXM4-80GB",
                                "type": "a100_80g",
                                "index": i,
                                "file": f"/dev/nvidia{i}",
                                "memory_mib": 81920,
                            }
                            for i in range(2)
                        ],
                    }
                ],
            }
        )
    )
    args = ["--model", str(config.parent), "--mode", "train", "--zero", "3", "--inventory", str(inventory)]
    args += ["--seq", "2048", "--beyond-context"]  # T5 positions are relative: longer than n_positions
    code, out, err = run(*args, "--attention", "eager", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["model"]["name"] == "my-model" and data["model"]["params"] == 2_849_757_184
    (a100,) = data["device_options"]
    # 2.85B params x 16 bytes is 42.5 GiB of states before activations: with eager attention's s^2
    # scores one 80G device is not enough at ZeRO-3 dp=1, two are (states halve)
    assert a100["type"] == "a100_80g" and a100["needed"] == 2 and a100["fits"]
    assert a100["per_device_bytes"] <= a100["memory_bytes"]
    (flash,) = json.loads(run(*args, "--json")[1])["device_options"]  # flash (default): one is enough
    assert flash["needed"] == 1 and flash["per_device_bytes"] < a100["per_device_bytes"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "llama-9"], "unknown model 'llama-9'"),
        (["--model", "/no/such/config.json"], "gpt2, gpt2-xl"),
        (
            ["--model", "gpt2", "--seq", "2048"],
            "--seq 2048: gpt2 takes 1 to 1024 tokens; pass --beyond-context",
        ),
        (["--model", "gpt2", "--tp", "5"], "tp=5 does not divide the 12 attention heads"),
        (["--model", "gpt2", "--mode", "train", "--dtype", "int4"], "dtype: 'int4' is not one of"),
        (["--model", "gpt2", "--inventory", "/no/inv.yaml"], "no such inventory file"),
        ([], "--model is required"),
    ],
)
def test_cli_errors_are_one_line(args: list[str], message: str) -> None:
    code, out, err = run(*args)
    assert code == 1 and out == ""
    assert err.startswith("slurm-hetero: ") and message in err and err.count("\n") == 1


def test_cli_malformed_json(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama",\n "hidden_size": }')
    code, _, err = run("--model", str(bad))
    assert code == 1 and "malformed JSON at line 2 column" in err and str(bad) in err
    bad.write_text('{"model_type": "llama", "hidden_size": 4096, "hidden_size": 8}')  # adv43 L-C20
    code, _, err = run("--model", str(bad))
    assert (
        code == 1
        and err == f"slurm-hetero: {bad}: malformed JSON: key 'hidden_size' given twice in one object\n"
    )


def test_every_bundled_model_fits_somewhere_reasonable() -> None:
    for name in bundled_names():
        b = fit.inference_memory(spec(name), seq=2048)
        assert math.isfinite(b.total) and b.weights >= spec(name).params.total * 2


def test_cli_inference_skips_device_counts_that_split_kv_heads_unevenly() -> None:
    # qwen2-7b: 28 heads, 4 kv heads; 7 devices divide the heads but not the kv heads
    code, out, err = run(
        "--model", "qwen2-7b", "--inventory", "gres_conf/examples/mixed.yaml", "--mode", "infer",
        "--batch", "256", "--seq", "32768", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert {o["type"] for o in json.loads(out)["device_options"]} >= {"a100_80g", "l40s"}


def test_library_callers_get_the_engines_own_refusals() -> None:
    """What the CLI never passes is still refused, not answered with another stage's figure."""
    with pytest.raises(ConfigError, match="ZeRO stages 1-3"):
        fit.deepspeed_model_states(10**9, 10**7, 0, 8)
    with pytest.raises(ConfigError, match="formula"):
        fit.deepspeed_model_states(10**9, 10**7, 2, 8, formula="1.0")
    spec = load_model("gpt2")
    for bad in ({"recompute": "half"}, {"attention": "sparse"}):
        with pytest.raises(ConfigError):
            modelcost.layer_activation_bytes(spec, 128, 1, **bad)  # type: ignore[arg-type]
