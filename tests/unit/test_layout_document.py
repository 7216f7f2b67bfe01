"""The SLURM_HETERO_LAYOUT document: one typed class (`slurm_hetero.layout.RankLayout`) that the
launcher writes and training code reads, with the version-1 JSON keys of the contract."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from slurm_hetero import layout, training
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.launch import run
from slurm_hetero.launch.plan import LaunchOptions, LaunchPlan, build_plan
from slurm_hetero.layout import GroupSpec, LayoutError, RankLayout
from slurm_hetero.slurm.jobenv import parse_job_env
from tests.conftest import FIXTURES, REPO

EXAMPLE = REPO / "gres_conf" / "examples" / "mixed.yaml"
GPT2 = LaunchOptions("gpt2", global_batch=16, seq=128, measured={"ascend910b3": 120.0})
# The version-1 keys (DESIGN.md "Launcher environment"; the launcher manual in launch.run).
KEYS = (
    "version rank world_size local_rank local_world_size node type vendor kind model global_batch "
    "num_layers stage num_stages replica num_replicas tp_rank tp_size layer_start layer_end "
    "micro_batch micro_batches samples sample_offset grad_weight recompute prev_rank next_rank "
    "groups predicted_step_s even_step_s bound_step_s efficiency dtype zero_stage attention recompute_mode"
).split()


def het_job_plan(task: int = 0) -> LaunchPlan:
    """The plan of the real 3-component job (Slurm 22.05 dump) on the example inventory."""
    lines = (FIXTURES / "slurm_env" / f"hetjob3_srun_task{task}.env.txt").read_text().splitlines()
    env = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    job = parse_job_env(env)
    return build_plan(job, job.step_id, inventory.load(EXAMPLE), load_catalog(), GPT2, job.devices)


@pytest.fixture(scope="module")
def plan() -> LaunchPlan:
    return het_job_plan()


def document(plan: LaunchPlan, rank: int = 3) -> dict[str, Any]:
    return plan.ranks[rank].layout.to_dict()


def test_every_rank_round_trips_through_json(plan: LaunchPlan) -> None:
    for r in plan.ranks:
        assert RankLayout.from_json(r.layout.to_json()) == r.layout
        assert RankLayout.from_dict(json.loads(json.dumps(r.layout.to_dict()))) == r.layout


def test_written_by_the_launcher_read_by_current(plan: LaunchPlan, tmp_path: Path) -> None:
    rank = plan.ranks[2]
    path = run.write_layout(rank, tmp_path)
    assert path == tmp_path / "rank-2.json"
    me = layout.current({"SLURM_HETERO_LAYOUT": str(path)})
    assert me == rank.layout and me.group("dp").ranks == rank.layout.group("dp").ranks
    assert training.as_dict(me) == json.loads(path.read_text())


def test_the_json_keys_stay_those_of_version_1(plan: LaunchPlan) -> None:
    doc = document(plan)
    assert list(doc) == KEYS
    older = {k: v for k, v in doc.items() if k not in ("dtype", "zero_stage", "attention", "recompute_mode")}
    assert RankLayout.from_dict(older).attention == "flash"  # documents before the cost keys still read
    assert all(list(g) == ["name", "ranks", "backend", "comm", "env"] for g in doc["groups"])
    assert all(isinstance(g["ranks"], list) for g in doc["groups"])
    assert doc["version"] == 1 and doc["vendor"] == "ascend"


def test_unknown_keys_are_ignored_for_later_versions(plan: LaunchPlan) -> None:
    doc = document(plan) | {"added_in_a_later_release": [1, 2]}
    doc["groups"][0]["also_new"] = True
    assert RankLayout.from_dict(doc) == plan.ranks[3].layout


def mutate(doc: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(doc))
    for key, value in change.items():
        if key.startswith("group."):
            out["groups"][0][key.removeprefix("group.")] = value
        elif value is KeyError:
            del out[key]
        else:
            out[key] = value
    return out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 2}, "layout version 2; this slurm-hetero reads 1"),
        ({"version": KeyError}, "layout version None"),
        ({"world_size": KeyError}, "missing key 'world_size'"),
        ({"stage": "1"}, "stage must be int, got '1'"),
        ({"rank": True}, "rank must be int, got True"),
        ({"grad_weight": "half"}, "grad_weight must be float, got 'half'"),
        ({"prev_rank": 1.5}, "prev_rank must be int or null, got 1.5"),
        ({"groups": {"dp": [0]}}, "groups must be a list"),
        (
            {"group.backend": None},
            r"each group needs name, ranks, backend and comm \(non-empty text\) and env",
        ),
        ({"group.ranks": ["0", 1]}, "ranks must be a list of integers"),
        ({"group.env": {"NCCL_IB_HCA": 5}}, "env must map names to strings"),
        ({"group.ranks": [0, 1]}, "must include rank 3"),
        ({"rank": 4}, r"rank must be in \[0, world_size\)"),
        ({"layer_end": 99}, r"layers must lie in \[0, num_layers\]"),
        ({"tp_rank": 1}, r"tp_rank must be in \[0, tp_size\)"),
        ({"micro_batch": 0}, "micro_batches of micro_batch must hold samples"),  # adv40 R24mb
        ({"micro_batches": 0}, "micro_batches of micro_batch must hold samples"),  # adv42 54
        ({"micro_batches": 1000}, "micro_batches of micro_batch must hold samples, only the last one short"),
        ({"kind": "staged"}, "kind must be pipeline or data"),  # adv46 F25: launch does not run it
        ({"recompute": 1000}, "recompute must be 0 to the stage's layers"),  # adv46 F14
    ],
)
def test_a_malformed_document_is_a_clear_error(
    plan: LaunchPlan, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(LayoutError, match=f"^rank-3.json: .*{message}"):
        RankLayout.from_dict(mutate(document(plan), change), "rank-3.json")


def test_files_that_are_not_layouts(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.json"
    for text, message in (
        ("{", "not JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"version": 1, "rank": 0}', "missing key 'world_size'"),
    ):
        path.write_text(text)
        with pytest.raises(LayoutError, match=message):
            layout.from_file(path)
    with pytest.raises(LayoutError, match="no such layout document"):
        layout.from_file(tmp_path / "missing.json")
    # adv41 83-87: binary, deep, a FIFO (it blocked) and /dev/zero (read until memory ran out)
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{}")
    (tmp_path / "deep.json").write_text("[" * 100_000)
    os.mkfifo(tmp_path / "fifo")
    for name, message in (
        ("binary.json", "is not UTF-8 text"),
        ("deep.json", "nested too deeply"),
        ("fifo", "layout document is a FIFO"),
        ("/dev/zero", "layout document is a character device"),
    ):
        with pytest.raises(LayoutError, match=message):
            layout.from_file(tmp_path / name)
    with pytest.raises(LayoutError, match="SLURM_HETERO_LAYOUT is not set"):
        layout.current({})


def test_training_validates_what_it_is_given(plan: LaunchPlan) -> None:
    me = plan.ranks[0].layout
    assert training.rank_layout(me) == me
    with pytest.raises(
        LayoutError, match="the layout passed to init: tp_rank 0 of tp_size 3 is not its place"
    ):
        training.rank_layout(dataclasses.replace(me, tp_size=3))  # a RankLayout is checked too
    assert training.rank_layout(me.to_dict()) == me
    with pytest.raises(LayoutError, match="the layout passed to init: missing key 'groups'"):
        training.rank_layout({k: v for k, v in me.to_dict().items() if k != "groups"})


def test_groups_and_their_lookup() -> None:
    dp = GroupSpec("dp", (0, 2), "nccl", "vendor-ccl", {"NCCL_IB_HCA": "mlx5_0"})
    assert GroupSpec.from_dict(dp.to_dict()) == dp
    assert GroupSpec("pp", (1,), "gloo", "cpu-relay").to_dict()["env"] == {}
    with pytest.raises(LayoutError, match="rank 0 is in no 'ep' group"):
        het_job_plan().ranks[0].layout.group("ep")
