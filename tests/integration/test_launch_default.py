"""`srun slurm-hetero launch` out of the box on the real dev cluster (marker `slurm`): the README's
command with the inventory `dev-cluster up` installs, the launcher without `--model` and without
any inventory (device types from `scontrol show node`), more tasks than devices refused, and the
predicted step time against a measured one (scripts/bench_launch; BENCHMARKS.md has every
family)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.conftest import Cluster, active

SITE_INVENTORY = Path("/etc/slurm-hetero/inventory.yaml")  # as the cluster's nodes see it
PRINT_ENV = (
    "import os; from slurm_hetero import layout; me = layout.current(); "
    "print('RANKENV', os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['LOCAL_RANK'], "
    "os.environ['MASTER_ADDR'], me.type, me.model or '-', me.samples, flush=True)"
)


def launch() -> list[str]:
    """`slurm-hetero launch` with the Python the cluster's nodes run (24.11: the root's venv)."""
    return [active().python, "-m", "slurm_hetero", "launch"]


def site_inventory() -> Path:
    return active().release.path(SITE_INVENTORY)


def run(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """A client command with the active release's tools, from the checkout."""
    return active().run(argv, timeout=timeout, cwd=str(REPO))


def rank_lines(stdout: str) -> list[list[str]]:
    return sorted(line.split("RANKENV ", 1)[1].split() for line in stdout.splitlines() if "RANKENV" in line)


def test_dev_cluster_installs_the_inventory_where_the_launcher_looks(dev_cluster: Cluster) -> None:
    assert site_inventory().read_text() == dev_cluster.inventory.read_text()


def test_the_readme_launcher_command_runs_as_written(dev_cluster: Cluster, tmp_path: Path) -> None:
    # README: sbatch -N3 --gpus-per-node=1 --wrap "srun -K slurm-hetero launch --model llama-3-8b
    # --global-batch 512 -- python train.py" (train.py: print this rank's place)
    out = tmp_path / "job.out"
    tmp_path.chmod(0o777)
    command = " ".join([*launch(), "--model", "llama-3-8b", "--global-batch", "512"])
    wrap = f'srun -K {command} -- {dev_cluster.python} -c "{PRINT_ENV}"'
    argv = ["sbatch", "-N3", "-w", "a100n1,l40sn1,ascendn1", "--gpus-per-node=1", "-o", str(out)]
    result = active().sbatch_wait([*argv, "--wrap", wrap], timeout=600, cwd=str(REPO))  # sbatch --wait
    text = out.read_text() if out.exists() else ""
    assert result.returncode == 0, result.stderr + text[-3000:]
    ranks = rank_lines(text)
    assert [r[:2] for r in ranks] == [["0", "3"], ["1", "3"], ["2", "3"]], text[-3000:]
    assert {r[4] for r in ranks} == {"a100_80g", "l40s", "ascend910b3"}


@pytest.fixture
def no_site_inventory() -> Iterator[None]:
    """The installed inventory moved aside for one test (restored after)."""
    installed = site_inventory()
    aside = installed.with_suffix(".yaml.aside")
    shutil.move(installed, aside)
    try:
        yield
    finally:
        shutil.move(aside, installed)


def test_without_model_or_inventory_the_launcher_is_torchrun_like(
    dev_cluster: Cluster, no_site_inventory: None
) -> None:
    srun = ["srun", "-K", "-w", "a100n1,l40sn1", "-N2", "--ntasks-per-node=2", "--gres=gpu:2"]
    result = run([*srun, *launch(), "--global-batch", "8", "--", dev_cluster.python, "-c", PRINT_ENV])
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = rank_lines(result.stdout)
    assert [r[:3] for r in ranks] == [["0", "4", "0"], ["1", "4", "1"], ["2", "4", "0"], ["3", "4", "1"]]
    assert {r[3] for r in ranks} == {"a100n1"} and {r[5] for r in ranks} == {"-"}
    assert [r[6] for r in ranks] == ["2", "2", "2", "2"]  # even data parallel
    assert {r[4] for r in ranks} == {"a100_80g", "l40s"}  # Slurm's Type= names, from scontrol show node


def test_more_tasks_than_devices_on_a_node_is_refused(dev_cluster: Cluster) -> None:
    srun = ["srun", "-w", "a100n1", "-N1", "-n2", "--gpus=1"]
    result = run([*srun, *launch(), "--", "true"])
    assert result.returncode != 0
    assert "a100n1 runs 2 tasks but Slurm gave the step 1 device(s) there" in result.stderr
