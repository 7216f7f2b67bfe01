"""Issue 9 under the real Slurm: the TaskProlog in real jobs whatever the job's environment and
the inventory's state, slurmctld reloading the hook after a re-render that repairs a damaged table,
and an inventory that would make slurmctld refuse to start (a node named twice) never reaching it.
Issue 26: files jobs read, kept 0600 from before, are installed readable by every user."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_hetero.core import hostlist
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.nodes import gres_order
from tests.conftest import REPO
from tests.integration.conftest import DEV_CLUSTER, Cluster, slurm, suite_up_argv, tres
from tests.integration.test_job_submit_slurm import (
    as_user,
    as_user_wait,
    job_fields,
    reload_hook,
    render_hook,
)

HOSTILE_ENV = {
    "SLURM_HETERO_TASK_PROLOG_STRICT": "maybe",
    "SLURM_HETERO_TASK_PROLOG_INVENTORY": "/dev/zero",
    "SLURM_HETERO_INVENTORY": "/dev/zero",
    "SLURM_HETERO_VERBOSE": "lots",
    "SLURM_HETERO_CONFIG": "/dev/zero",
    # adversarial find: these failed Python's start-up, so the task, until the script ran python -I
    "PYTHONHOME": "/nonexistent",
    "PYTHONINSPECT": "1",
    "PYTHONIOENCODING": "bogus",
    "PYTHONPATH": "/nonexistent",
}


def ascend_node(inventory_path: Path) -> tuple[str, str]:
    for node in inventory.load(inventory_path).nodes:
        devices = gres_order(node.devices)
        if devices and devices[0].vendor == "ascend" and len(devices) >= 2:
            return hostlist.expand(node.name)[0], devices[0].type
    pytest.skip("no Ascend node with two devices in the session inventory")


def run_ascend_job(node: str, gres_type: str, env: dict[str, str]) -> tuple[int, str]:
    """`sbatch --wait` as a plain user on an Ascend node; (rc, the job's output)."""
    out = Path(f"/tmp/slurm-hetero-faults-{os.getpid()}-{time.monotonic_ns()}.out")
    exports = ",".join(["ALL", *(f"{k}={v}" for k, v in env.items())])
    script = "echo VISIBLE=${ASCEND_RT_VISIBLE_DEVICES-unset} GPUS=$SLURM_JOB_GPUS"
    run = as_user_wait(
        "sbatch", "-w", node, f"--gres=gpu:{gres_type}:2", f"--export={exports}", "-o", str(out),
        "--wrap", script,
    )  # fmt: skip
    text = out.read_text() if out.exists() else ""
    out.unlink(missing_ok=True)
    return run.returncode, text + run.stderr


def test_the_jobs_environment_cannot_fail_or_steer_the_taskprolog(dev_cluster: Cluster) -> None:
    node, gres_type = ascend_node(dev_cluster.inventory)
    rc, output = run_ascend_job(node, gres_type, HOSTILE_ENV)
    assert rc == 0, output
    line = next(ln for ln in output.splitlines() if ln.startswith("VISIBLE="))
    visible, gpus = line.split()[0].removeprefix("VISIBLE="), line.split()[1].removeprefix("GPUS=")
    assert visible != "unset" and len(visible.split(",")) == len(gpus.split(",")) == 2, output


def test_files_jobs_read_kept_0600_are_installed_readable(dev_cluster: Cluster, suite_config: Path) -> None:
    """Issue 26 repro 2: on 22.05 `up` kept an installed inventory's 0600, so every non-root task
    lost its vendor's visible-device variable; `up` again over 0600 files makes them 0644."""
    readers = [
        next(dev_cluster.etc.glob("slurm-hetero-inventory.*")),
        dev_cluster.release.path("/etc/slurm-hetero/inventory.yaml"),
        dev_cluster.etc / "slurm-hetero-config.yaml",
        dev_cluster.etc / "slurm.conf",
        dev_cluster.etc / "slurm-nodes.conf",
    ]
    for path in readers:
        path.chmod(0o600)
    argv = suite_up_argv(dev_cluster.name, dev_cluster.inventory, suite_config)
    result = subprocess.run(argv, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert {str(p): oct(p.stat().st_mode & 0o777) for p in readers} == {str(p): "0o644" for p in readers}
    node, gres_type = ascend_node(dev_cluster.inventory)
    rc, output = run_ascend_job(node, gres_type, {})
    assert rc == 0 and "VISIBLE=unset" not in output and "VISIBLE=" in output, output


@pytest.fixture
def inventory_moved_away(dev_cluster: Cluster) -> Iterator[Path]:
    installed = dev_cluster.release.path("/etc/slurm-hetero/inventory.yaml")  # the TaskProlog's
    moved = installed.with_name(installed.name + ".moved")
    installed.rename(moved)
    try:
        yield installed
    finally:
        moved.rename(installed)


def test_an_ascend_job_is_told_when_the_inventory_is_gone(
    inventory_moved_away: Path, dev_cluster: Cluster
) -> None:
    node, gres_type = ascend_node(dev_cluster.inventory)
    rc, output = run_ascend_job(node, gres_type, {})
    assert rc == 0, output  # the task runs
    assert "VISIBLE=unset" in output
    assert "slurm-hetero task-prolog:" in output and "no visible-device variable exported" in output, output


def test_a_rerender_after_a_damaged_table_recovers_the_running_slurmctld(
    dev_cluster: Cluster, suite_config: Path
) -> None:
    """Before: the re-render rewrote only the table, job_submit.lua's mtime stayed, and slurmctld
    kept the hook that had failed to load its table."""
    render_hook(dev_cluster.inventory, suite_config)
    table = dev_cluster.etc / "slurm_hetero_tables.lua"
    table.write_text(table.read_text().replace("return {", "return {{ broken", 1))
    reload_hook()  # slurmctld loads the hook with the damaged table (fail policy open: jobs pass as is)
    broken = as_user("sbatch", "-H", "--parsable", "--gres=gpumem:20G", "-o", "/dev/null", "--wrap", "true")
    assert (
        broken.returncode == 0 and tres(job_fields(broken.stdout.strip())["TresPerNode"]) == "gres:gpumem:20G"
    )
    slurm("scancel", broken.stdout.strip())
    subprocess.run(  # the admin's repair: render again, nothing else
        [sys.executable, "-m", "slurm_hetero", "job-submit", "render", "--inventory",
         str(dev_cluster.inventory), "--out", str(dev_cluster.etc), "--config", str(suite_config)],
        check=True, cwd=REPO, capture_output=True,
    )  # fmt: skip
    fixed = as_user("sbatch", "-H", "--parsable", "--gres=gpumem:20G", "-o", "/dev/null", "--wrap", "true")
    assert fixed.returncode == 0, fixed.stderr
    assert tres(job_fields(fixed.stdout.strip())["TresPerNode"]).startswith(("gres:gpu:", "gres:shard:"))
    slurm("scancel", fixed.stdout.strip())


def test_a_node_named_twice_never_reaches_slurmctld(dev_cluster: Cluster, tmp_path: Path) -> None:
    """slurmctld refuses to start on a duplicated NodeName; the inventory is refused before."""
    data = inventory.inventory_to_dict(inventory.load(dev_cluster.inventory))
    twin = json.loads(json.dumps(data["nodes"][0]))
    twin["name"] = f"{hostlist.expand(data['nodes'][0]['name'])[0]},zz-extra1"  # overlapping hostlist
    data["nodes"].append(twin)
    bad = tmp_path / "twice.json"
    bad.write_text(json.dumps(data))
    before = (dev_cluster.etc / "slurm-nodes.conf").read_bytes()
    result = subprocess.run(
        [
            sys.executable,
            str(DEV_CLUSTER),
            "up",
            "--slurm-release",
            dev_cluster.name,
            "--inventory",
            str(bad),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0 and "named" in result.stderr and "duplicated NodeName" in result.stderr
    assert (dev_cluster.etc / "slurm-nodes.conf").read_bytes() == before
    assert "UP" in slurm("scontrol", "ping")


def discover_fanned(cluster: Cluster, *args: str, conf: Path | None = None) -> subprocess.CompletedProcess:
    """`slurm-hetero discover ARGS` as the cluster's client; `conf`: SLURM_CONF for its scontrol."""
    argv = [cluster.python, "-m", "slurm_hetero", "discover", *args, "--json"]
    env_first = ["env", f"SLURM_CONF={conf}"] if conf else []
    return cluster.run([*env_first, *argv], timeout=60, cwd=str(REPO))


def test_discover_exits_3_when_slurmctld_cannot_be_asked(dev_cluster: Cluster, tmp_path: Path) -> None:
    """adv26b F3: `discover --all/--nodes` with slurmctld unreachable (a slurm.conf naming a port
    nothing listens on) is scontrol's failure, exit 3 as the table says; a node Slurm does not
    know is the user's, exit 1."""
    conf = (dev_cluster.etc / "slurm.conf").read_text()
    assert "SlurmctldPort=" in conf
    lines = ["SlurmctldPort=9" if ln.startswith("SlurmctldPort=") else ln for ln in conf.splitlines()]
    lines = [ln for ln in lines if not ln.startswith("MessageTimeout=")]
    lines.append("MessageTimeout=2")  # scontrol gives up connecting after 1 s, not 9
    away = tmp_path / "slurm.conf"
    away.write_text("\n".join(lines) + "\n")
    tmp_path.chmod(0o755)
    for args in (["--all"], ["--nodes", "a100n1,l40sn1"]):
        result = discover_fanned(dev_cluster, *args, conf=away)
        assert result.returncode == 3, (args, result.returncode, result.stderr)
        assert result.stderr.count("\n") == 1 and "scontrol show node -o" in result.stderr, result.stderr
    for nodes in ("nosuchn1", "nosuchn1,nosuchn2", "nosuchn[1-3]"):
        unknown = discover_fanned(dev_cluster, "--nodes", nodes)
        assert unknown.returncode == 1, (nodes, unknown.stderr)
        assert unknown.stderr == f"slurm-hetero: Slurm knows no node in {nodes!r}\n", unknown.stderr
