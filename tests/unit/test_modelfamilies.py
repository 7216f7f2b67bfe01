"""The families beyond Llama, GPT-2 and T5: each bundled config's exact parameter count (what
Transformers 5.23 builds from the file on the meta device, equal to the published total),
what the layout solver gets from it, and the error that names every supported model_type."""

from __future__ import annotations

import pytest

from slurm_hetero.core.errors import ConfigError
from slurm_hetero.engine.modelfamilies import READERS, from_hf_config
from slurm_hetero.inventory.modelconfigs import layer_costs_for, load_model
from tests.conftest import REPO

# (bundled name, exact total, published total, its rounding unit, active per token in billions)
FAMILIES = [
    ("opt-350m", 331_196_416, 331e6, 1e6, None),  # OPT paper table 1 "350M"; HF: 331,196,416
    ("gpt-neo-2.7b", 2_651_307_520, 2.7e9, 0.1e9, None),
    ("gpt-j-6b", 6_050_882_784, 6_050_882_784, 1, None),  # the model card's exact count
    ("falcon-7b", 6_921_720_704, 6.92e9, 0.01e9, None),
    ("gemma-2b", 2_506_172_416, 2.51e9, 0.01e9, None),
    ("qwen1.5-moe-a2.7b", 14_315_784_192, 14.3e9, 0.1e9, 2.7),  # "A2.7B": 2.7B activated
    ("deepseek-v2-lite", 15_706_484_224, 15.7e9, 0.1e9, None),
]


@pytest.mark.parametrize(("name", "exact", "published", "unit", "active"), FAMILIES)
def test_bundled_family_counts(
    name: str, exact: int, published: float, unit: float, active: float | None
) -> None:
    params = load_model(name).params
    assert params.total == exact
    assert abs(params.total - published) <= unit / 2
    if active is not None:
        assert round(params.active / 1e9, 1) == active


@pytest.mark.parametrize("name", [f[0] for f in FAMILIES])
def test_the_solver_gets_every_layer_and_the_same_total(name: str) -> None:
    spec = load_model(name)
    costs = layer_costs_for(name, 512)
    assert costs.layers == spec.layers
    held = float(costs.param_bytes.sum()) + costs.first_param_bytes + costs.last_param_bytes
    assert held == pytest.approx(2 * spec.params.total + costs.tied_param_bytes)


def test_opt_350m_projects_a_narrow_embedding_and_has_no_final_norm() -> None:
    spec = load_model("opt-350m")
    assert (spec.embed_width, spec.final_norm, spec.learned_positions) == (512, False, 2050)
    assert spec.params.projection == 2 * 512 * 1024


def test_deepseek_dense_first_layer_and_latent_attention() -> None:
    spec = load_model("deepseek-v2-lite")
    costs = layer_costs_for("deepseek-v2-lite", 512)
    assert spec.dense_layers == 1 and spec.is_mla and spec.head_dim == 192
    assert costs.param_bytes[0] < costs.param_bytes[1] / 5  # dense layer 0: 81M, expert layers 585M
    assert costs.flops[0] < costs.flops[1]  # 10944 wide against 6 routed + 2 shared experts of 1408


def test_falcon_multi_query_and_new_architecture() -> None:
    old = load_model("falcon-7b")
    assert (old.kv_heads, old.norms_per_layer) == (1, 1)
    new = from_hf_config(
        {"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 8, "num_kv_heads": 2,
         "new_decoder_architecture": True, "num_hidden_layers": 2, "vocab_size": 100},
        "tiny-falcon",
    )  # fmt: skip
    assert (new.kv_heads, new.norms_per_layer) == (2, 2)


TINY_FALCON = {"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 8, "num_kv_heads": 2,
               "new_decoder_architecture": True, "num_hidden_layers": 2, "vocab_size": 100}  # fmt: skip
TINY_DEEPSEEK = {"model_type": "deepseek", "hidden_size": 64, "num_attention_heads": 8,
                 "num_key_value_heads": 8, "num_hidden_layers": 2, "vocab_size": 100,
                 "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 4,
                 "num_experts_per_tok": 2}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "change", "message"),
    [
        (
            TINY_FALCON,
            {"num_kv_heads": 3},
            "tiny:num_kv_heads: 8 attention heads are not a multiple of 3 kv heads",
        ),
        (TINY_FALCON, {"n_head_kv": 16, "num_kv_heads": None}, "not a multiple of 16 kv heads"),
        (TINY_DEEPSEEK, {"num_key_value_heads": 3}, "tiny:num_key_value_heads: 8 attention heads are not"),
        (TINY_FALCON, {"hidden_size": 60}, "tiny:num_attention_heads: hidden size 60 is not divisible by 8"),
        (TINY_FALCON, {"hidden_size": 60, "head_dim": 8}, "hidden size 60 is not divisible by 8 heads"),
    ],
)
def test_kv_heads_that_do_not_divide_the_heads_are_refused(
    config: dict[str, object], change: dict[str, object], message: str
) -> None:
    """Falcon's num_kv_heads and DeepSeek's num_key_value_heads were taken as given (Llama's were
    checked); Falcon's head_dim is always hidden / heads in transformers, whatever the config says."""
    edited = {k: v for k, v in {**config, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        from_hf_config(edited, "tiny")


def test_unknown_model_type_names_every_supported_one() -> None:
    with pytest.raises(ConfigError) as e:
        from_hf_config({"model_type": "mamba"}, "m")
    for name in ("opt", "gpt_neo", "gptj", "falcon", "gemma", "qwen2_moe", "deepseek_v2", "llama", "t5"):
        assert name in str(e.value)


def test_the_fit_guide_lists_every_model_type_read() -> None:
    """docs/fit.md named 7 of the 19 model_types READERS reads (GPT-Neo, OPT, Falcon, ... missing)."""
    text = (REPO / "docs" / "fit.md").read_text()
    assert [t for t in sorted(READERS) if f"`{t}`" not in text] == []
