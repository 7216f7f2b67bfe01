"""`slurm-hetero sbatch` against the real cluster: a script's #SBATCH lines reach slurmctld as the
user wrote them (a named type kept), and gpumem is added only where no device is named."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from slurm_hetero.units import format_size
from tests.conftest import REPO
from tests.integration.conftest import Cluster, active, slurm, tres
from tests.integration.test_job_submit_slurm import USER, job_fields

SCRIPT = "#!/bin/bash\n#SBATCH --gres=gpu:a100_80g:2\n#SBATCH -J sbatch-wrapper\n#SBATCH --hold\nhostname\n"


VENV_PYTHON = "/opt/slurm-hetero/venv/bin/python"  # readable by the plain user, on the host and in roots


def workdir(cluster: Cluster) -> Path:
    """A directory the plain user reads (job scripts, and the cluster's inventory copied in)."""
    directory = Path("/tmp") / f"sbatch-wrapper-{cluster.name}"
    directory.mkdir(exist_ok=True)
    directory.chmod(0o755)
    inventory = directory / "inventory.yaml"
    inventory.write_text(cluster.inventory.read_text())
    inventory.chmod(0o644)
    return directory


def wrapper(cluster: Cluster, *args: str) -> subprocess.CompletedProcess:
    """The wrapper (it execs this release's sbatch) as the plain user (root is exempt from the hook)."""
    python = VENV_PYTHON if Path(VENV_PYTHON).exists() or cluster.release.chrooted else cluster.python
    inventory = workdir(cluster) / "inventory.yaml"
    argv = [python, "-m", "slurm_hetero", "sbatch", "--inventory", str(inventory), *args]
    return active().run(argv, USER, timeout=60, cwd=str(REPO))


def fitted_gpumem(devices: int) -> str:
    """`gpumem:SIZE` from `slurm-hetero fit` (inference, tp = devices), rounded up to MiB."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_hetero",
            "fit",
            "--model",
            "llama-3-8b",
            "--tp",
            str(devices),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    return "gpumem:" + format_size(math.ceil(json.loads(out)["total_bytes"] / 2**20))


def submit(cluster: Cluster, *args: str) -> str:
    """Submit through the wrapper; the job id."""
    result = wrapper(cluster, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split()[-1]


def test_script_request_reaches_slurmctld(dev_cluster: Cluster) -> None:
    directory = workdir(dev_cluster)
    typed = directory / "typed.sh"
    typed.write_text(SCRIPT)
    bare = directory / "bare.sh"
    bare.write_text("#!/bin/bash\n#SBATCH -J sbatch-wrapper\n#SBATCH --hold\n#SBATCH --gpus=2\nhostname\n")
    for path in (typed, bare):
        path.chmod(0o755)
    job = submit(dev_cluster, "--model", "llama-3-8b", str(typed))
    try:
        fields = job_fields(job)
        assert tres(fields["TresPerNode"]) == "gres:gpu:a100_80g:2", fields
        assert fields["JobName"] == "sbatch-wrapper"
    finally:
        slurm("scancel", job)
    job = submit(dev_cluster, "--model", "llama-3-8b", str(bare))
    try:
        fields = job_fields(job)
        # the hook saw the wrapper's gpumem, fit's figure for 2 devices, next to the script's --gpus=2
        assert f"{fitted_gpumem(2)},gpu:2 -> " in fields["AdminComment"], fields
        assert "gpumem" not in fields.get("TresPerNode", "") + fields.get("TresPerJob", ""), fields
    finally:
        slurm("scancel", job)
    refused = wrapper(dev_cluster, "--gres=gpumem:1098G", str(bare))
    assert refused.returncode == 1 and "no device has it (largest device:" in refused.stderr
