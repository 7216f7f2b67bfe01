"""`slurm-hetero install` under the real Slurm (the host's release, Debian 12): the dev cluster
runs the node install (`scripts/dev-cluster up` calls it); jobs of a plain user get their
device variable and find the command before, during and after `install --upgrade` (no task
fails while the scripts change), and `--uninstall` refuses while slurm.conf names the TaskProlog,
then removes it once slurm.conf does not, jobs still running."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.conftest import Cluster, slurm
from tests.integration.test_faults_slurm import ascend_node
from tests.integration.test_job_submit_slurm import as_user

MANIFEST = Path("/opt/slurm-hetero/install.json")
# Each step runs the TaskProlog; the step prints its start time and what the TaskProlog exported.
LOOP = (
    'i=0; while [ ! -e "$STOP" ] && [ $i -lt 200 ]; do i=$((i+1)); '
    "srun -n1 --gres=gpu:$TYPE:1 sh -c 'echo step $(date +%s.%N) ${ASCEND_RT_VISIBLE_DEVICES-unset}' "
    "|| echo FAILED; done; echo done $i"
)


CONFIG = "slurm-hetero-config.yaml"  # the suite's settings, as dev-cluster up installs them


def install(*args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "slurm_hetero", "install", "--python", "/usr/bin/python3", *args]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=900, check=False)


def host_release(cluster: Cluster) -> None:
    if cluster.release.chrooted:
        pytest.skip("the node install is tested on the host's release (a chrooted one has its root's venv)")


def job_sees_its_device_and_the_command(node: str, gres_type: str) -> None:
    run = as_user(
        "srun", "-w", node, f"--gres=gpu:{gres_type}:1", "sh", "-c",
        "echo V=${ASCEND_RT_VISIBLE_DEVICES-unset}; slurm-hetero --version",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0][2:].isdigit() and lines[1].startswith("slurm-hetero, version"), run.stdout + run.stderr


def test_jobs_run_before_during_and_after_an_upgrade(dev_cluster: Cluster) -> None:
    host_release(dev_cluster)
    node, gres_type = ascend_node(dev_cluster.inventory)
    before = json.loads(MANIFEST.read_text())
    job_sees_its_device_and_the_command(node, gres_type)

    out = Path(f"/tmp/slurm-hetero-upgrade-{time.monotonic_ns()}")
    stop = out.with_suffix(".stop")  # where the job's user sees it
    submitted = as_user(
        "sbatch", "--parsable", "-w", node, f"--gres=gpu:{gres_type}:1", "-o", str(out),
        f"--export=ALL,STOP={stop},TYPE={gres_type}", "--wrap", LOOP,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    try:
        _wait_for(lambda: out.exists() and "step" in out.read_text(), 60)
        started = time.time()
        upgrade = install("--upgrade", "--inventory", str(dev_cluster.inventory))
        swapped = time.time()
        assert upgrade.returncode == 0, upgrade.stderr
        _wait_for(lambda: _steps_after(out, swapped), 60)
    finally:
        stop.touch()
    _wait_for(lambda: "done" in out.read_text(), 60)
    text = out.read_text()
    out.unlink()
    stop.unlink()
    steps = [line.split() for line in text.splitlines() if line.startswith("step")]
    assert "FAILED" not in text and all(s[2].isdigit() for s in steps), text
    assert any(float(s[1]) < started for s in steps) and any(float(s[1]) > swapped for s in steps), text
    during = [s for s in steps if started <= float(s[1]) <= swapped]
    after = json.loads(MANIFEST.read_text())
    assert after["venv"] != before["venv"] and Path(before["venv"]).exists()  # kept: tasks may run it
    assert after["venv"] in (dev_cluster.etc / "slurm-hetero-taskprolog").read_text()
    job_sees_its_device_and_the_command(node, gres_type)
    print(f"upgrade in {swapped - started:.1f}s; job {job}: {len(steps)} steps, {len(during)} during it")


def _steps_after(out: Path, when: float) -> bool:
    return any(
        float(line.split()[1]) > when + 1 for line in out.read_text().splitlines() if line.startswith("step")
    )


def _wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def test_uninstall_waits_for_slurm_conf_then_leaves_jobs_running(dev_cluster: Cluster) -> None:
    host_release(dev_cluster)
    node, gres_type = ascend_node(dev_cluster.inventory)
    conf = dev_cluster.etc / "slurm.conf"
    text = conf.read_text()
    refused = install("--uninstall")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert f"{conf}:" in refused.stderr and "TaskProlog=/etc/slurm/slurm-hetero-taskprolog" in refused.stderr
    assert MANIFEST.exists() and (dev_cluster.etc / "slurm-hetero-taskprolog").exists()
    try:
        conf.write_text("".join(ln for ln in text.splitlines(True) if not ln.startswith("TaskProlog=")))
        slurm("scontrol", "reconfigure")
        time.sleep(2)
        done = install("--uninstall")
        assert done.returncode == 0, done.stderr
        assert not (dev_cluster.etc / "slurm-hetero-taskprolog").exists() and not MANIFEST.exists()
        run = as_user("srun", "-w", node, f"--gres=gpu:{gres_type}:1", "sh", "-c", "echo $SLURM_STEP_GPUS")
        assert run.returncode == 0 and run.stdout.strip().isdigit(), run.stderr  # no dangling TaskProlog
    finally:
        again = install("--inventory", str(dev_cluster.inventory), "--config", str(dev_cluster.etc / CONFIG))
        conf.write_text(text)
        slurm("scontrol", "reconfigure")
        time.sleep(2)
    assert again.returncode == 0, again.stderr
    job_sees_its_device_and_the_command(node, gres_type)
