"""`slurm-hetero sbatch` against the real cluster: a script's #SBATCH lines reach slurmctld as the
user wrote them (a named type kept), and gpumem is added only where no device is named."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_hetero.core.units import format_size
from tests.conftest import REPO
from tests.integration.conftest import Cluster, active, slurm, tres
from tests.integration.test_job_submit_slurm import USER, as_user, job_fields

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


def wrapper(
    cluster: Cluster, *args: str, config: Path | None = None, environ: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """The wrapper (it execs this release's sbatch) as the plain user (root is exempt from the
    hook); `config`: the settings file it reads (SLURM_HETERO_CONFIG); `environ`: more `NAME=VALUE`
    variables (SBATCH_*)."""
    python = VENV_PYTHON if Path(VENV_PYTHON).exists() or cluster.release.chrooted else cluster.python
    inventory = workdir(cluster) / "inventory.yaml"
    argv = [python, "-m", "slurm_hetero", "sbatch", "--inventory", str(inventory), *args]
    if config is not None or environ:
        argv = ["env", *([f"SLURM_HETERO_CONFIG={config}"] if config else []), *environ, *argv]
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
    assert refused.returncode == 1 and refused.stderr.startswith(
        "slurm-hetero: the job: gpumem:1098G,gpu:2: "
    )


@pytest.mark.parametrize(
    "options",
    [
        ["-N2", "--gres=gpumem:70G"],  # W03
        ["-N2", "--gres=gpumem:20G"],  # W31 / W44
        ["--gres=gpumem:70G", "-C", "l40s"],  # W26 / W27
        ["--gres=gpumem:20G", "-n", "5", "--gpus-per-task=1"],  # W30
        ["--gres=gpumem:20G"],
        # item 7, second pass: every option a decision reads (node memory 16000M, 8 CPUs)
        ["--mem=16001", "--gres=gpumem:20G"],
        ["--mem-per-gpu=9000", "--gpus=2", "--gres=gpumem:20G"],
        ["-c", "9", "--gres=gpumem:20G"],
        ["--mem-per-cpu=3000", "-c", "6", "--gres=gpumem:20G"],
        ["--cpus-per-gpu=5", "--gpus=2", "--gres=gpumem:20G"],
        ["-w", "a100n1", "--gres=gpumem:20G"],
        ["SBATCH_MEM_PER_NODE=20000", "--gres=gpumem:20G"],
        ["SBATCH_MEM_PER_NODE=20000", "--mem=100", "--gres=gpumem:20G"],  # the command line wins
        # adversarial pass: sbatch's own refusal (A17/A18/C12), het components typed ones included
        # (W15-W17, A24)
        ["--gpus-per-socket=1", "--gres=gpumem:20G"],
        ["SBATCH_GPUS_PER_SOCKET=1", "--gres=gpumem:20G"],
        ["--gres=gpu:a100_80g:1", ":", "--gres=gpumem:70G"],
        ["--gpus=l40s:1", ":", "--gres=gpumem:20G", ":", "--gres=gpumem:20G"],
        ["--gres=gpumem:20G", ":", "--gres=gpumem:20G", ":", "--gres=gpu:l40s:1"],
        # X22: Slurm gives every component each -x (exc_nodes): comp 1 (both l40s hosts excluded)
        # is refused, not passed
        ["-x", "l40sn1,socketn1", ":", "--gres=gpumem:20G", "-C", "l40s"],
        # issue 26 repro 8: a typed refusal names the type asked for, no other
        ["--gres=gpu:a100_80g:9,gpumem:1G"],
    ],
    ids=" ".join,
)
def test_the_wrapper_refuses_what_the_hook_refuses_in_its_words(
    dev_cluster: Cluster, suite_config: Path, options: list[str]
) -> None:
    """Issue 10 items 7 and 8: the wrapper's check is the hook's decision (the hook's settings
    given to both); a refusal is the hook's message, an acceptance the hook's too. Leading
    `NAME=VALUE` words are variables in both sbatch's and the wrapper's environment."""
    environ = tuple(w for w in options if "=" in w and not w.startswith("-"))
    options = options[len(environ) :]
    config = workdir(dev_cluster) / "config.yaml"
    config.write_text(suite_config.read_text())
    config.chmod(0o644)
    checked = wrapper(dev_cluster, "--dry-run", *options, "--wrap", "true", config=config, environ=environ)
    run = as_user(
        "env", *environ, "sbatch", "-H", "--parsable", "-o", "/dev/null", *options, "--wrap", "true"
    )
    if run.returncode == 0:
        slurm("scancel", run.stdout.strip().split(";")[0])
    assert (checked.returncode == 0) == (run.returncode == 0), (checked.stderr, run.stderr)
    if run.returncode != 0:  # the message after `the job: ` / `het component N: ` (and sbatch's `sbatch: `)
        message = re.sub(
            r"^slurm-hetero: (the job|het component \d+): (sbatch: )?", "", checked.stderr
        ).strip()
        assert message and "\n" not in message and message in run.stderr, (checked.stderr, run.stderr)


def test_a_het_components_type_is_decided_around_every_components_exclusions(
    dev_cluster: Cluster, suite_config: Path
) -> None:
    """X21: `-x HOSTS : --gres=gpumem:20G`: slurmctld stores comp 1 as the wrapper's --json says (the
    hook decides it without the excluded hosts); the wrapper said l40s shards before (comp 1 as if
    without -x), here with both l40s hosts of this cluster excluded."""
    options = ["-x", "l40sn1,socketn1", ":", "--gres=gpumem:20G"]
    config = workdir(dev_cluster) / "config.yaml"
    config.write_text(suite_config.read_text())
    config.chmod(0o644)
    checked = wrapper(dev_cluster, "--json", *options, "--wrap", "true", config=config)
    assert checked.returncode == 0, checked.stderr
    decided = json.loads(checked.stdout)["components"][1]["decision"]["tres_per_node"]
    assert "gpu:" in decided and "l40s" not in decided and "shard" not in decided, decided
    run = as_user("sbatch", "-H", "--parsable", "-o", "/dev/null", *options, "--wrap", "true")
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip().split(";")[0]
    try:
        assert tres(job_fields(f"{job_id}+1").get("TresPerNode", "")) == tres(decided)
    finally:
        slurm("scancel", job_id)
