"""Launcher faults under the real Slurm (marker `slurm`, both releases): a step without devices is
refused, one rank's exit code is srun's, a hanging rank is ended by srun's --wait, a plain user
runs `srun slurm-hetero launch` (a private layout directory, removed after), and an unwritable
--log-dir is one line before anything runs."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.conftest import Cluster, active

TWO_NODES = ["-w", "a100n1,l40sn1", "-N2", "--ntasks-per-node=1", "--gres=gpu:1"]


def launch() -> list[str]:
    """`slurm-hetero launch` with the Python the cluster's nodes run (24.11: the root's venv)."""
    return [active().python, "-m", "slurm_hetero", "launch"]


def run(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return active().run(argv, timeout=timeout, cwd=str(REPO), env=dict(os.environ))


def test_a_step_without_devices_is_refused(dev_cluster: Cluster) -> None:
    result = run(["srun", "-n2", "-w", "a100n1", *launch(), "--", "env"])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "RANK=" not in result.stdout
    ours = [line for line in result.stderr.splitlines() if line.startswith("slurm-hetero:")]
    assert ours and all("no devices are allocated to this step" in line for line in ours), result.stderr
    assert "--gpus-per-task" in ours[0] and "Traceback" not in result.stderr


def test_a_node_with_more_devices_than_tasks_ends_the_ranks_of_the_others(dev_cluster: Cluster) -> None:
    """adv34 I15: -n3 over two nodes of 2 devices leaves one node a task with 2 devices. Its rank
    was refused, but the other node's ranks ran their command to its end."""
    nodes = ["-w", "a100n1,l40sn1", "-N2", "-n3", "--gres=gpu:2"]
    started = time.monotonic()
    result = run(["srun", *nodes, *launch(), "--", "sh", "-c", "sleep 30; echo ran to the end"])
    elapsed = time.monotonic() - started
    assert result.returncode != 0 and "ran to the end" not in result.stdout, result.stdout + result.stderr
    assert "runs 1 task but Slurm gave the step 2 device(s) there" in result.stderr, result.stderr
    assert elapsed < 25, elapsed


def test_one_failing_rank_gives_srun_its_exit_code(dev_cluster: Cluster) -> None:
    """Rank 1 exits 7 while rank 0 sleeps: srun (with -K, as the README runs it) exits 7, soon;
    before, the failing launcher's own `scancel` killed it and srun said 137 (Killed)."""
    script = "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(7)\ntime.sleep(120)\n"
    started = time.monotonic()
    result = run(["srun", "-K", *TWO_NODES, *launch(), "--", dev_cluster.python, "-c", script])
    elapsed = time.monotonic() - started
    assert result.returncode == 7, result.stderr
    assert elapsed < 40, elapsed
    assert "rank 1 on l40sn1 (l40s, stage 0) exited with code 7" in result.stderr
    assert "rank 0 on a100n1 stopped: another rank of the step failed" in result.stderr


def test_a_peer_ignoring_sigterm_still_gives_srun_the_failing_code(dev_cluster: Cluster) -> None:
    """A-K7 (22.05): rank 1 exits 7, rank 0's command ignores SIGTERM (`trap '' TERM`). srun -K's
    own termination killed rank 0's launcher after KillWait (5 s), inside the 10 s grace before
    SIGKILL: srun said 137. SIGTERM while stopping for a failed peer now kills the command at once."""
    script = "trap '' TERM; if [ \"$RANK\" = 1 ]; then exit 7; fi; sleep 60"
    started = time.monotonic()
    result = run(["srun", "-K", *TWO_NODES, *launch(), "--", "sh", "-c", script])
    elapsed = time.monotonic() - started
    assert result.returncode == 7, result.stderr
    assert "rank 0 on a100n1 stopped: another rank of the step failed" in result.stderr
    assert "task 0: Killed" not in result.stderr and elapsed < 30, (elapsed, result.stderr)


@pytest.mark.parametrize(
    "nodes", [["-n2", "-w", "l40sn1", "--gpus-per-task=1"], TWO_NODES], ids=["one-node", "two-nodes"]
)
def test_a_failing_rank_stops_a_peer_whose_command_has_children(
    dev_cluster: Cluster, nodes: list[str]
) -> None:
    """Adversarial re-pass: rank 0's shell waits on a `sleep`; rank 1 exits 3. Stopping only the
    shell left the sleep in the step until the failing rank's SIGKILL 20 s later: srun said 137."""
    script = 'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 60'
    started = time.monotonic()
    result = run(["srun", *nodes, *launch(), "--", "sh", "-c", script])
    elapsed = time.monotonic() - started
    assert result.returncode == 3, result.stderr
    assert elapsed < 18, elapsed


USR1_COUNTER = """import os, signal, subprocess, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
child = subprocess.Popen([sys.executable, "-c", "import signal, time\\n"
    "signal.signal(signal.SIGUSR1, lambda *_: print('child got it', flush=True))\\ntime.sleep(6)"])
time.sleep(0.5)
open(sys.argv[1], "w").close()
time.sleep(4)
print("command got it", len(got), "time(s)", flush=True)
child.wait()
"""


def test_usr1_reaches_the_command_and_its_children_once(dev_cluster: Cluster, tmp_path: Path) -> None:
    """adv51 B5/SIG1: Slurm delivers `scancel --signal=USR1 JOB.STEP` to every process of the step;
    the launcher's forward made the command's checkpoint handler run twice."""
    ready, script = tmp_path / "ready", tmp_path / "usr1.py"
    script.write_text(USR1_COUNTER)
    step = f"srun -n1 {' '.join(launch())} -- {active().python} {script} {ready}"
    signal_it = f"until [ -e {ready} ]; do sleep 0.1; done; scancel --signal=USR1 $SLURM_JOB_ID.0"
    result = run(["salloc", "-w", "a100n1", "-n1", "--gres=gpu:1", "sh", "-c", f"{step} & {signal_it}; wait"])
    assert result.returncode == 0, result.stderr
    assert "command got it 1 time(s)" in result.stdout and "child got it" in result.stdout, result.stdout


@pytest.mark.parametrize("how", ["", "setsid "])
def test_what_an_ended_command_left_running_is_stopped(dev_cluster: Cluster, how: str) -> None:
    """adv51 A7, adv52 S06: `[setsid] sleep & ...; exit 0` left its sleep running after the step
    (proctrack/linuxproc does not end it) and the rank took 12-15 s."""
    marker = f"{os.getpid()}.{time.monotonic_ns() % 10**6}"
    result = run(["srun", *TWO_NODES, *launch(), "--", "sh", "-c", f"{how}sleep 7{marker[-4:]}.5 & exit 0"])
    assert result.returncode == 0, result.stderr
    left = run(["sh", "-c", f"ps -eo args | grep -c '^sleep 7{marker[-4:]}.5' || true"])
    assert left.stdout.strip() == "0", left.stdout


def test_every_rank_failing_alike_gives_its_code(dev_cluster: Cluster) -> None:
    result = run(["srun", *TWO_NODES, *launch(), "--", "sh", "-c", "exit 7"])
    assert result.returncode == 7, result.stderr
    assert "Killed" not in result.stderr


def test_a_hanging_rank_is_ended_by_srun_wait(dev_cluster: Cluster) -> None:
    """Rank 0 finishes, rank 1 never does: `srun --wait=5` (the manual's advice) ends it ~5 s after
    the first exit and names it."""
    script = "import os, time\nif os.environ['RANK'] == '1': time.sleep(300)\n"
    started = time.monotonic()
    result = run(["srun", "--wait=5", *TWO_NODES, *launch(), "--", dev_cluster.python, "-c", script])
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert elapsed < 40, elapsed
    assert "task 1: running" in result.stderr, result.stderr


def test_a_plain_user_runs_the_launcher_with_a_private_layout(dev_cluster: Cluster) -> None:
    """`srun slurm-hetero launch` as nobody: the command is found (22.05: /usr/local/bin/slurm-hetero
    that `dev-cluster up` writes; 24.11: the root's venv), the layout is the user's only (0700
    directory, 0600 file) and removed when the rank ends."""
    show = (
        'stat -c "MODE %a %U" "$SLURM_HETERO_LAYOUT" "${SLURM_HETERO_LAYOUT%/*}"; '
        'echo "LAYOUT=$SLURM_HETERO_LAYOUT"'
    )
    argv = ["srun", "-n1", "-w", "a100n1", "--gres=gpu:1", "slurm-hetero", "launch", "--", "sh", "-c", show]
    result = dev_cluster.run(argv, "nobody", timeout=120, cwd="/tmp")
    assert result.returncode == 0, result.stderr
    assert "MODE 600 nobody" in result.stdout and "MODE 700 nobody" in result.stdout, result.stdout
    layout = next(line.split("LAYOUT=", 1)[1] for line in result.stdout.splitlines() if "LAYOUT=" in line)
    assert not dev_cluster.release.path(Path(layout).parent).exists()


def test_an_unwritable_log_dir_is_one_line_and_runs_nothing(dev_cluster: Cluster, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    argv = ["srun", "-n1", "-w", "a100n1", "--gres=gpu:1", *launch(), "--log-dir", "/proc/logs"]
    result = run([*argv, "--", "touch", str(marker)])
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and not marker.exists()
    ours = [line for line in result.stderr.splitlines() if line.startswith("slurm-hetero:")]
    assert len(ours) == 1 and ours[0].startswith("slurm-hetero: --log-dir /proc/logs: cannot"), result.stderr
