"""TaskProlog: Slurm's allocated GPU indices -> the vendor's own visible-device variable."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_hetero import inventory
from slurm_hetero.catalog import load_catalog
from slurm_hetero.cli import cli
from slurm_hetero.model import Device, Health, NodeInventory, SlurmNode
from slurm_hetero.nodes import NodeBuilder
from slurm_hetero.slurm.jobenv import read_task_env
from slurm_hetero.taskprolog import export_lines
from slurm_hetero.vendors import vendor_traits
from tests.conftest import FIXTURES, REPO

EXAMPLE = REPO / "gres_conf" / "examples" / "mixed.yaml"


def exports(env: Mapping[str, str], node: SlurmNode, **options: Any) -> list[str]:
    """The TaskProlog's lines for a task environment, read as the CLI reads it."""
    return export_lines(read_task_env(env), node, **options)


def record(name: str) -> NodeInventory:
    return next(n for n in inventory.load(EXAMPLE).nodes if n.name == name)


def slurm_node(node: NodeInventory) -> SlurmNode:
    return NodeBuilder(load_catalog(), vendor_traits()).node(node)


def node(name: str) -> SlurmNode:
    return slurm_node(record(name))


def test_ascend_allocation_exports_logical_ids() -> None:
    assert exports({"SLURM_STEP_GPUS": "2,5"}, node("ascendn1")) == ["export ASCEND_RT_VISIBLE_DEVICES=2,5"]


def test_nvidia_needs_nothing_beyond_slurms_own_variables() -> None:
    assert exports({"SLURM_STEP_GPUS": "0,1"}, node("a100n1")) == []


def test_step_gpus_win_over_job_gpus_which_are_wrong_in_het_components() -> None:
    env = {"SLURM_STEP_GPUS": "1", "SLURM_JOB_GPUS": "0,1,2,3"}
    assert exports(env, node("ascendn1")) == ["export ASCEND_RT_VISIBLE_DEVICES=1"]
    assert exports({"SLURM_JOB_GPUS": "3"}, node("ascendn1")) == ["export ASCEND_RT_VISIBLE_DEVICES=3"]


def test_indices_follow_gres_order_when_unhealthy_devices_are_left_out() -> None:
    base = record("ascendn1")
    sick = dataclasses.replace(base.devices[1], health=Health.UNHEALTHY)
    gap = dataclasses.replace(base, devices=(base.devices[0], sick, *base.devices[2:]))
    # Slurm's index 1 is the second *rendered* device: davinci2
    assert exports({"SLURM_STEP_GPUS": "1"}, slurm_node(gap)) == ["export ASCEND_RT_VISIBLE_DEVICES=2"]


def test_gaudi_exports_module_ids_and_mixed_nodes_export_each_vendor() -> None:
    gaudi = [
        Device("gaudi", "HL-225", i, f"/dev/accel/accel{i}", 98304, "gaudi2", tool_id=str(7 - i))
        for i in range(2)
    ]
    mlu = [Device("cambricon", "MLU370-X8", 0, "/dev/cambricon_dev0", 24576, "mlu370_x8")]
    mixed = slurm_node(NodeInventory("mix1", devices=(*gaudi, *mlu)))
    assert exports({"SLURM_STEP_GPUS": "0,1,2"}, mixed) == [
        "export MLU_VISIBLE_DEVICES=0",
        "export HABANA_VISIBLE_MODULES=7,6",
    ]


def test_no_gpus_no_exports_and_bad_index_is_an_error() -> None:
    assert exports({}, node("ascendn1")) == []
    with pytest.raises(Exception, match="beyond the 8 devices"):
        exports({"SLURM_STEP_GPUS": "9"}, node("ascendn1"))


def test_cli_never_fails_the_task(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"SLURMD_NODENAME": "ascendn1", "SLURM_STEP_GPUS": "0,3"}
    ok = runner.invoke(cli, ["task-prolog", "--inventory", str(EXAMPLE)], env=env)
    assert (ok.exit_code, ok.stdout) == (0, "export ASCEND_RT_VISIBLE_DEVICES=0,3\n")
    missing = runner.invoke(cli, ["task-prolog", "--inventory", str(tmp_path / "none.yaml")], env=env)
    assert missing.exit_code == 0 and missing.stderr == ""
    assert missing.stdout.startswith("print slurm-hetero task-prolog: ")
    assert "no such inventory" in missing.stdout
    zz = {"SLURMD_NODENAME": "zz", "SLURM_JOB_GPUS": "0"}
    unknown = runner.invoke(cli, ["task-prolog", "--inventory", str(EXAMPLE)], env=zz)
    assert unknown.exit_code == 0 and "node 'zz' is not in" in unknown.stdout


def test_shard_allocations_export_mps_limits_and_hami_core_where_installed() -> None:
    from slurm_hetero.taskprolog import SharingLimits

    l40s = node("l40sn1")  # 46068 MiB devices; 4G shards -> 11 per device
    env = {"SLURM_JOB_GPUS": "1", "SLURM_SHARDS_ON_NODE": "3"}
    assert exports(env, l40s, sharing=SharingLimits({"l40s": 4096})) == [
        "export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=12288M",
        "export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=28",
    ]
    with_hami = exports(env, l40s, sharing=SharingLimits({"l40s": 4096}, "/usr/local/vgpu/libvgpu.so"))
    assert with_hami[2:] == [
        "export CUDA_DEVICE_MEMORY_LIMIT=12288m",
        "export CUDA_DEVICE_SM_LIMIT=28",
        "export LD_PRELOAD=/usr/local/vgpu/libvgpu.so",
    ]
    assert exports(env, l40s, sharing=SharingLimits({})) == []  # type not shared: no limits


def fixture_env(name: str) -> dict[str, str]:
    lines = (FIXTURES / "slurm_env" / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def test_cli_on_a_real_het_task_environment(tmp_path: Path) -> None:
    """The ascend task of a 3-component job (Slurm 22.05): SLURM_STEP_GPUS, not SLURM_JOB_GPUS."""
    env = fixture_env("hetjob3_srun_task3.env.txt")
    args = ["task-prolog", "--inventory", str(EXAMPLE)]
    result = CliRunner().invoke(cli, args, env=env)
    assert (result.exit_code, result.stdout) == (0, "export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3\n")
    # without SLURM_STEP_GPUS and CUDA_VISIBLE_DEVICES, component 0's SLURM_JOB_GPUS=0,1 is not used
    bare = env | {"SLURM_STEP_GPUS": "", "CUDA_VISIBLE_DEVICES": ""}
    result = CliRunner().invoke(cli, args, env=bare)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")


def test_cli_survives_partial_and_malformed_environments() -> None:
    runner, args = CliRunner(), ["task-prolog", "--inventory", str(EXAMPLE)]
    quiet = runner.invoke(cli, args, env={"SLURMD_NODENAME": "zz"})  # no GPUs: inventory not read
    assert (quiet.exit_code, quiet.stdout, quiet.stderr) == (0, "", "")
    nameless = runner.invoke(cli, args, env={"SLURM_STEP_GPUS": "0"})
    assert (nameless.exit_code, nameless.stderr) == (0, "")
    assert nameless.stdout.startswith("print ") and "SLURMD_NODENAME is not set" in nameless.stdout
    injected = {"SLURMD_NODENAME": "ascendn1", "SLURM_STEP_GPUS": "0\nexport LD_PRELOAD=/tmp/x.so"}
    bad = runner.invoke(cli, args, env=injected)
    assert (bad.exit_code, bad.stderr) == (0, "")
    assert [line.split()[0] for line in bad.stdout.splitlines()] == ["print"]  # a warning, no export
    assert "SLURM_STEP_GPUS=" in bad.stdout and "not a list of GPU indices" in bad.stdout
    padded = runner.invoke(cli, args, env={"SLURMD_NODENAME": "ascendn1\n", "SLURM_STEP_GPUS": "1,\n2\n"})
    assert (padded.exit_code, padded.stdout) == (0, "export ASCEND_RT_VISIBLE_DEVICES=1,2\n")
    strict = runner.invoke(cli, [*args, "--strict"], env=injected)
    assert strict.exit_code != 0


def test_rocm_runtimes_get_rocr_by_index_and_hip_by_position_inside_it() -> None:
    # ROCm applies HIP_VISIBLE_DEVICES (and CUDA_VISIBLE_DEVICES) inside ROCR_VISIBLE_DEVICES: the
    # inner variables take positions, or a job on GPUs 2,3 would ask for devices 2,3 of 2.
    for vendor, model, gres_type in [("amd", "AMD Instinct MI300X", "mi300x"), ("hygon", "K100_AI", "")]:
        devices = tuple(
            Device(vendor, model, i, f"/dev/dri/renderD{128 + i}", 65536, gres_type) for i in range(4)
        )
        node4 = slurm_node(NodeInventory("rocm1", devices=devices))
        assert exports({"SLURM_STEP_GPUS": "2,3"}, node4) == [
            "export ROCR_VISIBLE_DEVICES=2,3",
            "export HIP_VISIBLE_DEVICES=0,1",
            "export CUDA_VISIBLE_DEVICES=0,1",
            "export GPU_DEVICE_ORDINAL=0,1",
        ]
