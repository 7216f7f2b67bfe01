"""Accounting on the dev cluster (slurmdbd + MariaDB, `dev-cluster up --accounting`), both releases."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta

import pytest

from slurm_hetero.inventory import document as inventory
from tests.integration.conftest import Cluster, slurm, slurm_as

USER = "nobody"  # root is exempt from the hook


def wait_done(job_ids: list[str], timeout: float = 60) -> None:
    """Until sacct has every job finished (slurmctld sends job ends to slurmdbd as they happen)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = slurm("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids))
        states = dict(line.split("|", 1) for line in out.splitlines() if line)
        if len(states) == len(job_ids) and all(
            s in ("COMPLETED", "FAILED", "CANCELLED") for s in states.values()
        ):
            return
        time.sleep(0.5)
    raise AssertionError(f"jobs {job_ids} not finished in sacct: {out}")


def test_accounting_records_each_gpu_type_as_its_own_tres(dev_cluster: Cluster) -> None:
    """AccountingStorageTRES from `gres render`: slurmdbd knows every rendered type, and a job's
    AllocTRES names the type it ran on."""
    known = {line.split("|")[1] for line in slurm("sacctmgr", "-n", "-P", "show", "tres").splitlines()}
    assert {"gpu", "gpu:a100_80g", "gpu:l40s", "gpu:ascend910b3", "gpumem", "gpucore"} <= known
    job = slurm("sbatch", "--parsable", "--gres=gpu:l40s:1", "-o", "/dev/null", "--wrap=true").strip()
    wait_done([job])
    alloc = slurm("sacct", "-X", "-n", "-P", "-o", "AllocTRES", "-j", job).strip()
    assert "gres/gpu:l40s=1" in alloc.split(","), alloc


def _when(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S")


def test_report_figures_equal_those_computed_by_hand_from_sacct(dev_cluster: Cluster) -> None:
    """A scripted mix on three types (typed, gpumem rounded up to a larger device, one refused), then
    `report --json` against device-hours, stranded memory and refusals worked out here from `sacct -P`."""
    since = datetime.now().replace(microsecond=0) - timedelta(seconds=1)
    submit = ["sbatch", "--parsable", "-o", "/dev/null", "--wrap=sleep 2"]
    jobs = [
        slurm_as(
            USER, *submit, "--gres=gpumem:50G"
        ).strip(),  # no l40s holds 50G: rounded up to a larger device
        slurm_as(USER, *submit, "--gres=gpu:l40s:1").strip(),
        slurm_as(USER, *submit, "--gres=gpu:ascend910b3:2").strip(),
    ]
    refused = dev_cluster.run([*submit, "--gres=gpumem:2T"], USER, cwd="/tmp")
    assert refused.returncode != 0
    wait_done(jobs)
    until = datetime.now().replace(microsecond=0) + timedelta(seconds=2)
    time.sleep(2)
    window = ["--since", since.isoformat(), "--until", until.isoformat()]
    inv = ["--inventory", str(dev_cluster.inventory)]
    argv = [dev_cluster.python, "-m", "slurm_hetero", "report", *inv, *window, "--json"]
    ran = dev_cluster.run(argv, timeout=120)  # from the checkout (the working directory)
    assert ran.returncode == 0, ran.stderr
    doc = json.loads(ran.stdout)

    # by hand: every allocation sacct lists in the window, clipped to it
    fields = "JobID,AllocTRES,Submit,Start,End,AdminComment"
    lines = slurm("sacct", "-a", "-X", "-P", "-n", "-S", window[1], "-E", window[3], "-o", fields)
    hours: dict[str, float] = {}
    stranded: dict[str, float] = {}
    rewrites: dict[str, int] = {}
    memory = {}
    for node in inventory.load(dev_cluster.inventory).nodes:
        for d in node.devices:
            memory[d.type] = min(memory.get(d.type, 1 << 40), d.memory_mib or 1 << 40)
    for line in lines.splitlines():
        job_id, alloc, submitted, start, end, comment = line.split("|", 5)
        note = comment[comment.rfind("slurm_hetero: ") :] if "slurm_hetero: " in comment else ""
        if " -> " in note and since <= _when(submitted) < until:
            after = note[note.index(" -> ") :]
            policy = after[after.index("(") + 1 :].split(")")[0].split(",")[0]
            rewrites[policy] = rewrites.get(policy, 0) + 1
        if start in ("Unknown", "None") or end in ("Unknown", "None"):
            continue
        inside = (min(_when(end), until) - max(_when(start), since)).total_seconds() / 3600
        for item in alloc.split(","):
            if item.startswith("gres/gpu:"):
                gpu_type, count = item[len("gres/gpu:") :].split("=")
                hours[gpu_type] = hours.get(gpu_type, 0) + int(count) * inside
                if "gpumem:50G ->" in comment:
                    spare = (memory[gpu_type] - 50 * 1024) / 1024
                    stranded[gpu_type] = stranded.get(gpu_type, 0) + spare * int(count) * inside
    assert {"l40s", "ascend910b3"} <= set(hours) and len(hours) >= 3, lines  # three types
    (rounded_up,) = stranded  # the gpumem:50G job, on one device of a larger type
    assert memory[rounded_up] > 50 * 1024 and stranded[rounded_up] > 0, lines
    rows = {r["type"]: r for r in doc["rows"]}
    assert set(rows) == set(doc["capacity"]) and set(hours) <= set(rows)  # idle types too
    for gpu_type in set(rows) - set(hours):
        assert rows[gpu_type]["device_hours"] == 0
    for gpu_type, value in hours.items():
        assert rows[gpu_type]["device_hours"] == pytest.approx(value, abs=1e-5)
        assert rows[gpu_type]["stranded_gib_hours"] == pytest.approx(stranded.get(gpu_type, 0), abs=1e-5)
        devices = doc["capacity"][gpu_type]["devices"]
        window_hours = (until - since).total_seconds() / 3600
        assert rows[gpu_type]["share"] == pytest.approx(value / (devices * window_hours), abs=1e-5)
    assert sum(doc["refusals"].values()) == 1, doc["refusals"]  # the gpumem:2T job
    assert doc["rewrites"] == rewrites and rewrites.get("best-fit", 0) >= 1, lines


def test_metrics_parse_back_and_count_the_devices_slurm_has(dev_cluster: Cluster) -> None:
    """`metrics` on the real cluster: prometheus_client's parser reads it, devices per type are
    Slurm's, and a pending job's gpumem (held, so it stays pending) is counted under its type."""
    from prometheus_client.parser import text_string_to_metric_families

    held = slurm_as(USER, "sbatch", "--parsable", "-H", "-o", "/dev/null", "--gres=gpumem:50G", "--wrap=true")
    held = held.strip()
    try:
        argv = [
            dev_cluster.python,
            "-m",
            "slurm_hetero",
            "metrics",
            "--inventory",
            str(dev_cluster.inventory),
        ]
        ran = dev_cluster.run(argv, timeout=120)
        assert ran.returncode == 0, ran.stderr
    finally:
        slurm("scancel", held)
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(ran.stdout)
        for s in family.samples
    }
    total: dict[str, int] = {}
    for line in slurm("scontrol", "show", "node", "-o").splitlines():
        gres = next((f[5:] for f in line.split() if f.startswith("Gres=")), "")
        for item in gres.split(","):
            parts = item.split("(")[0].split(":")
            if parts[0] == "gpu" and len(parts) == 3:
                total[parts[1]] = total.get(parts[1], 0) + int(parts[2])
    exported = {dict(labels)["type"]: v for (name, labels), v in got.items() if name == "slurm_hetero_gpus"}
    assert {t: v for t, v in exported.items() if v} == total
    pending = [v for (name, labels), v in got.items() if name == "slurm_hetero_jobs_pending_gpumem_bytes"]
    assert 50 * (1 << 30) in pending, got


def test_a_running_jobs_rewrite_counts_though_sacct_lacks_its_comment(
    dev_cluster: Cluster,
) -> None:
    """slurmdbd stores AdminComment at job end: sacct prints none for a running job, so the report
    reads the hook's record of queued and running jobs from squeue (adv25 F3). (A held job is not
    eligible, so sacct lists no held job inside a window at all.)"""
    since = datetime.now().replace(microsecond=0) - timedelta(seconds=1)
    job = slurm_as(USER, "sbatch", "--parsable", "-o", "/dev/null", "--gres=gpumem:20G", "--wrap=sleep 60")
    job = job.strip()
    try:
        deadline = time.monotonic() + 30
        while slurm("squeue", "-h", "-j", job, "-o", "%T").strip() != "RUNNING":
            assert time.monotonic() < deadline, "job did not start"
            time.sleep(0.5)
        # slurmdbd learns of the start a moment later (over 2 s on a loaded machine): wait for it
        while slurm("sacct", "-X", "-n", "-P", "-o", "State", "-j", job).strip() != "RUNNING":
            assert time.monotonic() < deadline + 30, "slurmdbd did not record the start"
            time.sleep(0.5)
        time.sleep(1)
        until = datetime.now().replace(microsecond=0)
        assert slurm("sacct", "-X", "-n", "-P", "-o", "AdminComment", "-j", job).strip() == ""
        window = ["--since", since.isoformat(), "--until", until.isoformat()]
        argv = [dev_cluster.python, "-m", "slurm_hetero", "report", "--inventory", str(dev_cluster.inventory)]
        ran = dev_cluster.run([*argv, *window, "--json"], timeout=120)
    finally:
        slurm("scancel", job)
    assert ran.returncode == 0, ran.stderr
    doc = json.loads(ran.stdout)
    # the rewrite comes from squeue; stranded memory also needs AllocTRES, which slurmdbd had not
    # yet for a job 2 s into its run (gpu_jobs 0), so test_report.py checks that part offline
    assert sum(doc["rewrites"].values()) == 1, ran.stdout
