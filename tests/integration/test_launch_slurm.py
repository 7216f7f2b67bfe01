"""`srun slurm-hetero launch` under the real Slurm: ranks and layouts across three node types and
a heterogeneous job, a killed rank ending the step, --dry-run starting nothing, and the uneven
training example against a single process and against the even split."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.conftest import Cluster, active

INVENTORY = "/etc/slurm/slurm-hetero-inventory.yaml"  # the dev cluster's copy
PRINT_ENV = (
    "import json, os; from slurm_hetero.layout import current; l = current(); "
    "print('ENV ' + json.dumps({k: os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', "
    "'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'SLURM_HETERO_PLAN_ID', 'SLURMD_NODENAME', "
    "'ASCEND_RT_VISIBLE_DEVICES', 'CUDA_VISIBLE_DEVICES')} | {'stage': l.stage, 'type': l.type, "
    "'samples': l.samples, 'world': l.world_size}))"
)


def launch_argv(measured: Path, *extra: str) -> list[str]:
    return [
        active().python,
        "-m",
        "slurm_hetero",
        "launch",
        "--inventory",
        INVENTORY,
        "--measured",
        str(measured),
        "--backend-override",
        "gloo",
        *extra,
    ]


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("measured") / "measured.yaml"
    path.write_text(
        "ascend910b3: 120\ngaudi2: 200\nmlu370_x8: 50\nmi300x: 500\nascend310p: 20\nascend910c: 150\n"
    )
    return path


def run(
    argv: list[str], timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """A client command (srun ...) on the active cluster, from the checkout, with `env` added."""
    return active().run(argv, timeout=timeout, cwd=str(REPO), env={**os.environ, **(env or {})})


def rank_envs(stdout: str) -> list[dict]:
    return [json.loads(line.split("ENV ", 1)[1]) for line in stdout.splitlines() if "ENV {" in line]


def check_consistent(envs: list[dict], world: int) -> None:
    assert sorted(int(e["RANK"]) for e in envs) == list(range(world))
    for key in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_HETERO_PLAN_ID"):
        assert len({e[key] for e in envs}) == 1, key
    assert int(envs[0]["WORLD_SIZE"]) == world and all(e["world"] == world for e in envs)


def test_three_node_types_get_unique_ranks_and_one_layout(dev_cluster: Cluster, measured: Path) -> None:
    srun = ["srun", "-w", "a100n1,l40sn1,ascendn1", "-N3", "--ntasks-per-node=1", "--gres=gpu:1", "-K"]
    result = run(
        srun
        + launch_argv(measured, "--model", "gpt2", "--global-batch", "32")
        + ["--", dev_cluster.python, "-c", PRINT_ENV]
    )
    assert result.returncode == 0, result.stderr
    envs = rank_envs(result.stdout)
    check_consistent(envs, 3)
    assert {e["type"] for e in envs} == {"a100_80g", "l40s", "ascend910b3"}
    ascend = next(e for e in envs if e["type"] == "ascend910b3")
    assert ascend["ASCEND_RT_VISIBLE_DEVICES"] is not None and ascend["CUDA_VISIBLE_DEVICES"] is None


def test_heterogeneous_job_components_form_one_world(dev_cluster: Cluster, measured: Path) -> None:
    cmd = launch_argv(measured, "--model", "gpt2", "--global-batch", "32") + [
        "--",
        dev_cluster.python,
        "-c",
        PRINT_ENV,
    ]
    srun = [
        "srun",
        "-n2",
        "--gres=gpu:a100_80g:2",
        *cmd,
        ":",
        "-n1",
        "--gres=gpu:l40s:1",
        *cmd,
        ":",
        "-n1",
        "-w",
        "ascendn1",  # three nodes of equal Weight have ascend910b3 (ascendn1, atlasn1, sickn1)
        "--gres=gpu:ascend910b3:1",
        *cmd,
    ]
    result = run(srun)
    assert result.returncode == 0, result.stderr
    envs = rank_envs(result.stdout)
    check_consistent(envs, 4)
    by_rank = {int(e["RANK"]): e for e in envs}
    assert [by_rank[r]["SLURMD_NODENAME"] for r in range(4)] == ["a100n1", "a100n1", "l40sn1", "ascendn1"]
    assert {by_rank[0]["CUDA_VISIBLE_DEVICES"], by_rank[1]["CUDA_VISIBLE_DEVICES"]} == {"0", "1"}


def test_a_step_on_one_component_of_a_het_job_runs_there(dev_cluster: Cluster, measured: Path) -> None:
    """A2-H3: `srun --het-group=1 slurm-hetero launch` inside a het allocation (a step on one
    component, which Slurm allows) was refused; it plans and runs the step it is in."""
    cmd = launch_argv(measured, "--model", "gpt2", "--global-batch", "8")
    cmd += ["--", dev_cluster.python, "-c", PRINT_ENV]
    salloc = ["salloc", "-n2", "--gres=gpu:a100_80g:2", ":", "-n1", "--gres=gpu:l40s:1"]
    result = run([*salloc, "srun", "--het-group=1", *cmd])
    assert result.returncode == 0, result.stderr
    envs = rank_envs(result.stdout)
    check_consistent(envs, 1)
    assert envs[0]["SLURMD_NODENAME"] == envs[0]["MASTER_ADDR"] and envs[0]["type"] == "l40s"


def test_killing_one_rank_ends_the_step_promptly_naming_it(dev_cluster: Cluster, measured: Path) -> None:
    script = (
        "import os, time, signal\n"
        "if os.environ['RANK'] == '1':\n    time.sleep(2); os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(300)\n"
    )
    srun = ["srun", "-w", "a100n1,l40sn1,ascendn1", "-N3", "--ntasks-per-node=1", "--gres=gpu:1"]
    started = time.monotonic()
    result = run(
        srun + launch_argv(measured, "--model", "gpt2") + ["--", dev_cluster.python, "-c", script], timeout=90
    )
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert elapsed < 30, elapsed
    first_error = next(line for line in result.stderr.splitlines() if "slurm-hetero:" in line)
    assert "rank 1 on " in first_error and "SIGKILL" in first_error, result.stderr


def test_srun_slurm_hetero_launch_gives_every_rank_its_env(dev_cluster: Cluster, measured: Path) -> None:
    """The console script under srun (the release's own: for 24.11 the root's venv): every rank
    gets the torch.distributed variables, one world across three node types."""
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    show = f"import json, os; print('ENV ' + json.dumps({{k: os.environ.get(k) for k in {keys!r}}}))"
    srun = ["srun", "-w", "a100n1,l40sn1,ascendn1", "-N3", "--ntasks-per-node=1", "--gres=gpu:1", "-K"]
    launch = ["slurm-hetero", *launch_argv(measured, "--model", "gpt2", "--global-batch", "3")[3:]]
    assert launch[:2] == ["slurm-hetero", "launch"]
    result = run(srun + [*launch, "--", dev_cluster.python, "-c", show])
    assert result.returncode == 0, result.stderr
    envs = rank_envs(result.stdout)
    assert sorted(int(e["RANK"]) for e in envs) == [0, 1, 2]
    assert all(e[k] is not None for e in envs for k in keys), envs
    assert {e["WORLD_SIZE"] for e in envs} == {"3"} and {e["LOCAL_WORLD_SIZE"] for e in envs} == {"1"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1


def test_dry_run_prints_every_rank_and_starts_nothing(
    dev_cluster: Cluster, measured: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    srun = ["srun", "-w", "a100n1,l40sn1", "-N2", "--ntasks-per-node=1", "--gres=gpu:1"]
    result = run(srun + launch_argv(measured, "--model", "gpt2", "--dry-run") + ["--", "touch", str(marker)])
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    assert "RANK=0" in result.stdout and "RANK=1" in result.stdout


def test_uneven_training_matches_one_process_and_beats_the_even_split(
    dev_cluster: Cluster, tmp_path: Path
) -> None:
    """20 steps of examples/train_uneven.py on three node types, one of them 3x slower (device
    emulation at 200 GFLOP/s, the plan told the same speeds): the losses equal a single-process
    run's, and the uneven layout saves >= 70% of the step time the plan predicts it saves."""
    measured = tmp_path / "speeds.yaml"
    measured.write_text("a100_80g: 0.2\nl40s: 0.0666667\nascend910b3: 0.2\n")
    out = tmp_path / "losses.json"
    srun = ["srun", "-w", "a100n1,l40sn1,ascendn1", "-N3", "--ntasks-per-node=1", "--gres=gpu:1", "-K"]
    launch = launch_argv(
        measured, "--model", "gpt2", "--global-batch", "18", "--seq", "16", "--micro-batch", "1"
    )
    example = [
        dev_cluster.python,
        str(REPO / "examples" / "train_uneven.py"),
        "--steps",
        "20",
        "--seq",
        "16",
        "--split",
        "both",
        "--device-gflops",
        "200",
        "--slow-type",
        "l40s",
        "--slow-factor",
        "3",
        "--losses-out",
        str(out),
    ]
    # Debian's python3-torch (the 24.11 root's) is built without libuv, which TCPStore asks for by default
    libuv = {} if not dev_cluster.release.chrooted else {"USE_LIBUV": "0"}
    result = run(srun + launch + ["--", *example], timeout=400, env=libuv)
    assert result.returncode == 0, result.stderr[-3000:]
    uneven = json.loads(out.read_text())
    reference_out = tmp_path / "reference.json"
    reference = [
        sys.executable,
        str(REPO / "examples" / "train_uneven.py"),
        "--reference",
        "--steps",
        "20",
        "--layers",
        "12",
        "--global-batch",
        "18",
        "--seq",
        "16",
        "--losses-out",
        str(reference_out),
    ]
    local = subprocess.run(reference, capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert local.returncode == 0, local.stderr[-3000:]
    expected = json.loads(reference_out.read_text())["losses"]
    assert len(uneven["losses"]) == 20
    assert max(abs(a - b) for a, b in zip(uneven["losses"], expected)) < 1e-5
    assert uneven["even_step_s"] > uneven["predicted_step_s"]
    assert uneven["achieved"] >= 0.7, uneven  # measured saving / predicted saving


def test_a_job_resumes_on_fewer_node_types_from_the_last_checkpoint(
    dev_cluster: Cluster, tmp_path: Path
) -> None:
    """`launch --resume DIR` on three node types for 3 steps, then a new job on two of them (as a
    step without the lost node, or a requeue onto another mix): it re-plans, loads the
    checkpoint the first layout wrote, and its losses continue a single process's (float64)."""
    measured = tmp_path / "speeds.yaml"
    measured.write_text("a100_80g: 0.2\nl40s: 0.0666667\nascend910b3: 0.2\n")
    ckpt = tmp_path / "ckpt"
    libuv = {} if not dev_cluster.release.chrooted else {"USE_LIBUV": "0"}
    plan = ["--model", "gpt2", "--global-batch", "18", "--seq", "16", "--micro-batch", "1"]
    example = [dev_cluster.python, str(REPO / "examples" / "train_uneven.py"), "--seq", "16"]
    losses = {}
    for nodes, steps in (("a100n1,l40sn1,ascendn1", 3), ("a100n1,l40sn1", 6)):
        out = tmp_path / f"losses-{steps}.json"
        srun = ["srun", "-w", nodes, f"-N{nodes.count(',') + 1}", "--ntasks-per-node=1", "--gres=gpu:1", "-K"]
        launch = launch_argv(measured, *plan, "--resume", str(ckpt))
        argv = [*srun, *launch, "--", *example, "--steps", str(steps), "--losses-out", str(out)]
        result = run(argv, timeout=400, env=libuv)
        assert result.returncode == 0, result.stderr[-3000:]
        losses[steps] = json.loads(out.read_text())
    assert losses[3]["first_step"] == 0 and losses[6]["first_step"] == 3
    reference = [
        sys.executable, str(REPO / "examples" / "train_uneven.py"), "--reference", "--steps", "6",
        "--layers", "12", "--global-batch", "18", "--seq", "16", "--losses-out", str(tmp_path / "ref.json"),
    ]  # fmt: skip
    local = subprocess.run(reference, capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert local.returncode == 0, local.stderr[-3000:]
    expected = json.loads((tmp_path / "ref.json").read_text())["losses"]
    assert max(abs(a - b) for a, b in zip(losses[3]["losses"] + losses[6]["losses"], expected)) < 1e-9
    refused = run(
        [*srun, *launch_argv(measured, "--model", "opt-350m", *plan[2:], "--resume", str(ckpt)), "--", "true"]
    )
    # each rank refuses in one line (exit 1); srun -K ends the others, which may be stopped first (143)
    assert refused.returncode != 0, refused.stderr
    assert "holds a checkpoint of 'gpt2'; this job trains 'opt-350m'" in refused.stderr
