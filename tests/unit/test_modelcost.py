"""One model-cost source (`engine.modelcost`): `fit` and the layout solver (`plan`, `launch`) count
the same bytes and FLOPs, and the three commands take the same options."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.core.errors import ConfigError, RequestError
from slurm_hetero.engine import fit
from slurm_hetero.engine.layout import LayoutSpec, solve
from slurm_hetero.engine.modelcost import AUTO, CostSettings, layer_table
from slurm_hetero.engine.stagecost import Checkpointing, DeviceGroup, LayerCosts, StageModel, StageSite
from slurm_hetero.inventory.modelconfigs import layer_costs_for, load_model
from tests.conftest import REPO

GIB = 2**30


def invoke(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_plan_reports_the_per_device_memory_fit_does() -> None:
    """Issue 7: the same job through both commands, within 1%."""
    common = ("--model", "llama-2-7b", "--seq", "4096", "--micro-batch-size", "1", "--zero", "1")
    common += ("--recompute", "none", "--dtype", "bf16")
    plan = invoke("plan", "--devices", "a100_80g:8", *common)
    fitted = invoke("fit", "--mode", "train", "--dp", "8", *common)
    (stage,) = {(s["tp"], s["layers"], s["memory_bytes"]) for s in plan["stages"]}  # type: ignore[attr-defined]
    assert stage[:2] == (1, 32)  # pure data parallel, as fit's --dp 8
    assert stage[2] == pytest.approx(fitted["total_bytes"], rel=0.01)
    assert plan["attention"] == fitted["settings"]["attention"] == "flash"  # type: ignore[index]


def _one_stage_memory(spec_name: str, seq: int, settings: CostSettings, dp: int, tp: int) -> float:
    costs = LayerCosts.from_table(layer_table(load_model(spec_name), seq, settings))
    group = DeviceGroup("big", (8,), 100.0, 1e15, 100.0)
    model = StageModel(costs, StageSite(group, tp, dp, 1, 1, True, True))
    layers = costs.layers
    return model.memory(0, layers, model.recompute(0, layers))


@pytest.mark.parametrize("name", ["llama-2-7b", "gpt2", "mixtral-8x7b"])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("attention", ["flash", "eager"])
def test_a_single_stage_holds_what_fit_says(name: str, zero: int, recompute: str, attention: str) -> None:
    settings = CostSettings("bf16", "adam", zero, recompute, attention)
    for dp, tp in ((8, 1), (2, 2)):
        estimate = fit.training_memory(load_model(name), settings, seq=1024, dp=dp, tp=tp)
        assert _one_stage_memory(name, 1024, settings, dp, tp) == pytest.approx(estimate.total, rel=1e-9)


def test_fp32_and_sgd_agree_too() -> None:
    settings = CostSettings("fp32", "sgd", 2, "none", "eager", overhead_bytes=0.0)
    estimate = fit.training_memory(load_model("llama-2-7b"), settings, 1, 2048, 4)
    assert _one_stage_memory("llama-2-7b", 2048, settings, 4, 1) == pytest.approx(estimate.total, rel=1e-9)


def test_recompute_modes_reach_the_solver() -> None:
    costs = {
        r: layer_costs_for("llama-2-7b", 4096, CostSettings(recompute=r))
        for r in ("none", "selective", "full", AUTO)
    }
    assert costs["none"].checkpointing == costs["selective"].checkpointing == Checkpointing.NEVER
    assert (
        costs["full"].checkpointing == Checkpointing.ALL
        and costs[AUTO].checkpointing == Checkpointing.AS_NEEDED
    )
    assert not costs["none"].extra.any() and costs["selective"].extra.all()
    base = costs["none"].step_flops_per_sample
    assert costs["selective"].step_flops_per_sample > base and costs[AUTO].step_flops_per_sample == base
    assert costs["full"].step_flops_per_sample == pytest.approx(base + costs["full"].flops.sum())


def _a100s(n: int, settings: CostSettings) -> LayoutSpec:
    group = DeviceGroup("a100_80g", (n,), 140.0, 72 * GIB, 300.0)
    return LayoutSpec((group,), layer_costs_for("llama-2-7b", 4096, settings), 64, tp_sizes=(1,))


def test_the_solver_recomputes_as_told() -> None:
    full = solve(_a100s(8, CostSettings(zero_stage=1, recompute="full")))
    assert all(s.recompute == s.layer_end - s.layer_start for p in full.pipelines for s in p.stages)
    none = solve(_a100s(8, CostSettings(zero_stage=1, recompute="none")))
    assert all(s.recompute == 0 for p in none.pipelines for s in p.stages)
    eager = CostSettings(zero_stage=1, attention="eager")  # 3 GiB a layer: two devices hold 8 layers
    with pytest.raises(RequestError, match="without recomputing whole layers"):
        solve(_a100s(2, eager))
    auto = solve(_a100s(2, CostSettings(zero_stage=1, recompute=AUTO, attention="eager")))
    assert any(s.recompute > 0 for p in auto.pipelines for s in p.stages)


def test_zero_stage_shards_the_solver_state() -> None:
    zero = [layer_costs_for("llama-2-7b", 4096, CostSettings(zero_stage=z)) for z in range(4)]
    states = [c.model_state_bytes(8) for c in zero]
    assert states[0] > states[1] > states[2] > states[3]
    assert states[0] == pytest.approx(18 * load_model("llama-2-7b").params.total)  # DDP's buckets too
    assert zero[3].gather_bytes > 0 == zero[2].gather_bytes


def test_tied_embeddings_are_held_once_by_a_single_stage() -> None:
    costs = layer_costs_for("gpt2", 1024)
    assert costs.tied_param_bytes == pytest.approx(2 * 50257 * 768)
    assert costs.first_param_bytes + costs.last_param_bytes + float(
        np.sum(costs.param_bytes)
    ) == pytest.approx(2 * load_model("gpt2").params.total + costs.tied_param_bytes)


def test_bad_settings_are_config_errors() -> None:
    for kwargs in ({"dtype": "int8"}, {"zero_stage": 5}, {"recompute": "some"}, {"attention": "sparse"}):
        with pytest.raises(ConfigError):
            CostSettings(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="recompute"):
        fit.training_memory(load_model("gpt2"), CostSettings(recompute=AUTO))


@pytest.mark.parametrize("command", [["fit"], ["plan"], ["launch"]])
def test_fit_plan_and_launch_take_the_same_options(command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0
    for option in ("--dtype", "--zero", "--recompute", "--attention", "--optimizer", "--micro-batch-size"):
        assert option in result.output
    assert "[default: flash]" in result.output


def test_plan_and_fit_state_the_attention_in_their_tables() -> None:
    plan = CliRunner().invoke(cli, ["plan", "--devices", "a100:2", "--model", "gpt2", "--attention", "eager"])
    assert plan.exit_code == 0 and "eager attention" in plan.output and "MEM_GIB" in plan.output
    fitted = CliRunner().invoke(cli, ["fit", "--model", "gpt2", "--mode", "train"])
    assert fitted.exit_code == 0 and "flash attention" in fitted.output


def test_launch_tells_each_rank_what_the_plan_assumed() -> None:
    args = ["launch", "--model", "gpt2", "--dry-run", "--simulate", "a100n1:a100_80g:2"]
    doc = invoke(*args, "--attention", "eager", "--recompute", "selective")
    layout = doc["ranks"][0]["layout"]  # type: ignore[index]
    assert layout["attention"] == "eager" and layout["recompute_mode"] == "selective"
    assert layout["zero_stage"] == 1 and layout["dtype"] == "bf16"


def test_local_attention_layers_attend_to_their_window_where_attention_is_fused() -> None:
    """GPT-Neo's alternating local layers (window_size 256), Mistral's sliding window on every
    layer and Gemma 2's on its even layers are read from the HF config; with flash attention a
    local layer's score FLOPs cover its window, eager attention computes (and masks) them all."""
    from slurm_hetero.engine.modelfamilies import from_hf_config

    def load_hf_config(name: str) -> dict[str, object]:
        return json.loads((REPO / "slurm_hetero" / "data" / "hf_configs" / f"{name}.json").read_text())

    neo = load_model("gpt-neo-2.7b")
    assert neo.window == 256 and neo.local_layers == tuple(range(1, 32, 2))
    flash = layer_table(neo, 2048, CostSettings())
    eager = layer_table(neo, 2048, CostSettings(attention="eager"))
    full = 4.0 * 2048 * 2048 * neo.q_dim
    assert flash.flops[1] == eager.flops[1] == eager.flops[2]  # layer.0 global; eager: all alike
    assert flash.flops[1] - flash.flops[2] == pytest.approx(full - 4.0 * 2048 * 256 * neo.q_dim)
    mistral = load_model("mistral-7b")
    assert mistral.window == 4096 and mistral.local_layers == tuple(range(mistral.layers))
    short, long = layer_table(mistral, 4096), layer_table(mistral, 8192)
    assert long.flops[1] == pytest.approx(2 * short.flops[1])  # linear in seq beyond the window
    gemma2 = from_hf_config(
        {**load_hf_config("gemma-2b"), "model_type": "gemma2", "sliding_window": 4096}, "g2"
    )
    assert gemma2.local_layers == tuple(range(0, gemma2.layers, 2)) and gemma2.norms_per_layer == 4
    assert not load_model("qwen2-7b").local_layers  # use_sliding_window false
    bad = {**load_hf_config("gpt-neo-2.7b"), "attention_layers": ["global", "nearby"]}
    with pytest.raises(ConfigError, match="attention_layers"):
        from_hf_config(bad, "bad")
