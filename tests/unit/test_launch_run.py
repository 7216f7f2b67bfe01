"""The launcher's I/O: a supervised real child process, output prefixes and files, signal
forwarding, the failing rank's line first and the step cancelled, the layout file, exec mode."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner

from slurm_hetero import layout
from slurm_hetero.cli import cli
from slurm_hetero.core import proc
from slurm_hetero.core.errors import LaunchPlanError, ToolError
from slurm_hetero.launch import early, run
from slurm_hetero.launch import supervise as supervisor_module
from slurm_hetero.launch.plan import LaunchOptions, RankPlan
from slurm_hetero.launch.rankenv import master_port
from slurm_hetero.layout import GroupSpec, RankLayout
from slurm_hetero.slurm.jobenv import JobEnvError, expand_tasks_per_node, parse_job_env
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
        "groups": [
            {"name": "tp", "ranks": [2], "backend": "gloo", "comm": "cpu-relay", "env": {}},
            {"name": "pp", "ranks": [2], "backend": "gloo", "comm": "cpu-relay", "env": {}},
            {"name": "dp", "ranks": [0, 1, 2], "backend": "gloo", "comm": "cpu-relay", "env": {}},
        ],
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


def wait_for(path: Path, timeout_s: float = 20) -> None:
    """Until the child process wrote `path` (it is ready for the signal the test sends)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


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
        wait_for(ready)
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
    assert seen["env"]["RANK"] == "0" and seen["env"]["MASTER_PORT"] == str(10000 + 42 * 64 + 3)
    assert Path(seen["env"]["SLURM_HETERO_LAYOUT"]).is_file()


def test_a_missing_device_library_is_recorded_not_replaced(caplog: pytest.LogCaptureFixture) -> None:
    hccl = (GroupSpec("dp", (0, 1, 2), "hccl", "vendor-ccl"),)
    ascend = dataclasses.replace(LAYOUT, node="ascendn1", type="ascend910b3", vendor="ascend", groups=hccl)
    rank = RankPlan(2, "ascendn1", "ascend910b3", 0, ascend, {})
    with caplog.at_level(logging.WARNING, logger="slurm_hetero.launch.run"):
        run.note_missing_backends(rank)
    assert "hccl needs torch_npu" in caplog.text and "kept as planned" in caplog.text


def test_a_missing_device_library_in_a_missing_package_is_recorded_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Gaudi's torch module is habana_frameworks.torch: find_spec raised when the parent was missing
    hccl = (GroupSpec("dp", (0, 1), "hccl", "vendor-ccl"),)
    gaudi = dataclasses.replace(LAYOUT, node="gaudin1", type="gaudi2", vendor="gaudi", groups=hccl)
    with caplog.at_level(logging.WARNING, logger="slurm_hetero.launch.run"):
        run.note_missing_backends(RankPlan(0, "gaudin1", "gaudi2", 0, gaudi, {}))
    assert "needs habana_frameworks.torch" in caplog.text and "kept as planned" in caplog.text


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


# -- hostile conditions: the layout directory (private, unique, removed after the rank), a step
# without devices, the rendezvous port of adjacent jobs and steps, an unwritable --log-dir, Slurm
# variables too big to read, signals at every moment.


SHOW_LAYOUT = """
    import os, stat, sys
    path = os.environ["SLURM_HETERO_LAYOUT"]
    print("LAYOUT", path, oct(stat.S_IMODE(os.stat(path).st_mode)),
          oct(stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode)), flush=True)
    """


def layout_line(out: str) -> list[str]:
    return next(line.split("LAYOUT ", 1)[1].split() for line in out.splitlines() if "LAYOUT " in line)


# -- the layout directory --------------------------------------------------------------------------


def test_the_layout_is_private_and_removed_when_the_rank_ends(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    options = run.RunOptions(python(SHOW_LAYOUT), inventory=EXAMPLE)
    assert run.launch(OPTIONS, options, task_env(tmp_path)) == 0
    path, file_mode, dir_mode = layout_line(capfd.readouterr().out)
    assert (file_mode, dir_mode) == ("0o600", "0o700")
    assert Path(path).parent.parent == tmp_path and Path(path).name == "rank-1.json"
    assert Path(path).parent.name.startswith("slurm-hetero-42.3-")
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_a_directory_or_link_at_the_old_predictable_path_is_never_used(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Another user's `$TMPDIR/slurm-hetero-42.3` (a directory, or a link to one) was used as is;
    a stale one of another user gave "Permission denied"."""
    planted = tmp_path / "slurm-hetero-42.3"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    (tmp_path / "slurm-hetero-42.3-XXXXXXXX").symlink_to(planted)
    options = run.RunOptions(python(SHOW_LAYOUT), inventory=EXAMPLE)
    assert run.launch(OPTIONS, options, task_env(tmp_path)) == 0
    path = Path(layout_line(capfd.readouterr().out)[0])
    assert path.parent not in (planted, tmp_path / "slurm-hetero-42.3-XXXXXXXX")
    assert list(planted.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slurm-hetero-42.3", "slurm-hetero-42.3-XXXXXXXX"]


def test_the_layout_is_removed_when_the_command_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervisor_module, "end_step", lambda targets: None)
    options = run.RunOptions(python("import sys; sys.exit(4)"), inventory=EXAMPLE)
    assert run.launch(OPTIONS, options, task_env(tmp_path)) == 4
    assert list(tmp_path.iterdir()) == []


def test_exec_mode_keeps_its_private_layout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, str] = {}
    monkeypatch.setattr(os, "execvpe", lambda file, args, env: seen.update(env))
    options = run.RunOptions(("train",), inventory=EXAMPLE, exec_command=True)
    run.launch(OPTIONS, options, task_env(tmp_path, rank=0))
    path = Path(seen["SLURM_HETERO_LAYOUT"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_an_unusable_tmpdir_is_one_line(tmp_path: Path) -> None:
    env = task_env(tmp_path) | {"TMPDIR": str(tmp_path / "missing")}
    with pytest.raises(run.LaunchError, match=r"cannot make a private layout directory in .*missing"):
        run.launch(OPTIONS, run.RunOptions(("true",), inventory=EXAMPLE), env)
    with pytest.raises(run.LaunchError, match="TMPDIR='relative' is not an absolute path"):
        run.launch(OPTIONS, run.RunOptions(("true",), inventory=EXAMPLE), env | {"TMPDIR": "relative"})


# -- a step without devices ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {},  # no GPU variable at all (srun -n2 in a job without --gpus/--gres)
        {"CUDA_VISIBLE_DEVICES": "0,1"},  # inherited from the submitting shell: not an allocation
        {"SLURM_GPUS_ON_NODE": "0", "CUDA_VISIBLE_DEVICES": "0,1"},
    ],
)
def test_a_step_without_devices_is_refused(tmp_path: Path, change: dict[str, str]) -> None:
    env = {k: v for k, v in task_env(tmp_path).items() if "GPU" not in k and "VISIBLE" not in k} | change
    started = tmp_path / "started"
    options = run.RunOptions(("touch", str(started)), inventory=EXAMPLE)
    with pytest.raises(
        run.LaunchError, match=r"no devices are allocated to this step on a100n1 .*--gpus-per-task"
    ):
        run.launch(OPTIONS, options, env)
    assert not started.exists()


def test_a_node_whose_devices_do_not_match_its_tasks_ends_the_whole_step(
    scancel: list[Call], tmp_path: Path
) -> None:
    """adv34 I13-I15: the rank on such a node was refused, but the other nodes' ranks, whose own
    nodes were fine, ran their commands (a trainer would wait at the rendezvous for it)."""
    env = task_env(tmp_path) | {"SLURM_STEP_GPUS": "0,1,2", "SLURM_GPUS_ON_NODE": "3"}
    started = tmp_path / "started"
    with pytest.raises(LaunchPlanError, match="a100n1 runs 2 tasks but Slurm gave the step 3 device"):
        run.launch(OPTIONS, run.RunOptions(("touch", str(started)), inventory=EXAMPLE), env)
    assert not started.exists()
    assert [c.argv for c in scancel] == [
        ["scancel", "--signal=URG", "42.3"],
        ["later", "2s: scancel --signal=URG 42.3", "5s: scancel --signal=URG 42.3", "20s: scancel 42.3"],
    ]
    scancel.clear()
    with pytest.raises(LaunchPlanError):  # --dry-run shows, and ends nothing
        run.launch(OPTIONS, run.RunOptions(("true",), inventory=EXAMPLE, dry_run=True), env)
    assert scancel == []


@pytest.mark.parametrize(
    "gpus",
    [
        {"SLURM_STEP_GPUS": "0,1"},
        {"SLURM_JOB_GPUS": "0,1"},
        {"SLURM_GPUS_ON_NODE": "2", "CUDA_VISIBLE_DEVICES": "0,1"},  # het component > 0 (no JOB_GPUS)
    ],
)
def test_a_step_with_slurm_devices_is_planned(tmp_path: Path, gpus: dict[str, str]) -> None:
    env = {k: v for k, v in task_env(tmp_path).items() if "GPU" not in k and "VISIBLE" not in k} | gpus
    job, plan = run.plan_step(OPTIONS, run.RunOptions(("true",), inventory=EXAMPLE), env)
    assert job.devices.gpu_indexes == (0, 1) and len(plan.ranks) == 2


# -- the rendezvous port ---------------------------------------------------------------------------


def test_adjacent_jobs_and_steps_get_different_ports() -> None:
    assert master_port("1", 7) != master_port("2", 0)  # jobid * 7 + step made these equal
    for first in (0, 1, 4242, 99_999, 4_294_967_000):
        ports = {master_port(str(job), step) for job in range(first, first + 355) for step in range(64)}
        assert len(ports) == 355 * 64
        # not in Linux's default ephemeral range (32768 up), where a node's outgoing connections
        # may hold the port rank 0 must listen on
        assert min(ports) >= 10000 and max(ports) <= 32767


# -- --log-dir ----------------------------------------------------------------------------------------


def test_an_unwritable_log_dir_is_one_line_before_the_command_starts(tmp_path: Path) -> None:
    started = tmp_path / "started"
    env = task_env(tmp_path, rank=0) | {"SLURM_HETERO_INVENTORY": str(EXAMPLE)}
    argv = ["launch", "--master-addr", "127.0.0.1", "--log-dir", "/proc/slurm-hetero-logs", "--"]
    result = CliRunner().invoke(cli, [*argv, "touch", str(started)], env=env)
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurm-hetero: --log-dir /proc/slurm-hetero-logs: cannot")
    assert "Traceback" not in result.output and not started.exists()
    assert list(tmp_path.iterdir()) == [], "nothing is left when the launch is refused"


@pytest.mark.parametrize("option", ["--log-dir", "--resume"])
@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_log_dir_or_resume_is_refused_not_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, empty: str, option: str
) -> None:
    """F21: --log-dir '' (an unset "$LOGDIR") wrote rank-0.out and .err into the current directory;
    issue 23 F8: --resume '' (an unset "$CKPT") trained with no checkpoints at all, exit 0."""
    monkeypatch.chdir(tmp_path)
    env = task_env(tmp_path, rank=0) | {"SLURM_HETERO_INVENTORY": str(EXAMPLE)}
    result = CliRunner().invoke(
        cli, ["launch", "--master-addr", "127.0.0.1", option, empty, "--", "true"], env=env
    )
    assert result.exit_code == 2, result.output  # a usage error, as every empty path option
    said = (
        f"Error: Invalid value for '{option}': {empty!r} names no file or directory (. is the current one)."
    )
    assert result.output.strip().splitlines()[-1] == said, result.output
    assert list(tmp_path.iterdir()) == []


def test_a_log_dir_that_is_a_file_is_one_line_before_the_command_starts(tmp_path: Path) -> None:
    """click's `file_okay=False` made an existing file a usage error (exit 2, the usage text)."""
    started, log_file = tmp_path / "started", tmp_path / "logs"
    log_file.write_text("not a directory")
    env = task_env(tmp_path, rank=0) | {"SLURM_HETERO_INVENTORY": str(EXAMPLE)}
    argv = ["launch", "--master-addr", "127.0.0.1", "--log-dir", str(log_file), "--"]
    result = CliRunner().invoke(cli, [*argv, "touch", str(started)], env=env)
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines == [f"slurm-hetero: --log-dir {log_file}: not a directory; give a directory you can write"]
    assert not started.exists() and log_file.read_text() == "not a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"], (
        "nothing is left when the launch is refused"
    )


@pytest.mark.parametrize("shape", ["long-name", "long-inner", "long-path", "under-a-file"])
def test_a_log_dir_that_can_never_be_made_is_one_line(tmp_path: Path, shape: str) -> None:
    """Round 5 (R-F18c/e/f): a --log-dir name over NAME_MAX or PATH_MAX ended in a traceback
    (`Path.exists` raises ENAMETOOLONG); a component that is a file too."""
    (tmp_path / "file").write_text("x")
    log_dir = {
        "long-name": tmp_path / ("l" * 300),
        "long-inner": tmp_path / ("l" * 300) / "sub",
        "long-path": tmp_path.joinpath(*["ab"] * 1700),
        "under-a-file": tmp_path / "file" / "logs",
    }[shape]
    env = task_env(tmp_path, rank=0) | {"SLURM_HETERO_INVENTORY": str(EXAMPLE)}
    argv = ["launch", "--master-addr", "127.0.0.1", "--log-dir", str(log_dir), "--", "true"]
    result = CliRunner().invoke(cli, argv, env=env)
    assert result.exit_code == 1, result.output
    assert result.output.startswith("slurm-hetero: --log-dir ") and result.output.count("\n") == 1, (
        result.output
    )
    assert "Traceback" not in result.output


# -- Slurm values too big to read ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"SLURM_JOB_ID": "9" * 10_000}, r"SLURM_JOB_ID='9{60}\.\.\.' is not a job id"),
        ({"SLURM_PROCID": "1" * 5000}, r"SLURM_PROCID='1{60}\.\.\.' is not a number of at most 10 digits"),
        ({"SLURM_STEP_TASKS_PER_NODE": "1(x1000000000)"}, r"names more nodes than the step's 1"),
        ({"SLURM_STEP_TASKS_PER_NODE": "1(x" + "9" * 5000 + ")"}, r"cannot read tasks per node"),
        ({"SLURM_HET_SIZE": "4000000000"}, r"SLURM_HET_SIZE=4000000000 is more het components than the 128"),
        ({"SLURM_JOB_ID": "12a"}, r"SLURM_JOB_ID='12a' is not a job id"),
    ],
)
def test_huge_or_malformed_slurm_values_are_one_error(
    tmp_path: Path, change: dict[str, str], message: str
) -> None:
    with pytest.raises(JobEnvError, match=message):
        parse_job_env(task_env(tmp_path) | change)


def test_tasks_per_node_expands_only_up_to_the_step_nodes() -> None:
    assert expand_tasks_per_node("2,1(x2)", 3) == [2, 1, 1]
    with pytest.raises(JobEnvError, match="more nodes than the step's 2"):
        expand_tasks_per_node("2,1(x2)", 2)


def test_cli_reports_a_huge_job_id_in_one_line(tmp_path: Path) -> None:
    env = task_env(tmp_path) | {"SLURM_JOB_ID": "9" * 10_000, "SLURM_HETERO_INVENTORY": str(EXAMPLE)}
    result = CliRunner().invoke(cli, ["launch", "--", sys.executable, "-c", "pass"], env=env)
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and result.output.startswith("slurm-hetero: SLURM_JOB_ID=")


# -- the failing rank's exit code is the step's ----------------------------------------------------


def stop_when_ready(ready: Path, signum: int) -> None:
    def wait_then_signal() -> None:
        wait_for(ready)
        os.kill(os.getpid(), signum)

    threading.Thread(target=wait_then_signal, daemon=True).start()


@pytest.mark.parametrize("ignores_sigterm", [False, True])
def test_a_rank_told_a_peer_failed_stops_its_command_and_exits_0(
    scancel: list[Call],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    ignores_sigterm: bool,
) -> None:
    """A failing rank's `scancel --signal=URG` reaches every launcher of the step: they end their
    commands (SIGKILL after the grace when SIGTERM is ignored) and exit 0, so srun's exit code (the
    highest, any signal above every code) is the failing rank's, not 137 or 143."""
    monkeypatch.setattr(supervisor_module, "STOP_GRACE_S", 1.0)
    ready = tmp_path / "ready"
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if ignores_sigterm else "pass"
    command = python(
        f"""
        import pathlib, signal, sys, time
        {ignore}
        pathlib.Path(sys.argv[1]).write_text("ready")
        time.sleep(60)
        """,
        str(ready),
    )
    stop_when_ready(ready, signal.SIGURG)
    started = time.monotonic()
    assert supervise(command) == 0
    assert time.monotonic() - started < 15
    assert scancel == []  # only the failing rank ends the step
    err = capfd.readouterr().err
    assert "slurm-hetero: rank 2 on l40sn1 stopped: another rank of the step failed" in err


@pytest.mark.parametrize("peer_failed_late", [True, False])
def test_a_peer_failed_behind_the_steps_sigterm_still_gives_exit_0(
    scancel: list[Call],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    peer_failed_late: bool,
) -> None:
    """CI (24.11): srun -K's SIGTERM (srun to slurmstepd) reached a peer before the failing rank's
    PEER_FAILED (scancel through slurmctld); the peer exited 143 and srun reported 143, not 7. A
    command ended by SIGTERM waits PEER_FAILED_LATE_S for it; a plain SIGTERM still gives 143."""
    monkeypatch.setattr(supervisor_module, "PEER_FAILED_LATE_S", 2.0)
    ready = tmp_path / "ready"
    command = python(
        """
        import pathlib, sys, time
        pathlib.Path(sys.argv[1]).write_text("ready")
        time.sleep(60)
        """,
        str(ready),
    )

    def sigterm_then_peer_failed() -> None:
        wait_for(ready)
        os.kill(os.getpid(), signal.SIGTERM)
        if peer_failed_late:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGURG)

    threading.Thread(target=sigterm_then_peer_failed, daemon=True).start()
    started = time.monotonic()
    code = supervise(command)
    elapsed = time.monotonic() - started
    err = capfd.readouterr().err
    if peer_failed_late:
        assert code == 0, err
        assert "stopped: another rank of the step failed" in err
        assert elapsed < 1.9, elapsed  # it stops waiting when PEER_FAILED comes
    else:
        assert code == 128 + signal.SIGTERM
        assert elapsed >= 2.0


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie no reaper collected has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _gone_soon(pid: int, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _running(pid)


def tree(ready: Path, ignore_sigterm: bool = False) -> tuple[str, ...]:
    """A command with a child (a shell's `sleep`, a trainer's worker) whose pid it writes to `ready`;
    with `ignore_sigterm` both ignore SIGTERM (`trap '' TERM`, inherited)."""
    return python(
        f"""
        import os, signal, subprocess, sys
        for inherited in (signal.SIGINT, signal.SIGHUP):  # a runner's SIG_IGN (nohup, `cmd &`)
            signal.signal(inherited, signal.SIG_DFL)
        if {ignore_sigterm}:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen(["sleep", "33.3"])
        open(sys.argv[1] + ".tmp", "w").write(str(child.pid))
        os.rename(sys.argv[1] + ".tmp", sys.argv[1])
        child.wait()
        """,
        str(ready),
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_reaches_the_commands_whole_tree(
    scancel: list[Call], tmp_path: Path, signum: int
) -> None:
    """F17: SIGTERM reached only the command (`bash -c 'sleep 33.3; ...'`): the launcher exited 143
    and the `sleep` ran on, holding the step's output open. The stop signals reach the tree."""
    ready = tmp_path / "pid"
    command = tree(ready)
    stop_when_ready(ready, signum)
    supervise(command)
    sleeper = int(ready.read_text())
    try:
        assert _gone_soon(sleeper), f"the command's child survived {signal.Signals(signum).name}"
    finally:
        if _running(sleeper):
            os.kill(sleeper, signal.SIGKILL)


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGUSR2])
def test_usr1_and_usr2_are_left_to_slurm(
    scancel: list[Call], tmp_path: Path, capfd: pytest.CaptureFixture[str], signum: int
) -> None:
    """adv51 B5/SIG1: Slurm delivers `scancel --signal=USR1` and `sbatch --signal=USR1@T` to every
    process of the step; the launcher's forward made the command's handler run twice. The launcher
    neither forwards them nor dies of them."""
    ready = tmp_path / "ready"
    command = python(
        f"""
        import os, signal, sys, time
        signal.signal({int(signum)}, lambda *_: print("got it", flush=True))
        open(sys.argv[1], "w").close()
        time.sleep(1.5)
        """,
        str(ready),
    )
    stop_when_ready(ready, signum)
    assert supervise(command) == 0
    assert "got it" not in capfd.readouterr().out


@pytest.mark.parametrize("leaves", ["sleep 33.3 &", "setsid sleep 33.3 &", "set -m; sleep 33.3 &"])
def test_what_an_ended_command_left_running_is_stopped(
    scancel: list[Call], tmp_path: Path, leaves: str
) -> None:
    """adv51 A7: `sh -c 'sleep 47107 & echo started; exit 0'` ended, its sleep ran on (proctrack/
    linuxproc does not end it with the step) and held the output open: the rank took 12-15 s.
    adv52 S06/P06/P07: the same with a `setsid` child or one in a group of its own, outside the
    command's group and, once the command ends, its tree."""
    ready = tmp_path / "pid"
    code = supervise(("bash", "-c", f'{leaves} echo $! > "{ready}"; exit 0'))
    sleeper = int(ready.read_text())
    try:
        assert code == 0 and _gone_soon(sleeper)
    finally:
        if _running(sleeper):
            os.kill(sleeper, signal.SIGKILL)


@pytest.mark.parametrize("sigterm_first", [False, True])
def test_sigterm_while_stopping_for_a_failed_peer_kills_at_once_and_exits_0(
    scancel: list[Call], tmp_path: Path, capfd: pytest.CaptureFixture[str], sigterm_first: bool
) -> None:
    """A-K7 (22.05): rank 1 exited 7, ranks 0 and 2 ignored SIGTERM; srun -K's own termination
    killed their launchers after KillWait (5 s), before STOP_GRACE_S (10 s), and srun reported 137.
    SIGTERM and PEER_FAILED together (either order) mean Slurm is ending the step: SIGKILL at once."""
    ready = tmp_path / "pid"
    command = tree(ready, ignore_sigterm=True)
    first, second = (signal.SIGTERM, signal.SIGURG) if sigterm_first else (signal.SIGURG, signal.SIGTERM)

    def both() -> None:
        wait_for(ready)
        os.kill(os.getpid(), first)
        time.sleep(0.5)
        os.kill(os.getpid(), second)

    threading.Thread(target=both, daemon=True).start()
    started = time.monotonic()
    code = supervise(command)
    elapsed = time.monotonic() - started
    sleeper = int(ready.read_text())
    err = capfd.readouterr().err
    try:
        assert code == 0, err
        assert elapsed < supervisor_module.STOP_GRACE_S / 2, elapsed  # not the grace, nor KillWait
        assert "stopped: another rank of the step failed" in err
        assert _gone_soon(sleeper)
    finally:
        if _running(sleeper):
            os.kill(sleeper, signal.SIGKILL)


def test_the_failing_rank_ignores_the_stop_it_sent(
    scancel: list[Call], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own `scancel --signal=URG` reaches the failing launcher too: it keeps its code."""
    monkeypatch.setattr(proc, "run", lambda argv, timeout=60.0: os.kill(os.getpid(), signal.SIGURG) or "")
    assert supervise(python("import sys; sys.exit(7)")) == 7


def test_an_ending_launcher_ignores_the_steps_sigterm_through_interpreter_shutdown(
    scancel: list[Call], monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI: srun -K's SIGTERM reached a stopped rank's launcher during interpreter shutdown, which
    puts Python handlers back to SIG_DFL, and srun reported 143. Ending, the launcher ignores it."""
    monkeypatch.setattr(supervisor_module, "KEEP_HANDLERS_WHEN_ENDING", True)
    assert supervise(python("import sys; sys.exit(7)")) == 7
    assert all(signal.getsignal(s) == signal.SIG_IGN for s in supervisor_module.FORWARDED)


def test_a_launcher_that_succeeds_gives_its_handlers_back(scancel: list[Call]) -> None:
    before = signal.getsignal(signal.SIGTERM)
    assert supervise(python("pass")) == 0
    assert signal.getsignal(signal.SIGTERM) == before


def test_run_later_runs_its_steps_in_order_from_one_process_after_this_one_moves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed rank left three detached `sh -c 'sleep N; ...'`; now one process does the three."""
    started_processes: list[list[str]] = []
    real_popen = proc.subprocess.Popen

    def popen(argv: list[str], **kwargs: object) -> object:
        started_processes.append(list(argv))
        return real_popen(argv, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(proc.subprocess, "Popen", popen)
    log, odd = tmp_path / "log", "a b; $(touch pwned) *"  # argv only: no shell reads it
    append = f"import sys; open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + chr(10))"
    started = time.monotonic()
    proc.run_later(
        [
            (0.3, [sys.executable, "-c", append, "first", odd]),
            (0.5, ["/nonexistent/command"]),  # a failing step does not stop the next
            (0.6, [sys.executable, "-c", append, "second"]),
        ]
    )
    assert time.monotonic() - started < 0.3 and not log.exists()
    assert len(started_processes) == 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 2):
        time.sleep(0.05)
    assert log.read_text().splitlines() == [f"first {odd}", "second"]
    assert time.monotonic() - started >= 0.6
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


# -- a stopped rank's command had children ---------------------------------------------------------


def test_descendants_reads_parent_ids_past_command_names_with_spaces(tmp_path: Path) -> None:
    from slurm_hetero.launch.supervise import _process_table, descendants

    for pid, name, ppid in [(10, "sh", 1), (11, "py (worker) 1", 10), (12, "sleep", 11), (13, "other", 1)]:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({name}) S {ppid} {pid} {pid} 0 -1\n")
    (tmp_path / "self").mkdir()
    table = _process_table(str(tmp_path))
    assert sorted(table) == [(10, 1, 10), (11, 10, 11), (12, 11, 12), (13, 1, 13)]
    assert sorted(descendants(10, table)) == [11, 12]
    assert descendants(13, table) == [] and _process_table(str(tmp_path / "none")) == []


def _ended(pid: int) -> bool:
    """Gone, or a zombie its new parent has not reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_a_command_stopped_as_it_starts_leaves_nothing_behind() -> None:
    """CI 23: SIGTERM to `sh -c 'sleep 30; echo ...'` as it started, sent process by process,
    missed a `sleep` forked after the tree was read (it ran on, holding the output open) or killed
    it while the shell survived and ran the echo. The command's process group is signalled at once."""
    import subprocess
    import time

    from slurm_hetero.launch.supervise import _process_table, signal_tree

    for _ in range(50):
        child = subprocess.Popen(
            ["sh", "-c", "sleep 30; echo ran on"], stdout=subprocess.PIPE, start_new_session=True
        )
        try:
            signal_tree(child, signal.SIGTERM)
            child.wait(timeout=10)
            deadline, left = time.monotonic() + 5, [0]
            while left and time.monotonic() < deadline:
                left = [pid for pid, _, group in _process_table() if group == child.pid and not _ended(pid)]
                time.sleep(0.01)
            assert not left and child.returncode == -signal.SIGTERM, (left, child.returncode)
            assert child.stdout is not None and child.stdout.read() == b""
        finally:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except OSError:
                pass
            if child.stdout is not None:
                child.stdout.close()


def test_a_stop_reaches_an_orphan_left_in_the_commands_group() -> None:
    """A double fork leaves `sleep` outside the command's tree (its parent ended) but in its
    process group: it held the step's output open after the command was stopped."""
    import subprocess
    import time

    from slurm_hetero.launch.supervise import _process_table, descendants, signal_tree

    child = subprocess.Popen(["sh", "-c", "(sleep 60 &); sleep 61"], start_new_session=True)
    try:
        deadline, orphans = time.monotonic() + 10, []
        while not orphans and time.monotonic() < deadline:
            time.sleep(0.05)
            table = _process_table()
            group = {pid for pid, _parent, pgrp in table if pgrp == child.pid}
            orphans = sorted(group - {child.pid, *descendants(child.pid, table)})
        assert orphans, "the orphan never appeared"
        assert set(orphans) <= set(signal_tree(child, signal.SIGTERM))
        child.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not all(map(_ended, orphans)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(map(_ended, orphans))
    finally:
        os.killpg(child.pid, signal.SIGKILL) if child.poll() is None else None


def test_a_stopped_command_takes_its_children_with_it() -> None:
    """`sh -c '...; sleep 60'` stopped by SIGTERM left its sleep running: the step did not end
    until the failing rank's SIGKILL 20 s later, and srun reported 137 instead of its exit code."""
    import subprocess
    import time

    from slurm_hetero.launch.supervise import descendants, signal_tree

    child = subprocess.Popen(["sh", "-c", "sleep 60; echo done"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not descendants(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (sleeper,) = descendants(child.pid)
        stopped = signal_tree(child, signal.SIGTERM)
        assert set(stopped) == {child.pid, sleeper}
        child.wait(timeout=10)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{sleeper}").exists() and time.monotonic() < deadline:
            try:  # reap it if it became ours; else init does
                os.waitpid(sleeper, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.05)
        state = (
            Path(f"/proc/{sleeper}/stat").read_text().split(")")[-1].split()[0]
            if Path(f"/proc/{sleeper}").exists()
            else "gone"
        )
        assert state in ("gone", "Z"), state
    finally:
        if child.poll() is None:
            child.kill()


@pytest.mark.parametrize(
    ("signals", "expected"),
    [
        ((signal.SIGURG,), 0),
        ((signal.SIGTERM,), 143),
        ((signal.SIGTERM, signal.SIGURG), 0),
        ((signal.SIGINT,), 130),
    ],
)
def test_signals_while_the_launcher_plans_are_not_lost(
    scancel: list[Call],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    signals: tuple[int, ...],
    expected: int,
) -> None:
    """B1-K5 (24.11): rank 0 exited 1 at once; its PEER_FAILED reached ranks still planning (SIGURG
    ignored: lost), srun -K's SIGTERM came next, they exited 143 and srun said 143, not 1. Signals
    from the launch command's start are kept; the command is then not started."""
    monkeypatch.setattr(supervisor_module, "PEER_FAILED_LATE_S", 1.0)
    monkeypatch.setattr(supervisor_module, "KEEP_HANDLERS_WHEN_ENDING", True)  # as the launch command
    kept = (signal.SIGURG, signal.SIGUSR1, signal.SIGUSR2, *supervisor_module.STOP_SIGNALS)
    saved = {s: signal.getsignal(s) for s in kept}
    ran = tmp_path / "ran"
    try:
        early.catch_early()
        os.kill(os.getpid(), signals[0])
        if len(signals) > 1:
            threading.Timer(0.3, os.kill, (os.getpid(), signals[1])).start()
        code = supervise(python("import pathlib, sys; pathlib.Path(sys.argv[1]).touch()", str(ran)))
        # ending: SIG_IGN, which interpreter shutdown keeps (it puts Python handlers back to
        # SIG_DFL: srun -K's SIGTERM then ended the exiting launcher, "task 0: Terminated", 24.11)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        # and USR1/USR2, which Slurm delivers to the step's processes, as `run` leaves them
        assert signal.getsignal(signal.SIGUSR1) == signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
    finally:
        supervisor_module._EARLY.clear()
        supervisor_module._CATCHING[0] = False
        for s, handler in saved.items():
            signal.signal(s, handler)
    assert code == expected and not ran.exists()
    assert ("stopped: another rank of the step failed" in capfd.readouterr().err) == (expected == 0)
    assert scancel == []


def test_a_peer_failed_while_the_command_starts_is_not_lost(
    scancel: list[Call], tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between planning and the supervisor's handlers (the command's fork and exec), PEER_FAILED
    is kept too and acted on once the command runs: it is stopped, the rank exits 0."""
    real = supervisor_module.subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGURG)
        return real(*args, **kwargs)

    monkeypatch.setattr(supervisor_module.subprocess, "Popen", popen)
    saved = {s: signal.getsignal(s) for s in (signal.SIGURG, *supervisor_module.STOP_SIGNALS)}
    try:
        early.catch_early()
        started = time.monotonic()
        code = supervise(tree(tmp_path / "pid"))
    finally:
        early.stop_catching()
        for s, handler in saved.items():
            signal.signal(s, handler)
    assert code == 0 and time.monotonic() - started < 8
    assert "stopped: another rank of the step failed" in capfd.readouterr().err


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["launch", "--model", "gpt2", "--", "python", "--dry-run"], True),
        (["launch", "--dry-run", "--simulate", "n:a100:1"], False),
        (["launch", "--exec", "--", "true"], False),
        (["plan", "--devices", "a100:1"], False),
        ([], False),
    ],
)
def test_the_entry_point_keeps_early_signals_for_supervised_launches(argv: list[str], wanted: bool) -> None:
    assert early.supervised_launch(argv) is wanted


def test_early_signals_are_kept_before_the_clis_imports(tmp_path: Path) -> None:
    """The CLI's imports take about half a second: a PEER_FAILED then was still lost (B1-K5)."""
    code = """
        import builtins, signal, sys
        sys.argv = ["slurm-hetero", "launch", "--", "true"]
        seen = []
        real = builtins.__import__
        def spy(name, *args, **kwargs):
            if name == "slurm_hetero.cli" and not seen:
                seen.append(signal.getsignal(signal.SIGURG))
            return real(name, *args, **kwargs)
        builtins.__import__ = spy
        from slurm_hetero.entry import main
        try:
            main()
        except SystemExit:
            pass
        print("HANDLER", getattr(seen[0], "__qualname__", seen[0]))
        """
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")} | {"PYTHONPATH": str(REPO)}
    result = subprocess.run(python(code), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert "HANDLER _record" in result.stdout, result.stdout + result.stderr


# -- two jobs, one --resume directory ------------------------------------------------------------


def test_a_resume_directory_another_listed_job_uses_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adversarial F14 (issue 23): two jobs resuming into one directory overwrote each other's
    steps. The directory names its job; another job squeue still lists is refused in one line."""
    replace = dataclasses.replace
    listed: list[str] = []
    monkeypatch.setattr(run, "_listed", lambda job_id: job_id in listed)
    job = replace(run.simulated_job(run.parse_simulate("a1:a100_80g:1")), job_id="41")
    run.claim_resume_dir(tmp_path, replace(job, rank=1))
    assert not (tmp_path / run.RESUME_OWNER).exists()  # rank 0 writes it
    run.claim_resume_dir(tmp_path, job)
    assert (tmp_path / run.RESUME_OWNER).read_text() == "41\n"
    run.claim_resume_dir(tmp_path, job)  # its own next step
    other = replace(job, job_id="42")
    run.claim_resume_dir(tmp_path, other)  # 41 ended: the directory is 42's now
    assert (tmp_path / run.RESUME_OWNER).read_text() == "42\n"
    listed.append("42")
    with pytest.raises(
        supervisor_module.LaunchError, match=r"^--resume: .* is used by job 42, which Slurm still lists: "
    ):
        run.claim_resume_dir(tmp_path, job)
    assert (tmp_path / run.RESUME_OWNER).read_text() == "42\n"
    (tmp_path / run.RESUME_OWNER).write_bytes(b"4" * 10**7)  # not ours: read within its bound
    with pytest.raises(supervisor_module.LaunchError, match=r"--resume owner"):
        run.claim_resume_dir(tmp_path, job)


@pytest.mark.parametrize(
    ("answer", "listed"), [("42\n", True), ("", False), (ToolError(["squeue"], 1, "Invalid job id"), False)]
)
def test_a_job_is_listed_when_squeue_prints_it(
    monkeypatch: pytest.MonkeyPatch, answer: str | ToolError, listed: bool
) -> None:
    def squeue(argv: list[str], timeout: float = 60.0) -> str:
        assert argv == ["squeue", "-h", "-j", "42", "-o", "%i"] and timeout <= 30
        if isinstance(answer, ToolError):
            raise answer
        return answer

    monkeypatch.setattr(proc, "run", squeue)
    assert run._listed("42") is listed
