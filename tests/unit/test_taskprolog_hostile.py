"""The TaskProlog under hostile conditions (issue 9): whatever the inventory, its permissions and
the job's environment, it exits 0 and prints only `export NAME=value` and `print ...` lines, with
nothing on stderr (slurmstepd parses both streams); its warnings reach the task and syslog."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_hetero import readfile
from slurm_hetero.cli import taskprolog as cli_taskprolog
from slurm_hetero.taskprolog import EXPORT_LINE, PRINT_PREFIX, print_line, protocol_lines
from tests.conftest import REPO

EXAMPLE = REPO / "gres_conf" / "examples" / "mixed.yaml"
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
