"""The launch plan: every rank, from its own Slurm environment, computes the same layout and gets a
unique rank, the same rendezvous and its own device; plus dry runs that start nothing."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import subprocess
import time
import tracemalloc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.core import proc
from slurm_hetero.core.errors import RequestError
from slurm_hetero.core.model import ClusterInventory, Device, Nic, NodeInventory
from slurm_hetero.engine import limits
from slurm_hetero.engine.layout import LayoutKind
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.launch import run
from slurm_hetero.launch.plan import (
    LaunchOptions,
    LaunchPlan,
    LaunchPlanError,
    build_plan,
    layout_spec,
    master_port,
    sites,
)
from slurm_hetero.layout import RankLayout
from slurm_hetero.slurm.jobenv import parse_job_env
from tests.conftest import FIXTURES, REPO

CATALOG = load_catalog()
EXAMPLE = REPO / "gres_conf" / "examples" / "mixed.yaml"
MEASURED = {"ascend910b3": 120.0}
GPT2 = LaunchOptions("gpt2", global_batch=16, seq=128, measured=MEASURED)


def fixture_env(task: int, as_captured: bool = False) -> dict[str, str]:
    """Task `task`'s environment in the real three-component job. Its third component gave its one
    task 4 NPUs, which launch refuses (3 would sit idle): unless `as_captured`, narrowed to the one
    NPU that `--gres=gpu:ascend910:1` would give it."""
    lines = (FIXTURES / "slurm_env" / f"hetjob3_srun_task{task}.env.txt").read_text().splitlines()
    env = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    if task == 3 and not as_captured:
        env |= {"SLURM_STEP_GPUS": "0", "SLURM_GPUS_ON_NODE": "1"}
    return env


def node(name: str, gres_type: str, count: int, nics: tuple[Nic, ...] = ()) -> NodeInventory:
    spec = CATALOG.by_type(gres_type)
    assert spec is not None
    devices = tuple(
        Device(spec.vendor, spec.name, i, f"/dev/x{i}", spec.memory_mib, spec.type) for i in range(count)
    )
    return NodeInventory(name, devices, nics=nics)


def slurm_env(nodes: Sequence[tuple[str, int]], rank: int, het: bool = False) -> dict[str, str]:
    """A task's environment in a step over `nodes` (name, tasks), block-distributed."""
    firsts = list(itertools.accumulate([0, *(n for _, n in nodes)]))
    index = max(i for i, f in enumerate(firsts[:-1]) if f <= rank)
    name, tasks = nodes[index]
    env = {
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank - firsts[index]),
        "SLURMD_NODENAME": name,
        "SLURM_STEP_NUM_TASKS": str(firsts[-1]),
        "SLURM_JOB_ID": "42",
        "SLURM_STEP_ID": "3",
        "SLURM_STEP_GPUS": ",".join(map(str, range(tasks))),
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(tasks))),
    }
    if not het:
        env["SLURM_STEP_NODELIST"] = ",".join(n for n, _ in nodes)
        env["SLURM_STEP_TASKS_PER_NODE"] = ",".join(str(t) for _, t in nodes)
        return env
    env["SLURM_HET_SIZE"] = str(len(nodes))
    in_name_order = sorted(nodes)  # as Slurm 22.05 lists the step's nodes, even in het steps
    env["SLURM_STEP_NODELIST"] = ",".join(n for n, _ in in_name_order)
    env["SLURM_STEP_TASKS_PER_NODE"] = ",".join(str(t) for _, t in in_name_order)
    for k, (n, t) in enumerate(nodes):
        env[f"SLURM_JOB_NODELIST_HET_GROUP_{k}"] = n
        env[f"SLURM_TASKS_PER_NODE_HET_GROUP_{k}"] = str(t)
        env[f"SLURM_JOB_ID_HET_GROUP_{k}"] = str(42 + k)
    return env


def plan_from(env: Mapping[str, str], inv: ClusterInventory, options: LaunchOptions = GPT2) -> LaunchPlan:
    job = parse_job_env(env)
    return build_plan(job, job.step_id, inv, CATALOG, options, job.devices)


def own(plan: LaunchPlan, env: Mapping[str, str]) -> dict[str, str]:
    return plan.ranks[int(env["SLURM_PROCID"])].env


def assert_consistent(plans: Sequence[LaunchPlan], envs: Sequence[Mapping[str, str]]) -> None:
    """What every rank derived on its own agrees, and the layout itself is coherent."""
    assert len({p.plan_id for p in plans}) == 1
    typed = [p.ranks[i].layout for i, p in enumerate(plans)]
    assert typed == [r.layout for r in plans[0].ranks]  # each rank's view of each rank is the same
    docs = [d.to_dict() for d in typed]  # the JSON documents, as training code reads them
    mine = [own(p, e) for p, e in zip(plans, envs)]
    assert sorted(int(e["RANK"]) for e in mine) == list(range(len(envs)))
    for key in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_HETERO_PLAN_ID"):
        assert len({e[key] for e in mine}) == 1, key
    for env, e in zip(envs, mine):
        assert e["RANK"] == env["SLURM_PROCID"] and e["LOCAL_RANK"] == env["SLURM_LOCALID"]
        assert docs[int(e["RANK"])]["node"] == env["SLURMD_NODENAME"]
    assert_groups(docs)
    assert_batch_and_layers(docs)


def assert_groups(docs: Sequence[Mapping[str, Any]]) -> None:
    listed: dict[tuple[str, tuple[int, ...]], Any] = {}
    for d in docs:
        assert [g["name"] for g in d["groups"]] in (["tp", "dp", "pp"], ["tp", "dp", "pp", "dp_local"])
        for g in d["groups"]:
            key = (g["name"], tuple(g["ranks"]))
            assert d["rank"] in g["ranks"] and g["ranks"] == sorted(g["ranks"])
            assert listed.setdefault(key, (g["backend"], g["comm"])) == (g["backend"], g["comm"])
    for (name, ranks), _ in listed.items():  # every member lists the group
        for r in ranks:
            assert (name, list(ranks)) in [(g["name"], g["ranks"]) for g in docs[r]["groups"]]
        members = [docs[r] for r in ranks]
        if name == "tp":
            assert len({m["node"] for m in members}) == 1 and len(ranks) == members[0]["tp_size"]
        if name == "dp":
            assert len({(m["layer_start"], m["layer_end"]) for m in members}) == 1
        if name == "dp_local":  # a dp group's members of one vendor, where it spans vendors
            dp = next(g["ranks"] for g in members[0]["groups"] if g["name"] == "dp")
            assert set(ranks) < set(dp) and len({m["vendor"] for m in members}) == 1
            assert {docs[r]["vendor"] for r in dp} - {members[0]["vendor"]}
    for d in docs:
        if d["next_rank"] is not None:
            nxt = docs[d["next_rank"]]
            assert nxt["prev_rank"] == d["rank"] and nxt["stage"] == d["stage"] + 1


def assert_batch_and_layers(docs: Sequence[Mapping[str, Any]]) -> None:
    replicas = {d["replica"]: d for d in docs}
    assert sorted(replicas) == list(range(docs[0]["num_replicas"]))
    offset = 0
    for r in sorted(replicas):
        assert replicas[r]["sample_offset"] == offset
        offset += replicas[r]["samples"]
    assert offset == docs[0]["global_batch"]
    assert sum(replicas[r]["grad_weight"] for r in replicas) == pytest.approx(1.0)
    for r in replicas:
        spans = sorted({(d["layer_start"], d["layer_end"]) for d in docs if d["replica"] == r})
        assert spans[0][0] == 0 and spans[-1][1] == docs[0]["num_layers"]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


# -- real heterogeneous-job environments ---------------------------------------------------------


def test_every_task_of_the_real_het_job_derives_the_same_plan() -> None:
    inv = inventory.load(EXAMPLE)
    envs = [fixture_env(t) for t in range(4)]
    plans = [plan_from(env, inv) for env in envs]
    assert_consistent(plans, envs)
    mine = [own(p, e) for p, e in zip(plans, envs)]
    assert {e["MASTER_ADDR"] for e in mine} == {"a100n1"}  # first node in component order
    assert {e["MASTER_PORT"] for e in mine} == {str(master_port("7", 0))}
    assert [p.ranks[i].type for i, p in enumerate(plans)] == ["a100_80g", "a100_80g", "l40s", "ascend910b3"]
    assert [e.get("CUDA_VISIBLE_DEVICES") for e in mine] == ["0", "1", "0", None]  # Ascend reads its own
    assert mine[3]["ASCEND_RT_VISIBLE_DEVICES"] == "0" and "ASCEND_RT_VISIBLE_DEVICES" not in mine[0]


def test_a_task_given_more_devices_than_it_runs_is_refused_as_captured() -> None:
    with pytest.raises(LaunchPlanError, match="ascendn1 runs 1 task but Slurm gave the step 4 device"):
        plan_from(fixture_env(3, as_captured=True), inventory.load(EXAMPLE))


def test_layout_file_path_and_master_port_come_from_job_and_step() -> None:
    assert master_port("7", 0) == 10000 + 7 * 64 and master_port("42", 3) == 10000 + 42 * 64 + 3
    env = fixture_env(0)
    options = dataclasses.replace(GPT2, layout_dir="/scratch/slurm-hetero-7.0", master_addr="10.0.0.1")
    mine = own(plan_from(env, inventory.load(EXAMPLE), options), env)
    assert mine["SLURM_HETERO_LAYOUT"] == "/scratch/slurm-hetero-7.0/rank-0.json"
    assert mine["MASTER_ADDR"] == "10.0.0.1"


# -- synthetic steps: interleaved types, het components ------------------------------------------

INTERLEAVED = [("n1", 2), ("n2", 1), ("n3", 2)]
TYPES = {"n1": "a100_80g", "n2": "l40s", "n3": "a100_80g"}


def interleaved_inventory(nics: tuple[Nic, ...] = ()) -> ClusterInventory:
    return ClusterInventory(tuple(node(n, TYPES[n], 4, nics) for n in ("n1", "n2", "n3")))


@pytest.mark.parametrize(("het", "tp_sizes"), [(False, (1,)), (True, (1,)), (False, (1, 2, 4, 8))])
def test_interleaved_node_types_map_solver_ranks_onto_slurm_ranks(
    het: bool, tp_sizes: tuple[int, ...]
) -> None:
    envs = [slurm_env(INTERLEAVED, r, het) for r in range(5)]
    options = dataclasses.replace(GPT2, tp_sizes=tp_sizes)
    plans = [plan_from(env, interleaved_inventory(), options) for env in envs]
    assert_consistent(plans, envs)
    docs = [r.layout.to_dict() for r in plans[0].ranks]
    assert [d["node"] for d in docs] == ["n1", "n1", "n2", "n3", "n3"]
    assert [d["type"] for d in docs] == ["a100_80g", "a100_80g", "l40s", "a100_80g", "a100_80g"]
    assert [d["local_rank"] for d in docs] == [0, 1, 0, 0, 1]


def test_het_components_follow_component_order_not_the_sorted_node_list() -> None:
    nodes = [("n3", 2), ("n2", 1)]
    envs = [slurm_env(nodes, r, het=True) for r in range(3)]
    plans = [plan_from(env, interleaved_inventory()) for env in envs]
    assert_consistent(plans, envs)
    assert [r.node for r in plans[0].ranks] == ["n3", "n3", "n2"]
    assert {own(p, e)["MASTER_ADDR"] for p, e in zip(plans, envs)} == {"n3"}


def test_even_split_gives_equal_layers_and_samples() -> None:
    env = slurm_env(INTERLEAVED, 0)
    options = dataclasses.replace(GPT2, global_batch=15, even=True)
    docs = [r.layout.to_dict() for r in plan_from(env, interleaved_inventory(), options).ranks]
    layers = {(d["replica"], d["stage"]): d["layer_end"] - d["layer_start"] for d in docs}
    assert max(layers.values()) - min(layers.values()) <= 1
    samples = {d["replica"]: d["samples"] for d in docs}
    assert max(samples.values()) - min(samples.values()) <= 1 and sum(samples.values()) == 15
    assert docs[0]["predicted_step_s"] == pytest.approx(docs[0]["even_step_s"])


def test_backend_override_and_cross_vendor_groups() -> None:
    env = fixture_env(3)
    inv = inventory.load(EXAMPLE)
    plain = plan_from(env, inv).ranks
    comms = {(g.name, g.backend, g.comm) for r in plain for g in r.layout.groups}
    assert ("pp", "gloo", "cpu-relay") in comms  # nvidia and ascend stages: no common RDMA path
    assert ("tp", "hccl", "vendor-ccl") in comms or ("dp", "hccl", "vendor-ccl") in comms
    forced = plan_from(env, inv, dataclasses.replace(GPT2, backend_override="gloo")).ranks
    assert {(g.backend, g.comm) for r in forced for g in r.layout.groups} == {("gloo", "cpu-relay")}


def test_rdma_nics_give_direct_cross_vendor_groups_and_their_variables() -> None:
    ib = (Nic("mlx5_0", "infiniband"), Nic("eth0", "ethernet"))
    inv = ClusterInventory((node("n1", "a100_80g", 2, ib), node("n2", "mi300x", 2, ib)))
    env = slurm_env([("n1", 2), ("n2", 2)], 0)
    options = dataclasses.replace(GPT2, model="llama-2-7b", seq=1024, global_batch=8, tp_sizes=(1,))
    rank0 = plan_from(env, inv, options).ranks[0]
    assert rank0.layout.kind == "pipeline"  # a100 and mi300x stages: the pp group crosses vendors
    cross = [g for g in rank0.layout.groups if g.comm == "rdma-direct"]
    assert cross and cross[0].backend == "ucc" and cross[0].env == {"UCX_NET_DEVICES": "mlx5_0:1"}
    same = [g for g in rank0.layout.groups if g.comm == "vendor-ccl"]
    assert all(g.env == {"NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_IFNAME": "eth0"} for g in same)
    assert rank0.env.get("NCCL_IB_HCA", "mlx5_0") == "mlx5_0"


def test_a_data_parallel_group_across_vendors_lists_each_vendors_part() -> None:
    """Data parallel replicas on a100 and mi300x: the dp group crosses vendors through gloo, and each
    rank also gets its vendor's part of it (`dp_local`, on the vendor's library) for the
    hierarchical gradient all-reduce; ranks of a one-vendor dp group get none."""
    inv = ClusterInventory((node("n1", "a100_80g", 4), node("n2", "mi300x", 4)))
    options = dataclasses.replace(GPT2, tp_sizes=(1,), kinds=(LayoutKind.DATA,))
    envs = [slurm_env([("n1", 4), ("n2", 4)], r) for r in range(8)]
    plans = [plan_from(e, inv, options) for e in envs]
    assert_consistent(plans, envs)
    docs = [r.layout for r in plans[0].ranks]
    assert docs[0].kind == "data" and docs[0].group("dp").comm == "cpu-relay", docs[0].num_stages
    for d in docs:
        local = d.group("dp_local")
        assert local.comm == "vendor-ccl" and {docs[r].vendor for r in local.ranks} == {d.vendor}
        part = [r for r in docs if r.vendor == d.vendor and r.stage == d.stage and r.tp_rank == d.tp_rank]
        assert local.backend != "gloo" and len(local.ranks) == len(part) > 1
    nvidia = ClusterInventory((node("n1", "a100_80g", 4), node("n2", "a100_80g", 4)))
    one_vendor = plan_from(envs[0], nvidia, dataclasses.replace(GPT2, tp_sizes=(1,)))
    assert all("dp_local" not in [g.name for g in r.layout.groups] for r in one_vendor.ranks)


def test_the_solver_prices_cross_vendor_traffic_at_the_relay() -> None:
    job = parse_job_env(fixture_env(0))
    nodes = sites(job, inventory.load(EXAMPLE), CATALOG)
    relay = 1 / (2 / 25 + 1 / 12.5)  # two PCIe copies and a 100 GbE NIC (none listed)
    assert min(layout_spec(nodes, CATALOG, GPT2)[0].pair_gbs.values()) == pytest.approx(relay)
    assert min(
        layout_spec(nodes, CATALOG, dataclasses.replace(GPT2, network_gbs=50))[0].pair_gbs.values()
    ) == pytest.approx(1 / (2 / 25 + 1 / 50))
    one_vendor = [s for s in nodes if s.vendor.name == "nvidia"]
    assert set(layout_spec(one_vendor, CATALOG, GPT2)[0].pair_gbs.values()) <= {12.5}


def test_a_profiles_network_figure_stands_for_the_nics_and_network_gbs_for_both() -> None:
    job = parse_job_env(fixture_env(0))
    nodes = [s for s in sites(job, inventory.load(EXAMPLE), CATALOG) if s.vendor.name == "nvidia"]
    types = {s.spec.type for s in nodes}

    def nics(options: LaunchOptions) -> set[float]:
        return {g.nic_gbs for g in layout_spec(nodes, CATALOG, options)[0].groups}

    assert nics(GPT2) == {12.5}  # none listed
    measured = dataclasses.replace(GPT2, network=dict.fromkeys(types, 3.0))
    assert nics(measured) == {3.0}
    assert nics(dataclasses.replace(measured, network_gbs=50)) == {50.0}


# -- devices -------------------------------------------------------------------------------------


def test_each_rank_sees_one_device_narrowed_from_slurms_binding() -> None:
    env = slurm_env([("n1", 2)], 1)
    env |= {"SLURM_STEP_GPUS": "2,5", "CUDA_VISIBLE_DEVICES": "0,1"}  # cgroup-renumbered
    nvidia = ClusterInventory((node("n1", "a100_80g", 8),))
    assert own(plan_from(env, nvidia), env)["CUDA_VISIBLE_DEVICES"] == "1"
    ascend = ClusterInventory((node("n1", "ascend910b3", 8),))
    mine = own(plan_from(env, ascend), env)  # Slurm's CUDA_ (a gres.conf without Flags=) is not Ascend's
    assert mine["ASCEND_RT_VISIBLE_DEVICES"] == "5" and "CUDA_VISIBLE_DEVICES" not in mine
    env |= {"SLURM_STEP_GPUS": "6", "CUDA_VISIBLE_DEVICES": "6"}  # --gpus-per-task=1
    assert own(plan_from(env, ascend), env)["ASCEND_RT_VISIBLE_DEVICES"] == "6"


def test_rocm_ranks_get_their_device_in_rocr_and_position_zero_in_hip() -> None:
    # one level per runtime: ROCR_VISIBLE_DEVICES names the device, HIP/CUDA index inside it
    inv = ClusterInventory((node("n1", "mi300x", 8),))
    env = slurm_env([("n1", 2)], 1)
    env |= {"SLURM_STEP_GPUS": "2,5", "ROCR_VISIBLE_DEVICES": "2,5", "CUDA_VISIBLE_DEVICES": "2,5"}
    mine = own(plan_from(env, inv), env)
    assert (mine["ROCR_VISIBLE_DEVICES"], mine["HIP_VISIBLE_DEVICES"], mine["CUDA_VISIBLE_DEVICES"]) == (
        "5",
        "0",
        "0",
    )


# -- errors before anything starts ---------------------------------------------------------------


def test_a_model_that_cannot_fit_is_one_root_cause_line() -> None:
    env = slurm_env([("n2", 2)], 0)
    inv = ClusterInventory((node("n2", "l40s", 2),))
    with pytest.raises(LaunchPlanError) as e:
        plan_from(env, inv, LaunchOptions("llama-3-70b", global_batch=8, seq=2048))
    message = str(e.value)
    assert message.startswith("root cause: llama-3-70b") and "\n" not in message
    assert "GiB" in message and "2x l40s" in message and "n2" in message


def test_a_family_with_no_shape_is_refused_as_that_not_as_memory() -> None:
    """adv33 F30: --kind staged on one device of each type was a `root cause:` line about memory
    that fit; the family has no shape there."""
    env = slurm_env([("n1", 1), ("n2", 1)], 0)
    inv = ClusterInventory((node("n1", "a100_80g", 1), node("n2", "l40s", 1)))
    kinds = (LayoutKind.STAGED,)
    with pytest.raises(LaunchPlanError) as e:
        plan_from(env, inv, dataclasses.replace(GPT2, kinds=kinds))
    message = str(e.value)
    assert message.startswith("cannot plan gpt2 on 2 devices (1x a100_80g") and "root cause" not in message
    assert message.endswith(
        "degree 1, which is the pipeline family's shape; use --kind pipeline or leave --kind out"
    )


@pytest.mark.parametrize(
    ("inv", "needle"),
    [
        (ClusterInventory((node("n1", "a100_80g", 4),)), "no inventory record for n2"),
        (ClusterInventory((node("n1", "a100_80g", 1), node("n2", "l40s", 1))), "runs 2 tasks but has 1"),
        (
            ClusterInventory(
                (
                    dataclasses.replace(
                        node("n1", "a100_80g", 2),
                        devices=(*node("n1", "a100_80g", 2).devices, *node("x", "l40s", 1).devices),
                    ),
                    node("n2", "l40s", 2),
                )
            ),
            # adv49 rows 200-202: the line said "launch uses one" and no way on
            r"several types \(a100_80g, l40s\); launch plans one type per node: run the step on nodes of one",
        ),
    ],
)
def test_allocation_problems_are_named(inv: ClusterInventory, needle: str) -> None:
    with pytest.raises(LaunchPlanError, match=needle):
        plan_from(slurm_env([("n1", 2), ("n2", 2)], 0), inv)


# -- dry runs ------------------------------------------------------------------------------------


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a dry run started something: {args}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(proc, "run", refuse)
    for name in ("execvpe", "execvp", "execv", "execve", "fork", "system"):
        monkeypatch.setattr(os, name, refuse)


@pytest.mark.usefixtures("nothing_starts")
def test_dry_run_under_srun_prints_every_rank_on_rank_zero_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    options = run.RunOptions(("python", "train.py"), inventory=EXAMPLE, dry_run=True, as_json=True)
    environ = fixture_env(0) | {"TMPDIR": str(tmp_path)}
    assert run.launch(GPT2, options, environ) == 0
    document = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in document["ranks"]] == [0, 1, 2, 3]
    assert document["ranks"][3]["env"]["ASCEND_RT_VISIBLE_DEVICES"] == "0"
    plan = plan_from(fixture_env(0), inventory.load(EXAMPLE))
    groups = document["groups"]  # every group once; a rank's layout names them by place
    docs = [
        RankLayout.from_dict({**r["layout"], "groups": [groups[i] for i in r["layout"]["groups"]]})
        for r in document["ranks"]
    ]
    assert docs == [r.layout for r in plan.ranks]
    assert not any(tmp_path.iterdir())  # wrote nothing
    assert run.launch(GPT2, options, fixture_env(2)) == 0
    assert capsys.readouterr().out == ""


@pytest.mark.usefixtures("nothing_starts")
def test_dry_run_simulates_an_allocation_outside_slurm(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run, "DEFAULT_INVENTORY", Path("/nonexistent/inventory.yaml"))  # none installed
    spec = "a100n1:a100_80g:2,l40sn1:l40s:1,a100n2:a100_80g:2"
    options = run.RunOptions((), dry_run=True, simulate=spec)
    assert run.launch(GPT2, options, {}) == 0
    out = capsys.readouterr().out
    assert "pipeline layout on 5 ranks" in out or "data layout on 5 ranks" in out
    for rank in range(5):
        assert f"rank {rank}: RANK={rank} WORLD_SIZE=5" in out
    assert "GROUP  BACKEND  COMM" in out


def test_simulated_nodes_missing_from_the_installed_inventory_are_one_folded_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = ",".join([f"gn{i:03d}:a100_80g:8" for i in range(300)] + ["a100n1:a100_80g:2", "x1:l40s:1"])
    with caplog.at_level(logging.WARNING, logger="slurm_hetero.launch.run"):
        sim = run.simulated_inventory(run.parse_simulate(spec), inventory.load(EXAMPLE), CATALOG)
    assert len(sim.nodes) == 3 + 301
    assert [r.getMessage() for r in caplog.records] == [
        f"--simulate: gn[000-299],x1 (301 nodes) are not in {run.DEFAULT_INVENTORY}; they get catalog "
        "devices (gn[000-299]: a100_80g; x1: l40s)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="slurm_hetero.launch.run"):
        run.simulated_inventory(
            run.parse_simulate("a100n1:a100_80g:2,gn7:a100_80g:1"), inventory.load(EXAMPLE), CATALOG
        )
    assert [r.getMessage() for r in caplog.records] == [
        f"--simulate: gn7 is not in {run.DEFAULT_INVENTORY}; it gets catalog a100_80g devices"
    ]


def test_a_group_is_one_object_shared_by_its_members_and_its_ranks_print_folded(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dp group of every rank is not copied into each rank's document (quadratic in the ranks:
    2,048 nodes x 8 took minutes), and the dry run prints its ranks as ranges."""
    monkeypatch.setattr(run, "DEFAULT_INVENTORY", Path("/nonexistent/inventory.yaml"))
    options = run.RunOptions((), dry_run=True, simulate="n1:a100_80g:4,n2:a100_80g:4,n3:mi300x:2")
    job, plan = run.plan_step(LaunchOptions(None, global_batch=64), options, {})
    dp = [r.layout.group("dp") for r in plan.ranks]
    assert dp[0].ranks == tuple(range(10)) and all(g is dp[0] for g in dp)
    assert plan.ranks[0].layout.group("dp_local") is plan.ranks[7].layout.group("dp_local")
    assert plan.ranks[0].layout.group("dp_local").ranks == tuple(range(8))
    out = run.describe(plan)
    assert "\ndp        " in out and out.split("\ndp ")[1].split("\n")[0].endswith(" 0-9")
    assert out.split("\ndp_local ")[1].split("\n")[0].endswith(" 0-7")


def test_the_plan_id_tells_apart_inputs_that_change_a_group_and_a_rank_builds_only_its_own() -> None:
    env = slurm_env([("a", 2), ("b", 2)], 0)
    inv = ClusterInventory((node("a", "a100_80g", 2), node("b", "a100_80g", 2)))
    options = LaunchOptions(None, global_batch=8)
    plan = plan_from(env, inv, options)
    gloo = plan_from(env, inv, dataclasses.replace(options, backend_override="gloo"))
    assert plan.ranks[3].layout.groups[1].backend != "gloo" == gloo.ranks[3].layout.groups[1].backend
    assert gloo.plan_id != plan.plan_id == plan_from(env, inv, options).plan_id
    nic = ClusterInventory((node("a", "a100_80g", 2, (Nic("ib0", "infiniband"),)), inv.nodes[1]))
    assert plan_from(env, nic, options).plan_id != plan.plan_id
    job = parse_job_env(env)
    own = build_plan(job, job.step_id, inv, CATALOG, options, only=3)
    assert own.ranks == (plan.ranks[3],) and own.plan_id == plan.plan_id


@pytest.mark.usefixtures("nothing_starts")
def test_simulated_nodes_in_the_inventory_keep_their_records(capsys: pytest.CaptureFixture[str]) -> None:
    options = run.RunOptions((), inventory=EXAMPLE, dry_run=True, simulate="a100n1:a100:2,l40sn1:l40s:2")
    assert run.launch(GPT2, options, {}) == 0
    assert "a100_80g" in capsys.readouterr().out
    wrong = dataclasses.replace(options, simulate="a100n1:l40s:2")
    with pytest.raises(
        run.LaunchError, match="the inventory has a100n1 with a100_80g; simulate a100n1:a100_80g$"
    ):
        run.launch(GPT2, wrong, {})


def test_cli_dry_run_json_and_one_line_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["launch", "--model", "gpt2", "--global-batch", "8", "--seq", "64", "--dry-run"]
    result = runner.invoke(cli, [*base, "--json", "--simulate", "a:l40s:2,b:a100_80g:1"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["world_size"] == 3
    bad = runner.invoke(cli, ["launch", "--model", "llama-3-70b", "--dry-run", "--simulate", "a:l40s:1"])
    assert bad.exit_code == 1 and bad.output.startswith("slurm-hetero: root cause: llama-3-70b")
    assert len(bad.output.strip().splitlines()) == 1
    nodry = runner.invoke(cli, [*base[:-1], "--simulate", "a:l40s:1", "--", "true"])
    assert nodry.exit_code == 1 and "--dry-run" in nodry.output


def test_launch_refuses_the_staged_family_and_plans_uniform_tensor_parallel_replicas() -> None:
    runner = CliRunner()
    args = [
        "launch",
        "--model",
        "gpt2",
        "--kind",
        "staged",
        "--dry-run",
        "--simulate",
        "a:l40s:2,b:a100_80g:2",
    ]
    staged = runner.invoke(cli, args)
    assert staged.exit_code == 1 and "cannot run the staged layout" in staged.output
    assert len(staged.output.strip().splitlines()) == 1 and "PipelineStage" in staged.output
    job = parse_job_env(fixture_env(0))
    nodes = sites(job, inventory.load(EXAMPLE), CATALOG)
    spec, _ = layout_spec(nodes, CATALOG, dataclasses.replace(GPT2, tp_sizes=(1, 2)))
    assert not spec.mixed_tp and spec.kinds == (LayoutKind.PIPELINE, LayoutKind.DATA)


GQA_40_10 = {"model_type": "llama", "hidden_size": 640, "num_attention_heads": 40, "num_key_value_heads": 10,
             "intermediate_size": 1024, "num_hidden_layers": 2, "vocab_size": 100}  # fmt: skip


def test_tensor_parallel_degrees_never_split_heads_or_kv_heads_unevenly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The solver took --tp-sizes (and plan's 1,2,4,8) as given: gpt2's 12 heads went to tp=8, and
    40 heads with 10 kv heads to tp=4 (2.5 kv heads a rank)."""
    from slurm_hetero.cli import plan as plan_cli
    from slurm_hetero.engine.modelcost import usable_tp_sizes
    from slurm_hetero.engine.modelfamilies import from_hf_config
    from slurm_hetero.inventory.modelconfigs import load_model

    assert usable_tp_sizes(load_model("gpt2"), (1, 2, 4, 8)) == (1, 2, 4)
    gqa = from_hf_config(GQA_40_10, "gqa")
    assert usable_tp_sizes(gqa, (1, 2, 4, 5, 8, 20, 40)) == (1, 2, 5, 20, 40)  # 20, 40: replicated
    runner = CliRunner()
    base = ["launch", "--model", "gpt2", "--global-batch", "8", "--seq", "64", "--dry-run", "--json"]
    only8 = runner.invoke(cli, [*base, "--simulate", "a:a100_80g:8", "--tp-sizes", "8"])
    assert only8.exit_code == 1, only8.output
    assert only8.output == "slurm-hetero: tp: tp=8 does not divide the 12 attention heads of gpt2\n"
    seen: list[tuple[int, ...]] = []
    real = plan_cli.LayoutSpec

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["tp_sizes"])
        return real(*args, **kwargs)

    monkeypatch.setattr(plan_cli, "LayoutSpec", spy)
    result = runner.invoke(cli, ["plan", "--devices", "a100_80g:8", "--model", "gpt2", "--global-batch", "8"])
    assert result.exit_code == 0, result.output
    assert seen == [(1, 2, 4)]


def test_a_rank_gets_only_its_own_vendors_visible_devices() -> None:
    """srun copies the batch host's environment: an Ascend host's ASCEND_RT_VISIBLE_DEVICES (and a
    ROCm HIP_VISIBLE_DEVICES) must not reach an NVIDIA rank's command (adv11 C15)."""
    from slurm_hetero.launch.plan import process_env

    inv = inventory.load(EXAMPLE)
    envs = [fixture_env(t) for t in range(4)]
    plans = [plan_from(env, inv) for env in envs]
    copied = {"ASCEND_RT_VISIBLE_DEVICES": "4", "HIP_VISIBLE_DEVICES": "3", "MLU_VISIBLE_DEVICES": "1"}
    nvidia = process_env({**envs[0], **copied}, own(plans[0], envs[0]))
    assert not set(copied) & set(nvidia)
    assert nvidia["CUDA_VISIBLE_DEVICES"] == "0" and nvidia["SLURM_PROCID"] == envs[0]["SLURM_PROCID"]
    ascend = process_env({**envs[3], **copied}, own(plans[3], envs[3]))
    assert ascend["ASCEND_RT_VISIBLE_DEVICES"] == "0"  # its own, not the copied 4
    assert "HIP_VISIBLE_DEVICES" not in ascend and "MLU_VISIBLE_DEVICES" not in ascend


def test_torchruns_variables_are_the_launchers_and_stale_ones_are_dropped() -> None:
    """A2-E2: a user's GROUP_RANK=5 and NODE_RANK=5 reached every rank (srun copies the shell's
    environment). Every torchrun variable the launcher knows is set; TORCHELASTIC_* dropped."""
    from slurm_hetero.launch.plan import process_env

    inv = ClusterInventory((node("n1", "a100_80g", 2), node("n2", "l40s", 1), node("n3", "a100_80g", 1)))
    steps = [("n1", 2), ("n2", 1), ("n3", 1)]
    stale = {
        "GROUP_RANK": "5", "NODE_RANK": "5", "GROUP_WORLD_SIZE": "9", "ROLE_RANK": "7",
        "ROLE_WORLD_SIZE": "99", "ROLE_NAME": "trainer", "TORCHELASTIC_RUN_ID": "old",
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "3", "OMP_NUM_THREADS": "4",
    }  # fmt: skip
    seen = []
    for rank in range(4):
        env = slurm_env(steps, rank)
        got = process_env({**env, **stale}, own(plan_from(env, inv), env))
        assert not [k for k in got if k.startswith("TORCHELASTIC_")]
        assert got["OMP_NUM_THREADS"] == "4"  # not torchrun's: the user's
        assert (got["ROLE_RANK"], got["ROLE_WORLD_SIZE"], got["ROLE_NAME"]) == (str(rank), "4", "default")
        assert got["GROUP_RANK"] == got["NODE_RANK"] and got["GROUP_WORLD_SIZE"] == "3"
        seen.append(int(got["NODE_RANK"]))
    assert seen == [0, 0, 1, 2]


def test_simulate_takes_folded_hostlists_with_the_same_checks() -> None:
    # 10,000 nodes in one short argument (spelled out they are ~190 KB, over Linux's 128 KiB limit)
    nodes = run.parse_simulate("gn[00000-09999]:a100_80g:8,x1:L40S:2")
    assert len(nodes) == 10_001
    assert nodes[0] == ("gn00000", "a100_80g", 8) and nodes[9_999] == ("gn09999", "a100_80g", 8)
    assert nodes[-1] == ("x1", "l40s", 2)
    assert run.parse_simulate("a[1,3]:l40s:1") == [("a1", "l40s", 1), ("a3", "l40s", 1)]
    job = run.simulated_job(run.parse_simulate("gn[1-3]:l40s:2"))
    assert job.nodes == ("gn1", "gn2", "gn3") and sum(job.tasks_per_node) == 6
    with pytest.raises(run.LaunchError, match="a node is listed twice"):
        run.simulated_job(run.parse_simulate("gn[1-3]:l40s:1,gn2:l40s:1"))
    with pytest.raises(run.LaunchError, match="bad entry"):
        run.parse_simulate("gn[1-3]:l40s:0")
    with pytest.raises(run.LaunchError, match="unbalanced brackets"):
        run.parse_simulate("gn[1-3:l40s:1")
    with pytest.raises(run.LaunchError, match=r"--simulate: bad range .3-x. in .gn\[3-x\]"):
        run.parse_simulate("gn[3-x]:l40s:1")


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("a1:a100_80g:2000000", "2,000,000 devices a node; a node has at most 65,536"),
        ("a1:a100_80g:99999999999", "99,999,999,999 devices a node; a node has at most 65,536"),
        ("gn[1-20000]:l40s:8", "more than 131,072 ranks"),
        ("gn[1-131072]:a100_80g:65536", "more than 131,072 ranks"),
        ("a1:l40s:65536,gn[1-65536]:l40s:2", "more than 131,072 ranks"),
        ("gn[1-99999999]:l40s:1", "names more than 131072 hosts"),
    ],
)
def test_simulate_counts_are_bounded_before_any_host_or_device_is_built(spec: str, said: str) -> None:
    """Issue 26 repro 4: `--simulate a1:a100_80g:2000000` built every device before a limit refused
    it (14 s, 1.3 GB; `:99999999999` no answer in 180 s): now refused from the numbers alone."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(run.LaunchError) as e:
            run.parse_simulate(spec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 0.5 and peak < 1 << 20, (time.monotonic() - started, peak)
    assert said in str(e.value) and "\n" not in str(e.value) and "root cause" not in str(e.value)


def test_simulate_takes_its_limits_themselves() -> None:
    assert len(run.parse_simulate("a1:l40s:65536,gn[1-65536]:l40s:1")) == 65_537


def test_the_cli_refuses_a_simulated_node_too_big_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "DEFAULT_INVENTORY", Path("/nonexistent/inventory.yaml"))
    argv = ["launch", "--dry-run", "--simulate", "a1:a100_80g:2000000", "--", "true"]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(
        "slurm-hetero: --simulate 'a1:a100_80g:2000000': 2,000,000 devices a node"
    )


@pytest.mark.parametrize(
    "spec", ["a[1-70000]:a100_80g:1", "a1:a100_80g:40000,a2:a100_80g:40000", "a[1-1000]:a100_80g:100"]
)
def test_a_planned_simulation_is_bounded_by_the_planners_devices_before_any_is_built(
    spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adv26 simhl2/simsum/simhl3: with --model, 70,000-100,000 simulated devices were built (up to
    54 s, 153 MB) before the planner refused them; now refused from the numbers, as `plan` does."""
    monkeypatch.setattr(run, "DEFAULT_INVENTORY", Path("/nonexistent/inventory.yaml"))
    options = run.RunOptions((), dry_run=True, simulate=spec)
    started = time.monotonic()
    with pytest.raises(run.LaunchError, match=r"more than 65,536 ranks; .* one planned with --model 65,536"):
        run.plan_step(LaunchOptions("gpt2"), options, {})
    assert time.monotonic() - started < 10


def test_a_global_batch_under_the_ranks_is_refused_before_any_node_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without --model each rank needs a sample: `--simulate gn[1-65536]:a100_80g:1` with the
    default batch (512) built all 65,536 nodes (minutes) before saying so; now from the count."""
    monkeypatch.setattr(run, "DEFAULT_INVENTORY", Path("/nonexistent/inventory.yaml"))
    options = run.RunOptions((), dry_run=True, simulate="gn[1-65536]:a100_80g:1")
    started = time.monotonic()
    with pytest.raises(RequestError, match=r"every one of the 65,536 ranks .* give --global-batch 65536"):
        run.plan_step(LaunchOptions(None), options, {})
    assert time.monotonic() - started < 10


def test_a_step_beyond_the_planners_limits_is_not_a_memory_root_cause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planner's limits refuse the input as itself; `root cause:` is for models that do not fit."""
    monkeypatch.setattr(limits, "MAX_DEVICES", 2)
    env = slurm_env([("n2", 4)], 0)
    with pytest.raises(RequestError) as e:
        plan_from(env, ClusterInventory((node("n2", "l40s", 4),)), LaunchOptions("gpt2", global_batch=8))
    assert not isinstance(e.value, LaunchPlanError) and "root cause" not in str(e.value)
    assert "the planner takes at most 2 devices" in str(e.value)


@pytest.mark.usefixtures("nothing_starts")
def test_no_model_refuses_a_global_batch_under_the_ranks_and_prints_layers_as_all(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run, "DEFAULT_INVENTORY", Path("/nonexistent/inventory.yaml"))
    options = run.RunOptions((), dry_run=True, simulate="gn[1-2]:l40s:4")  # 8 ranks
    with pytest.raises(RequestError, match=r"--global-batch 7: .* 8 ranks .*; give --global-batch 8 or more"):
        run.plan_step(LaunchOptions(None, global_batch=7), options, {})
    assert run.launch(LaunchOptions(None, global_batch=8), options, {}) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line[:1].isdigit()]
    header = run.COLUMNS.index("LAYERS")
    assert len(rows) == 8 and {r[header] for r in rows} == {"all"}
    assert {r[run.COLUMNS.index("SAMPLES")] for r in rows} == {
        "1@0",
        "1@1",
        "1@2",
        "1@3",
        "1@4",
        "1@5",
        "1@6",
        "1@7",
    }


def test_launch_prices_the_per_shape_profile_as_plan_does(tmp_path: Path) -> None:
    """`launch --measured` reads the profile's shapes (`load_profile`) into the types' device groups,
    by the catalog type of each site's Type= name, as `plan --measured` does."""
    from slurm_hetero.launch.calibrate import load_profile

    path = tmp_path / "measured.yaml"
    points = "  - {tp: 1, micro_batch: 1, tflops: 90}\n  - {tp: 2, micro_batch: 1, tflops: 70}\n"
    path.write_text(f"a100_80g:\n  tflops: 90\n  shapes:\n{points}")
    job = parse_job_env(fixture_env(0))
    nodes = sites(job, inventory.load(EXAMPLE), CATALOG)
    spec, _ = layout_spec(nodes, CATALOG, dataclasses.replace(GPT2, shapes=load_profile(path).shapes))
    speeds = {g.type: g.speeds for g in spec.groups}
    assert speeds == {"a100_80g": ((1, 1.0, 90.0), (2, 1.0, 70.0)), "l40s": (), "ascend910b3": ()}
