"""The launcher's I/O: a supervised real child process, output prefixes and files, signal
forwarding, the failing rank's line first and the step cancelled, the layout file, exec mode."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from slurm_hetero import layout, proc
from slurm_hetero.launch import run
from slurm_hetero.launch.plan import LaunchOptions, RankPlan
from slurm_hetero.layout import GroupSpec, RankLayout
from slurm_hetero.slurm.jobenv import JobEnvError
from tests.conftest import FIXTURES, REPO

EXAMPLE = REPO / "gres_conf" / "examples" / "mixed.yaml"
LAYOUT = RankLayout.from_dict(
    {
        "version": 1, "rank": 2, "world_size": 3, "local_rank": 0, "local_world_size": 1,
        "node": "l40sn1", "type": "l40s", "vendor": "nvidia", "kind": "data", "model": "gpt2",
        "global_batch": 8, "num_layers": 12, "stage": 0, "num_stages": 1, "replica": 2,
        "num_replicas": 3, "tp_rank": 0, "tp_size": 1, "layer_start": 0, "layer_end": 12,
        "micro_batch": 1, "micro_batches": 2, "samples": 2, "sample_offset": 6, "grad_weight": 0.25,
        "recompute": 0, "prev_rank": None, "next_rank": None,
        "groups": [{"name": "dp", "ranks": [0, 1, 2], "backend": "gloo", "comm": "cpu-relay", "env": {}}],
        "predicted_step_s": 1.0, "even_step_s": None, "bound_step_s": 0.8, "efficiency": 0.8,
    }
)  # fmt: skip
RANK = RankPlan(2, "l40sn1", "l40s", 0, LAYOUT, {})


class Call(NamedTuple):
    argv: list[str]
    err: str
    out: str


def python(code: str, *args: str) -> tuple[str, ...]:
    return (sys.executable, "-c", textwrap.dedent(code), *args)


@pytest.fixture
def scancel(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> list[Call]:
    """proc.run replaced: records each argv with what was printed before it ran."""
    calls: list[Call] = []

    def fake(argv: list[str], timeout: float = 60.0) -> str:
        captured = capfd.readouterr()
        calls.append(Call(list(argv), captured.err, captured.out))
        return ""

    def later(steps: list[tuple[float, list[str]]]) -> None:  # one detached process: one call
        calls.append(Call(["later", *(f"{delay:g}s: {' '.join(argv)}" for delay, argv in steps)], "", ""))

    monkeypatch.setattr(proc, "run", fake)
    monkeypatch.setattr(proc, "run_later", later)
    return calls


def supervise(
    command: tuple[str, ...], log_dir: Path | None = None, targets: tuple[str, ...] = ("7.0",)
) -> int:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    logs = run.open_log_files(log_dir, RANK.rank) if log_dir else None
    return run.Supervisor(RANK, command, env, list(targets), logs).run()


def test_a_failing_rank_is_named_first_then_the_step_is_cancelled(
    scancel: list[Call], capfd: pytest.CaptureFixture[str]
) -> None:
    code = supervise(
        python("""
        import sys
        print("hello")
        print("Traceback: boom", file=sys.stderr)
        sys.exit(3)
        """),
        targets=("7.0", "8.0", "9.0"),
    )
    assert code == 3
    assert len(scancel) == 2
    argv, err_before, out_before = scancel[0]
    assert argv == ["scancel", "--signal=URG", "7.0", "8.0", "9.0"]  # every rank: stop, a peer failed
    # again for ranks still starting when the first came (SIGURG is ignored before the handler is set:
    # the CI saw a one-node peer miss it and srun report 137)
    # then the cancel for ranks that do not stop, all three from one detached process
    assert scancel[1].argv == [
        "later",
        "2s: scancel --signal=URG 7.0 8.0 9.0",
        "5s: scancel --signal=URG 7.0 8.0 9.0",
        "20s: scancel 7.0 8.0 9.0",
    ]
    ours = [line for line in err_before.splitlines() if line.startswith("slurm-hetero:")]
    assert ours == ["slurm-hetero: rank 2 on l40sn1 (l40s, stage 0) exited with code 3: Traceback: boom"]
    assert "[rank 2 l40s stage 0] Traceback: boom" in err_before
    assert "[rank 2 l40s stage 0] hello" in out_before


def test_a_rank_killed_by_a_signal_is_reported_with_its_name(
    scancel: list[Call],
) -> None:
    code = supervise(python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
    assert code == 128 + 9
    assert "exited with code 137 (SIGKILL)" in scancel[0][1]


def test_success_cancels_nothing_and_log_dir_gets_the_output(
    scancel: list[Call], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    command = python("import sys; print('out line'); print('err line', file=sys.stderr)")
    assert supervise(command, log_dir=tmp_path / "logs") == 0
    assert scancel == []
    assert (tmp_path / "logs" / "rank-2.out").read_text() == "out line\n"
    assert (tmp_path / "logs" / "rank-2.err").read_text() == "err line\n"
    assert "out line" not in capfd.readouterr().out


def test_signals_are_forwarded_and_end_the_rank_quietly(scancel: list[Call], tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    command = python(
        """
        import pathlib, signal, sys, time
        def stop(signum, frame):
            print("got", signum, flush=True)
            sys.exit(7)
        signal.signal(signal.SIGTERM, stop)
        pathlib.Path(sys.argv[1]).write_text("ready")
        time.sleep(30)
        """,
        str(ready),
    )

    def terminate_when_ready() -> None:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_when_ready, daemon=True).start()
    started = time.monotonic()
    assert supervise(command) == 7
    assert time.monotonic() - started < 10
    assert scancel == []  # the step is ending anyway: no second cancel, no failure line


def test_the_command_dies_with_its_launcher(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    launcher = f"""
        import sys
        from slurm_hetero.launch import run
        from slurm_hetero.launch.plan import RankPlan
        rank = RankPlan(0, "n", "t", 0, {{}}, {{}})
        code = "import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
        child = [sys.executable, "-c", code]
        run.Supervisor(rank, child, dict(__import__("os").environ), [], None).run()
    """
    outer = subprocess.Popen(list(python(launcher)), cwd=REPO)
    try:
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        outer.kill()
        outer.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        outer.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


# -- launch() end to end on a fake Slurm task ------------------------------------------------------


def task_env(tmp_path: Path, rank: int = 1) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return clean | {
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURMD_NODENAME": "a100n1",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "a100n1",
        "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_JOB_ID": "42",
        "SLURM_STEP_ID": "3",
        "SLURM_STEP_GPUS": "0,1",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "TMPDIR": str(tmp_path),
    }


OPTIONS = LaunchOptions("gpt2", global_batch=8, seq=64, master_addr="127.0.0.1", backend_override="gloo")


def test_launch_writes_the_layout_and_runs_the_command_with_the_torch_env(
    scancel: list[Call], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    command = python("""
        import os
        from slurm_hetero import layout
        me = layout.current()
        print(me.rank, me.world_size, os.environ["RANK"], os.environ["CUDA_VISIBLE_DEVICES"],
              os.environ["MASTER_ADDR"], me.group("dp").backend)
        """)
    options = run.RunOptions(command, inventory=EXAMPLE)
    assert run.launch(OPTIONS, options, task_env(tmp_path)) == 0
    out = capfd.readouterr().out
    assert out.rstrip().endswith("1 2 1 1 127.0.0.1 gloo"), out
    assert scancel == []
    assert list(tmp_path.iterdir()) == []  # the rank's private layout directory is removed after it


def test_exec_mode_replaces_the_launcher(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def fake_exec(file: str, args: list[str], env: dict[str, str]) -> None:
        seen.update(file=file, args=args, env=env)

    monkeypatch.setattr(os, "execvpe", fake_exec)
    options = run.RunOptions(("train", "--lr", "1"), inventory=EXAMPLE, exec_command=True)
    run.launch(OPTIONS, options, task_env(tmp_path, rank=0))
    assert seen["file"] == "train" and seen["args"] == ["train", "--lr", "1"]
    assert seen["env"]["RANK"] == "0" and seen["env"]["MASTER_PORT"] == str(20000 + 42 * 64 + 3)
    assert Path(seen["env"]["SLURM_HETERO_LAYOUT"]).is_file()


def test_a_missing_device_library_is_recorded_not_replaced(caplog: pytest.LogCaptureFixture) -> None:
    hccl = (GroupSpec("dp", (0, 1, 2), "hccl", "vendor-ccl"),)
    ascend = dataclasses.replace(LAYOUT, node="ascendn1", type="ascend910b3", vendor="ascend", groups=hccl)
    rank = RankPlan(2, "ascendn1", "ascend910b3", 0, ascend, {})
    with caplog.at_level(logging.WARNING, logger="slurm_hetero.launch.run"):
        run.note_missing_backends(rank)
    assert "hccl needs torch_npu" in caplog.text and "kept as planned" in caplog.text


def test_current_layout_needs_the_launcher(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SLURM_HETERO_LAYOUT", raising=False)
    with pytest.raises(layout.LayoutError, match="not started by slurm-hetero launch"):
        layout.current()
    bad = tmp_path / "rank-0.json"
    bad.write_text('{"version": 1, "rank": 0}')
    monkeypatch.setenv("SLURM_HETERO_LAYOUT", str(bad))
    with pytest.raises(layout.LayoutError, match="missing key 'world_size'"):
        layout.current()
    bad.write_text('{"version": 2}')
    with pytest.raises(layout.LayoutError, match="version 2"):
        layout.from_file(bad)


def test_launch_under_srun_names_a_missing_essential(tmp_path: Path) -> None:
    env = {k: v for k, v in task_env(tmp_path).items() if k != "SLURM_STEP_ID"}
    with pytest.raises(JobEnvError, match=r"SLURM_STEP_ID \(or SLURM_STEPID\) is not set: run under srun"):
        run.launch(OPTIONS, run.RunOptions(("true",), inventory=EXAMPLE), env)


def test_a_failing_rank_of_a_het_srun_cancels_every_component(scancel: list[Call], tmp_path: Path) -> None:
    """`srun A : B : C` exports only SLURM_JOB_ID_PACK_GROUP_k (real dump, Slurm 22.05)."""
    lines = (FIXTURES / "slurm_env" / "hetsrun3_task0.env.txt").read_text().splitlines()
    slurm = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    env = (
        {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        | slurm
        | {"TMPDIR": str(tmp_path)}
    )
    options = run.RunOptions(python("import sys; sys.exit(3)"), inventory=EXAMPLE)
    measured = dataclasses.replace(OPTIONS, measured={"ascend910b3": 120.0})
    assert run.launch(measured, options, env) == 3
    assert [c.argv for c in scancel] == [
        ["scancel", "--signal=URG", "6.0", "7.0", "8.0"],
        [
            "later",
            "2s: scancel --signal=URG 6.0 7.0 8.0",
            "5s: scancel --signal=URG 6.0 7.0 8.0",
            "20s: scancel 6.0 7.0 8.0",
        ],
    ]


class FullDisk:
    """A log file on a full filesystem: every write raises ENOSPC (what --log-dir met in H13)."""

    def __init__(self, name: str) -> None:
        self.name, self.writes, self.closed = name, 0, False

    def write(self, data: bytes) -> int:
        self.writes += 1
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_a_full_log_disk_drops_the_output_and_the_rank_still_ends(
    capfd: pytest.CaptureFixture[str],
) -> None:
    logs: dict[str, Any] = {"out": FullDisk("/logs/rank-2.out"), "err": FullDisk("/logs/rank-2.err")}
    # 8 MB: far more than a pipe holds, so a relay that stopped draining would hang the command
    command = python("""
        import sys
        for _ in range(1000):
            sys.stdout.write("x" * 8000 + "\\n")
        sys.exit(5)
        """)
    supervisor = run.Supervisor(RANK, command, dict(os.environ), [], logs)
    # a hung command (blocked on its full pipe) is killed after 60 s: its code is then 137, not 5
    watchdog = threading.Timer(60, lambda: supervisor.child and supervisor.child.kill())
    watchdog.start()
    try:
        code = supervisor.run()
    finally:
        watchdog.cancel()
    assert code == 5  # the command's own exit code: it was not left hanging
    assert logs["out"].writes == 1  # reported once, then dropped
    err = capfd.readouterr().err
    ours = [line for line in err.splitlines() if "cannot write" in line]
    assert ours == [
        "slurm-hetero: rank 2: cannot write /logs/rank-2.out: No space left on device; "
        "output dropped from here"
    ]
    assert "Traceback" not in err


def test_the_relay_holds_a_bounded_chunk_of_a_line_without_newline() -> None:
    import io

    from slurm_hetero.launch import supervise

    stream = io.BufferedReader(io.BytesIO(b"a" * 10 + b"\n" + b"b" * 25 + b"\rc\n"), buffer_size=8)
    chunks = list(supervise.relay_chunks(stream, 8))
    assert max(len(c) for c in chunks) <= 8
    assert b"".join(chunks) == b"a" * 10 + b"\n" + b"b" * 25 + b"\rc\n"


def test_a_line_longer_than_the_chunk_is_relayed_intact_with_one_prefix(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from slurm_hetero.launch import supervise

    monkeypatch.setattr(supervise, "RELAY_CHUNK", 1000)
    monkeypatch.setattr(supervise.relay_chunks, "__defaults__", (1000,))
    command = python("""
        import sys
        sys.stdout.write("y" * 5000 + "\\n" + "tail-without-newline")
        """)
    code = run.Supervisor(RANK, command, dict(os.environ), [], None).run()
    assert code == 0
    out = capfd.readouterr().out
    assert out == "[rank 2 l40s stage 0] " + "y" * 5000 + "\n[rank 2 l40s stage 0] tail-without-newline\n"


def test_dry_run_json_grows_linearly_with_the_ranks() -> None:
    """Every rank's document named every member of its dp group: quadratic output (466 MB at
    600 nodes x 8). Groups are listed once and named by place: 4x the ranks, about 4x the bytes."""
    from click.testing import CliRunner

    from slurm_hetero.cli import cli

    def size(nodes: int) -> int:
        argv = ["launch", "--dry-run", "--json", "--global-batch", str(nodes * 8)]
        result = CliRunner().invoke(cli, [*argv, "--simulate", f"lin[001-{nodes:03d}]:a100_80g:8"])
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout)
        dp = document["groups"][document["ranks"][-1]["layout"]["groups"][1]]
        assert dp["name"] == "dp" and len(dp["ranks"]) == nodes * 8
        return len(result.stdout)

    assert size(32) < 4.6 * size(8)
