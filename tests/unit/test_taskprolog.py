"""TaskProlog: Slurm's allocated GPU indices -> the vendor's own visible-device variable."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_hetero.cli import cli
from slurm_hetero.cli import taskprolog as cli_taskprolog
from slurm_hetero.core import readfile
from slurm_hetero.core.model import Device, Health, NodeInventory, SlurmNode
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.nodes import NodeBuilder
from slurm_hetero.node.taskprolog import EXPORT_LINE, PRINT_PREFIX, export_lines, print_line, protocol_lines
from slurm_hetero.slurm.jobenv import read_task_env
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
    from slurm_hetero.node.taskprolog import SharingLimits

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
    twice = runner.invoke(
        cli, args, env={"SLURMD_NODENAME": "ascendn1", "SLURM_STEP_GPUS": "1,1"}
    )  # adv32 C06
    said = (
        "print slurm-hetero task-prolog: SLURM_STEP_GPUS='1,1' names a GPU twice; no visible-device variable"
    )
    assert (twice.exit_code, twice.stdout) == (0, said + " exported\n")
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


# -- Hostile conditions: whatever the inventory, its permissions and the
# job's environment, it exits 0 and prints only `export NAME=value` and `print ...` lines, with
# nothing on stderr (slurmstepd parses both streams); its warnings reach the task and syslog.


GOOD = {"SLURMD_NODENAME": "ascendn1", "SLURM_STEP_GPUS": "0,3"}
WELL_FORMED = re.compile(rf"({EXPORT_LINE.pattern}|{re.escape(PRINT_PREFIX)}[\x20-\x7e]*)")


def task_prolog(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PYTHON"))}
    return subprocess.run(
        [sys.executable, "-m", "slurm_hetero", "task-prolog", *args],
        env={**base, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def assert_protocol(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert all(WELL_FORMED.fullmatch(line) for line in lines), lines
    return lines


def test_users_environment_cannot_steer_or_fail_it(tmp_path: Path) -> None:
    hostile = {
        "SLURM_HETERO_TASK_PROLOG_STRICT": "maybe",
        "SLURM_HETERO_TASK_PROLOG_INVENTORY": "/dev/zero",
        "SLURM_HETERO_TASK_PROLOG_CONFIG": "/dev/zero",
        "SLURM_HETERO_TASK_PROLOG_HAMI_CORE_LIBRARY": "/bin/sh\nexport X=1",
        "SLURM_HETERO_INVENTORY": "/etc/passwd",
        "SLURM_HETERO_VERBOSE": "lots",
        "SLURM_HETERO_CONFIG": str(tmp_path / "evil.yaml"),
        "XDG_CONFIG_HOME": str(tmp_path),
    }
    (tmp_path / "evil.yaml").write_text("sharing: {shard_size: {ascend910b3: 1M}}\n")
    (tmp_path / "slurm-hetero").mkdir()
    (tmp_path / "slurm-hetero" / "config.yaml").write_text("[broken")
    lines = assert_protocol(task_prolog("--inventory", str(EXAMPLE), env={**GOOD, **hostile}))
    assert lines == ["export ASCEND_RT_VISIBLE_DEVICES=0,3"]


def test_an_inventory_the_user_cannot_read_is_a_warning_in_the_task_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_open = os.open

    def denied(path: object, *args: object, **kwargs: object) -> int:
        if str(path) == str(EXAMPLE):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(readfile.os, "open", denied)
    for key, value in GOOD.items():
        monkeypatch.setenv(key, value)
    cli_taskprolog.task_prolog.callback(str(EXAMPLE), False, None, "/nonexistent", False)  # type: ignore[misc]
    out = capsys.readouterr()
    assert out.err == ""
    warning = f"{EXAMPLE}: cannot read inventory file: Permission denied; no visible-device variable exported"
    assert out.out == f"{PRINT_PREFIX}{warning}\n"


@pytest.mark.parametrize("inventory", ["moved-away.yaml", "/dev/zero", "/", "fifo"])
def test_a_missing_or_odd_inventory_tells_the_ascend_job(tmp_path: Path, inventory: str) -> None:
    if inventory == "fifo":
        os.mkfifo(tmp_path / "fifo")  # no writer: a blocking open would hang the task forever
    path = str(tmp_path / inventory) if not inventory.startswith("/") else inventory
    lines = assert_protocol(task_prolog("--inventory", path, env=GOOD))
    assert len(lines) == 1 and "no visible-device variable exported" in lines[0]


def test_warnings_go_to_syslog_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    records: list[str] = []

    class Capture(cli_taskprolog.logging.Handler):
        def emit(self, record: cli_taskprolog.logging.LogRecord) -> None:
            records.append(record.getMessage())

    monkeypatch.setattr(cli_taskprolog.logging.handlers, "SysLogHandler", lambda address: Capture())
    for key, value in {**GOOD, "SLURM_JOB_ID": "42"}.items():
        monkeypatch.setenv(key, value)
    cli_taskprolog.task_prolog.callback("/nonexistent.yaml", False, None, "/nonexistent", False)  # type: ignore[misc]
    assert capsys.readouterr().err == ""
    assert records == [
        "job '42': /nonexistent.yaml: no such inventory file; no visible-device variable exported"
    ]


def test_jobs_without_gpus_do_not_read_the_inventory() -> None:
    assert assert_protocol(task_prolog("--inventory", "/nonexistent", env={"SLURMD_NODENAME": "x"})) == []


def test_absurd_inventories_are_refused_fast(tmp_path: Path) -> None:
    huge = tmp_path / "huge.yaml"
    text = EXAMPLE.read_text().replace("name: ascendn1", "name: gpu[1-100000000]")
    huge.write_text(text)
    lines = assert_protocol(task_prolog("--inventory", str(huge), env=GOOD))
    assert "more than" in lines[0]


hostile_text = st.sampled_from(
    ["\n", "\r", "\t", " ", "=", ",", "#", ";", "$(id)", "`id`", "'", '"', "\x00"]
) | st.text(max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    gpus=st.lists(hostile_text, max_size=3).map(",".join)
    | st.sampled_from(["0", "0,3", "99", "-1", "0" * 5000]),
    node=hostile_text | st.sampled_from(["ascendn1", "a100n1", "mlun1"]),
)
def test_any_allocation_variables_give_only_well_formed_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], gpus: str, node: str
) -> None:
    monkeypatch.setenv("SLURM_STEP_GPUS", gpus.replace("\x00", ""))
    monkeypatch.setenv("SLURMD_NODENAME", node.replace("\x00", ""))
    cli_taskprolog.task_prolog.callback(str(EXAMPLE), False, None, "/nonexistent", False)  # type: ignore[misc]
    out = capsys.readouterr()
    assert out.err == ""
    assert all(WELL_FORMED.fullmatch(line) for line in out.out.splitlines()), out.out


def test_the_protocol_gate_drops_malformed_exports_and_flattens_warnings() -> None:
    lines, notes = protocol_lines(
        ["export A=1", "export B=x y", "export C=1\nexport D=2", "rm -rf /"], ["a\nb\x00"]
    )
    assert lines[0] == "export A=1" and all(WELL_FORMED.fullmatch(line) for line in lines)
    assert len(lines) == 1 + 1 + 3 and len(notes) == 4
    assert print_line("x\ny") == PRINT_PREFIX + "x?y"
