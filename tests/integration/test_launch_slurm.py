"""`srun slurm-hetero launch` under the real Slurm: ranks and layouts across three node types and
a heterogeneous job, a killed rank ending the step, --dry-run starting nothing, and the uneven
training example against a single process and against the even split."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.conftest import Cluster, active
from tests.integration.test_admin_slurm import INFO as HEALTH_INFO
from tests.integration.test_admin_slurm import NODE as HEALTH_NODE
from tests.integration.test_admin_slurm import health, write_sick_capture

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


def test_uneven_training_matches_one_process(dev_cluster: Cluster, tmp_path: Path) -> None:
    """20 steps of examples/train_uneven.py on three node types, one of them 3x slower (device
    emulation at 200 GFLOP/s, the plan told the same speeds): the losses equal a single-process
    run's, on a layout planned faster than the even split. How much of that it saves in time is
    measured by scripts/bench_launch, on a quiet machine, not here beside the other release."""
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
    assert "holds 'gpt2' of 12 layers; this job's model has 24" in refused.stderr
    # adversarial F14: another job Slurm still lists (here a held one) keeps the directory
    held = run(["sbatch", "-H", "--parsable", "-o", "/dev/null", "--wrap", "true"])
    assert held.returncode == 0, held.stderr
    other = held.stdout.strip().split(";")[0]
    (ckpt / ".slurm-hetero-job").write_text(f"{other}\n")
    try:
        busy = run([*srun, *launch_argv(measured, *plan, "--resume", str(ckpt)), "--", "true"])
        assert busy.returncode != 0 and f"is used by job {other}, which Slurm still lists" in busy.stderr
    finally:
        run(["scancel", other])


def recipe(**lines: str) -> str:
    """docs/user-guide.md's batch script for resuming, with its `NAME=` lines replaced."""
    text = (REPO / "docs" / "user-guide.md").read_text()
    script = text.split("```bash\n#!/bin/bash\n#SBATCH", 1)[1].split("```", 1)[0]
    out = []
    for line in ("#!/bin/bash\n#SBATCH" + script).splitlines():
        name = line.split("=", 1)[0]
        out.append(f"{name}={lines.pop(name)}" if name in lines else line)
    assert not lines, f"the recipe has no lines {sorted(lines)}"
    return "\n".join(out) + "\n"


def fail_node(cluster: Cluster, node: str, job: str) -> None:
    """The node dies as a power loss would end it: SIGKILL to its slurmd, the job's slurmstepd
    and every task process there (the dev cluster runs each node's slurmd on this host, `slurmd -N`;
    the other release's cluster may run a job of the same id on a node of the same name)."""
    slurmd = int(cluster.release.path(f"/run/slurmd-{node}.pid").read_text())
    tasks, stepds = [], set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/root") != str(cluster.release.path("/")):
                continue
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            parent_cmd = Path(f"/proc/{parent}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if {f"SLURMD_NODENAME={node}".encode(), f"SLURM_JOB_ID={job}".encode()} <= set(environ):
            tasks.append(int(pid))
            stepds.update([parent] if parent_cmd.startswith(b"slurmstepd") else [])
    assert tasks and stepds, f"no task of a step runs on {node}"
    for pid in (slurmd, *stepds, *tasks):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def node_state(node: str) -> str:
    return run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"]).stdout.split()[0]


# how a node is lost -> (the job's nodes, the one lost)
LOSSES = {
    "kill": ("a100n1,l40sn1,ascendn1", "l40sn1"),
    "drain": (f"a100n1,l40sn1,{HEALTH_NODE}", HEALTH_NODE),
}


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_a_job_that_loses_a_node_resumes_on_the_types_left(
    dev_cluster: Cluster, tmp_path: Path, loss: str
) -> None:
    """docs/user-guide.md's batch script on three node types loses one after the third checkpoint:
    `kill`: its slurmd, slurmstepd and tasks are killed (a power loss); `drain`: `slurm-hetero
    health` drains it on a device its vendor tool calls Critical. The script ends the step, runs
    the next one without that node, re-plans on the two types left and resumes from the last
    checkpoint; its losses equal a run restarted from that checkpoint on the same two nodes
    (float64). Prints the seconds from the failure to the first step after the resume."""
    if loss == "kill" and dev_cluster.name == "22.05":
        pytest.skip("22.05 keeps the step that lost a node: its srun does not return (stop 30: 10 min)")
    nodes, lost = LOSSES[loss]
    left = ",".join(n for n in nodes.split(",") if n != lost)
    measured = tmp_path / "speeds.yaml"
    measured.write_text("a100_80g: 0.2\nl40s: 0.0666667\nascend910b3: 0.2\n")
    ckpt, out, log = tmp_path / "ckpt", tmp_path / "losses.json", tmp_path / "job.out"
    plan = launch_argv(
        measured, "--model", "gpt2", "--global-batch", "18", "--seq", "16", "--micro-batch", "1"
    )
    train = [dev_cluster.python, str(REPO / "examples" / "train_uneven.py"), "--seq", "16", "--steps", "10"]
    train += ["--device-gflops", "100", "--losses-out", str(out)]
    script = tmp_path / "job.sh"
    script.write_text(recipe(CKPT=str(ckpt), PLAN=f"({' '.join(plan[4:])})", TRAIN=f"({' '.join(train)})"))
    libuv = {} if not dev_cluster.release.chrooted else {"USE_LIBUV": "0"}
    submitted = run(["sbatch", "--parsable", "-w", nodes, "-o", str(log), str(script)], env=libuv)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 240
        while not (ckpt / "latest").exists() or (ckpt / "latest").read_text() < "step-00000002":
            assert time.monotonic() < deadline, log.read_text() if log.exists() else "no output"
            time.sleep(0.2)
        if loss == "kill":
            fail_node(dev_cluster, lost, job)
        else:
            assert health(dev_cluster, write_sick_capture(tmp_path)).returncode == 1
        failed = time.time()
        while not run(["sinfo", "-h", "-n", lost, "-t", "drain,no_respond,down", "-o", "%N"]).stdout.strip():
            assert time.monotonic() < deadline + 120, node_state(lost)
            time.sleep(0.5)
        seen, ended = time.time(), 0.0
        while run(["squeue", "-h", "-j", job]).stdout.strip():
            assert time.monotonic() < deadline + 400, log.read_text()
            if not ended and f"resuming without {lost}" in log.read_text():
                ended = time.time()  # the failed step is over, the next one starts
            time.sleep(0.5)
        output = log.read_text()
        assert out.exists(), output[-4000:]
        resumed = json.loads(out.read_text())
        first = resumed["runs"]["layout"]["step_end_unix"][0]
        times = resumed.get("times") or {}
        marks = [
            ("Slurm lists the node", seen), ("the failed step ended", ended),
            ("rank 0 started", times.get("process_start")), ("imported", times.get("imported")),
            ("process groups made", times.get("initialized")),
            ("checkpoint loaded", resumed["runs"]["layout"].get("loaded_unix")),
            ("first step after resume", first),
        ]  # fmt: skip
        print(f"{loss}: from the failure: " + ", ".join(f"{n} {t - failed:.1f} s" for n, t in marks if t))
        assert f"resuming without {lost}" in output, output
        assert resumed["first_step"] >= 3 and len(resumed["losses"]) == 10 - resumed["first_step"], resumed
        # the reference: the same two nodes restarted from a copy of that checkpoint
        start = f"step-{resumed['first_step'] - 1:08d}"
        reference_dir = tmp_path / "reference-ckpt"
        reference_dir.mkdir()
        (reference_dir / start).symlink_to(ckpt / start)
        (reference_dir / "latest").write_text(start + "\n")
        reference_out = tmp_path / "reference.json"
        srun = ["srun", "-w", left, "-N2", "--ntasks-per-node=1", "--gres=gpu:1", "-K"]
        reference = [*train[:-1], str(reference_out)]
        result = run([*srun, *plan, "--resume", str(reference_dir), "--", *reference], timeout=400, env=libuv)
        assert result.returncode == 0, result.stderr[-3000:]
        expected = json.loads(reference_out.read_text())
        assert expected["first_step"] == resumed["first_step"]
        assert max(abs(a - b) for a, b in zip(resumed["losses"], expected["losses"])) < 1e-12
    finally:
        run(["scancel", job])
        if loss == "drain":
            health(dev_cluster, HEALTH_INFO)  # resumes its own drain
        elif node_state(lost).startswith("down"):
            dev_cluster.run(["slurmd", "-N", lost])
        for _ in range(120):
            if node_state(lost) == "idle":
                break
            time.sleep(0.5)
