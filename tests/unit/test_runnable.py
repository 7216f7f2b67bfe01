"""`plan` and `launch` make one planner call: for generated allocations (types, nodes, devices per
node, batch) `launch --dry-run --simulate` lays out what `plan` prints, and shows the same table."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from slurm_hetero.cli import cli
from slurm_hetero.engine.layout import Layout, LayoutKind, PipelinePlan, StagePlan
from slurm_hetero.launch.runnable import search_kinds, unrunnable_reason

TYPES = ("a100_80g", "l40s", "h100_sxm", "mi300x", "ascend910b2", "a10")


def run(*argv: str) -> str:
    result = CliRunner().invoke(cli, list(argv))
    assert result.exit_code == 0, result.output
    return result.stdout


def layout_keys(doc: dict[str, Any]) -> dict[str, Any]:
    """What a layout decides: family, figures and, per stage, type, degrees, layers and samples."""
    stages = [
        {k: s[k] for k in ("pipeline", "index", "type", "tp", "dp", "layer_start", "layer_end",
                           "recompute", "micro_batch", "samples", "ranks")}
        for s in doc["stages"]
    ]  # fmt: skip
    keys = ("kind", "world_size", "replicas", "predicted_step_s", "even_step_s", "bound_step_s")
    return {**{k: doc[k] for k in keys}, "stages": stages}


allocations = st.tuples(
    st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True),
    st.lists(st.integers(1, 2), min_size=3, max_size=3),  # nodes of each type
    st.sampled_from((1, 2, 4, 8)),  # devices per node
    st.sampled_from((8, 24, 64, 100)),  # global batch
)


# each example plans four times (seconds each): no shrinking, which would take minutes
@settings(
    max_examples=10,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
@given(allocations)
def test_launch_runs_what_plan_prints(allocation: tuple[list[str], list[int], int, int]) -> None:
    types, nodes, per_node, batch = allocation
    common = ["--model", "gpt2", "--seq", "256", "--global-batch", str(batch), "--network-gbs", "25"]
    devices = ",".join(f"{t}:{n * per_node}" for t, n in zip(types, nodes))
    simulate = ",".join(  # names no installed inventory holds
        f"hyp{i}n[1-{n}]:{t}:{per_node}" if n > 1 else f"hyp{i}n1:{t}:{per_node}"
        for i, (t, n) in enumerate(zip(types, nodes))
    )
    planned = json.loads(run("plan", "--devices", devices, "--per-node", str(per_node), "--json", *common))
    launched = json.loads(run("launch", "--dry-run", "--simulate", simulate, "--json", *common))
    assert layout_keys(launched["plan"]) == layout_keys(planned)
    assert launched["kind"] == planned["kind"] and launched["world_size"] == planned["world_size"]
    table = run("plan", "--devices", devices, "--per-node", str(per_node), *common)
    shown = run("launch", "--dry-run", "--simulate", simulate, *common)
    assert shown.startswith(table.rstrip("\n") + "\n\n")


def _layout(kind: LayoutKind, tps: tuple[int, ...], dp: int = 1) -> Layout:
    stages = tuple(
        StagePlan(i, i, "a100_80g", t, i, i + 1, 0, 1.0, 2.0, 0.1, 0.1, 1.0, 2.0, dp)
        for i, t in enumerate(tps)
    )
    pipelines = (
        (PipelinePlan(stages, (8,), 2, 0),)
        if kind != LayoutKind.DATA
        else tuple(PipelinePlan((s,), (8,), 2, i) for i, s in enumerate(stages))
    )
    return Layout(kind, (), pipelines, 8, 1.0, None, 1.0)


def test_the_runtime_refuses_what_torch_cannot_express_and_runs_the_rest() -> None:
    assert unrunnable_reason(_layout(LayoutKind.PIPELINE, (1, 2, 4))) is None  # tp differs by stage
    assert unrunnable_reason(_layout(LayoutKind.DATA, (2, 2))) is None
    assert "PipelineStage" in (unrunnable_reason(_layout(LayoutKind.STAGED, (1, 2), dp=2)) or "")
    assert "DTensor" in (unrunnable_reason(_layout(LayoutKind.DATA, (1, 2))) or "")


def test_default_search_is_what_launch_runs_and_by_name_anything() -> None:
    assert search_kinds((), None) == (LayoutKind.PIPELINE, LayoutKind.DATA)
    assert search_kinds((LayoutKind.STAGED,), None) == (LayoutKind.STAGED,)


def test_launch_refuses_staged_in_one_line_and_plan_notes_it() -> None:
    common = ["--model", "gpt2", "--seq", "256", "--global-batch", "64", "--kind", "staged"]
    result = CliRunner().invoke(
        cli, ["launch", "--dry-run", "--simulate", "a1:a100_80g:4,l1:l40s:2", "--network-gbs", "25", *common]
    )
    assert result.exit_code == 1
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("slurm-hetero: cannot run the staged layout planned for gpt2: ")
    assert "PipelineStage" in line
    assert "launch refuses this layout" in run("plan", "--devices", "a100_80g:4,l40s:2", *common)
