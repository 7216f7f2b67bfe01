"""The job_submit hook inside the real slurmctld: rewrites, rejections, het jobs, exemptions,
fail policy, and a fuzz run checked against the same hook run through lupa (`request explain`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from scripts.devcluster.fuzz import Fuzz, Request, record_of, run_fuzz, sbatch_argv, stored_view
from slurm_hetero.core import hostlist
from slurm_hetero.core.errors import RequestError
from slurm_hetero.core.model import Device
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.config import exempt_uids, load_settings
from slurm_hetero.inventory.nodes import gres_order
from slurm_hetero.slurm.sbatchargs import parse_options, values
from slurm_hetero.submit import job_from_options
from slurm_hetero.submit.hook import Hook, Outcome, cluster_hook
from slurm_hetero.submit.sbatch import texts_of
from tests.conftest import REPO
from tests.integration.conftest import Cluster, active, slurm, tres
from tests.unit.test_job_submit_lua import kind_of, type_of

USER = "nobody"
_reload_clock = [time.time()]


def as_user(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """A client command as the plain user (root is exempt from the hook)."""
    return active().run(list(argv), USER, stdin=stdin, timeout=60, cwd="/tmp")


def as_user_wait(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`sbatch --wait ARGV[1:]` as the plain user, without sbatch's slow looks (Cluster.sbatch_wait)."""
    return active().sbatch_wait(list(argv), USER, stdin=stdin, timeout=60, cwd="/tmp")


_KEY = re.compile(r"(?:^|\s)([A-Z][A-Za-z:/]*)=")


def parse_oneliner(line: str) -> dict[str, str]:
    """`scontrol show -o` fields; values may hold spaces (Comment=..., AdminComment=...)."""
    keys = list(_KEY.finditer(line))
    return {
        m.group(1): line[m.end() : (keys[i + 1].start() if i + 1 < len(keys) else len(line))].strip()
        for i, m in enumerate(keys)
    }


def job_fields(job_id: str) -> dict[str, str]:
    return parse_oneliner(slurm("scontrol", "show", "job", "-o", job_id).splitlines()[0])


def node_devices(path: Path) -> dict[str, list[Device]]:
    return {h: gres_order(n.devices) for n in inventory.load(path).nodes for h in hostlist.expand(n.name)}


def reload_hook() -> None:
    """slurmctld re-reads job_submit.lua when its mtime grows (1 s granularity)."""
    _reload_clock[0] = max(_reload_clock[0], time.time()) + 3
    os.utime(active().etc / "job_submit.lua", (_reload_clock[0], _reload_clock[0]))


def render_hook(inventory_path: Path, config: Path, *extra: str) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_hetero",
            "job-submit",
            "render",
            "--inventory",
            str(inventory_path),
            "--out",
            str(active().etc),
            "--config",
            str(config),
            *extra,
        ],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    reload_hook()


def run_batch(*options: str) -> tuple[str, dict[str, str]]:
    """sbatch as a plain user (the hook rewrites the job; a srun-created step would keep the
    client's own gres request), wait for the job, and return its id and printed variables."""
    out = Path(f"/tmp/slurm-hetero-test-{os.getpid()}-{time.monotonic_ns()}.out")
    script = "env | grep -E '^(SLURMD_NODENAME|SLURM_JOB_ID|SLURM_JOB_GPUS|SLURM_SHARDS_ON_NODE|CUDA_)'"
    run = as_user_wait("sbatch", "--parsable", *options, "-o", str(out), "--wrap", script)
    assert run.returncode == 0, run.stderr
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    out.unlink()
    return run.stdout.strip().split(";")[0], env


def test_gpumem_20g_runs_on_a_device_with_at_least_20g(dev_cluster: Cluster) -> None:
    job_id, env = run_batch("--gres=gpumem:20G")
    device = node_devices(dev_cluster.inventory)[env["SLURMD_NODENAME"]][
        int(env["SLURM_JOB_GPUS"].split(",")[0])
    ]
    assert device.memory_mib >= 20 * 1024
    fields = job_fields(job_id)
    assert tres(fields["TresPerNode"]).startswith(("gres:gpu:", "gres:shard:"))
    assert "gpumem" not in fields["TresPerNode"] or "shard" in fields["TresPerNode"]  # shards keep the count
    assert "gpumem:20G" in fields.get("AdminComment", "")
    if "shard" in fields["TresPerNode"]:  # l40s is shared in 4G shards: the TaskProlog set the limits
        shards = int(env["SLURM_SHARDS_ON_NODE"])
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={shards * 4096}M" and shards * 4096 >= 20 * 1024
        assert 0 < int(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) < 100


def test_two_gpus_of_60g_land_on_one_node_of_an_adequate_type(dev_cluster: Cluster) -> None:
    job_id, env = run_batch("--gpus=2", "--gres=gpumem:60G")
    devices = node_devices(dev_cluster.inventory)[env["SLURMD_NODENAME"]]
    chosen = [devices[int(g)] for g in env["SLURM_JOB_GPUS"].split(",")]
    assert len(chosen) == 2 and all(d.memory_mib >= 60 * 1024 for d in chosen)
    assert len({d.type for d in chosen}) == 1
    assert tres(job_fields(job_id).get("TresPerJob", "")) == f"gres:gpu:{chosen[0].type}:2"  # --gpus: per job


@pytest.mark.parametrize(
    ("gres", "message"),
    [
        ("gpumem:2T", "gpumem:2T: largest device is"),
        ("gpumem:abc", "gpumem:abc: not a size"),
        ("gpumem:-5", "gpumem:-5"),
        ("gpumem:9E", "gpumem:9E"),
    ],
)
def test_impossible_and_malformed_requests_are_rejected_with_a_message(
    dev_cluster: Cluster, gres: str, message: str
) -> None:
    run = as_user("sbatch", "-H", f"--gres={gres}", "-o", "/dev/null", "--wrap", "true")
    assert run.returncode != 0
    assert message in run.stderr, run.stderr


# What the client's last line says for each kind of rejection (issue 10 item 4): 24.11 exports
# every ESLURM_* to Lua, 22.05 only a few (ESLURM_INVALID_NODE_COUNT), so there the others end in
# slurm.ERROR's "Unspecified error".
_LAST_LINES = {  # 22.05 exports neither GRES nor FEATURE to Lua: the hook returns their numbers
    "ESLURM_INVALID_GRES": {
        "22.05": "Invalid generic resource (gres) specification",
        "24.11": "Invalid generic resource (gres) specification",
    },
    "ESLURM_INVALID_FEATURE": {
        "22.05": "Invalid feature specification",
        "24.11": "Invalid feature specification",
    },
    "ESLURM_INVALID_NODE_COUNT": {
        "22.05": "Node count specification invalid",
        "24.11": "Node count specification invalid",
    },
}


@pytest.mark.parametrize(
    ("options", "code"),
    [
        (("--gres=gpumem:abc",), "ESLURM_INVALID_GRES"),
        (("--gres=gpumem:2T",), "ESLURM_INVALID_GRES"),
        (("--gres=gpumem:20G", "--constraint=a*2"), "ESLURM_INVALID_FEATURE"),
        (("--gres=gpumem:20G", "--constraint=nosuchfeature"), "ESLURM_INVALID_FEATURE"),
        (("--gres=gpumem:20G", "-N", "40"), "ESLURM_INVALID_NODE_COUNT"),
    ],
    ids=["malformed", "too-large", "constraint-count", "no-such-feature", "node-count"],
)
def test_rejections_end_with_the_most_specific_slurm_error(
    dev_cluster: Cluster, options: tuple[str, ...], code: str
) -> None:
    run = as_user("sbatch", "-H", *options, "-o", "/dev/null", "--wrap", "true")
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.endswith(_LAST_LINES[code][dev_cluster.name]), run.stderr


def test_ntasks_per_node_65535_is_a_count_as_slurmctld_reads_it(dev_cluster: Cluster) -> None:
    """Issue 26 repro 3: the hook read INFINITE16 as unset and rewrote the job, which then pended
    forever on 22.05 (PartitionConfig) and was refused by 24.11 after the rewrite was printed."""
    run = as_user(
        "sbatch", "-H", "--ntasks-per-node=65535", "--gres=gpumem:20G", "-o", "/dev/null", "--wrap", "true"
    )
    assert run.returncode != 0, run.stdout
    assert "the job needs 65535 per node" in run.stderr and "-> gres" not in run.stderr, run.stderr
    unset = as_user(
        "sbatch", "-H", "--ntasks-per-node=1", "--gres=gpumem:20G", "-o", "/dev/null", "--wrap", "true"
    )
    assert unset.returncode == 0, unset.stderr
    slurm("scancel", unset.stdout.split()[-1], check=False)


@pytest.mark.parametrize(
    "options",
    [
        ["--mem=5000000000"],
        ["--mem-per-cpu=5000000000"],
        ["--gpus=1", "--mem-per-gpu=99999999999999G"],
        ["--mem=1000000000000000000000T"],
        ["--mem=-5"],
    ],
    ids=" ".join,
)
def test_an_absurd_memory_figure_is_refused_in_one_line_as_explain_says(
    dev_cluster: Cluster, suite_config: Path, options: list[str]
) -> None:
    """Issue 26: memory at or above NO_VAL MiB was read as unset (and a --mem-per-gpu of more than
    12 digits as none), so the hook rewrote a job no node can hold; a figure past strtoll is
    sbatch's to refuse. Either way one refusal, explain's words."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    texts = {o[2:].split("=")[0].replace("-", "_"): o.split("=", 1)[1] for o in options}
    try:
        predicted = hook.submit(
            job_from_options(**{"gres": "gpumem:20G", **texts}, uid=uid, slurm_release=dev_cluster.name)
        )
        said = predicted.message
        assert not predicted.ok, said
    except RequestError as e:
        said = e.reason
    run = as_user("sbatch", "-H", "--gres=gpumem:20G", *options, "-o", "/dev/null", "--wrap", "true")
    assert run.returncode != 0 and said in run.stderr and " -> " not in run.stderr, (run.stderr, said)


@pytest.mark.parametrize(
    "options",
    [
        ["--cpus-per-task=65537"],
        ["--cpus-per-task=65536"],
        ["--ntasks-per-node=65537"],
        ["--ntasks-per-node=65536"],
        ["--ntasks=65537", "--ntasks-per-node=65537"],
        ["--cpus-per-gpu=65537", "--gpus=1"],
        ["--cpus-per-task=4294967294"],  # 22.05: an int of -2 (adversarial F6)
        ["--mem=8796093022208T"],  # 2^63 MiB: per-CPU memory of 0 once wrapped, and runs
        ["--mem=10GB"],
        ["--mem-per-cpu=2048K"],
    ],
    ids=" ".join,
)
def test_a_count_past_its_job_desc_field_is_decided_as_explain_says(
    dev_cluster: Cluster, suite_config: Path, options: list[str]
) -> None:
    """Issue 26: -c and --ntasks-per-node are 16-bit job_desc fields; a count past them is
    decided by the hook as explain says (sbatch's refusal, or the hook's words)."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    texts = {o[2:].split("=")[0].replace("-", "_"): o.split("=", 1)[1] for o in options}
    try:
        predicted = hook.submit(
            job_from_options(**{"gres": "gpumem:20G", **texts}, uid=uid, slurm_release=dev_cluster.name)
        )
        said, ok = predicted.message, predicted.ok
    except RequestError as e:
        said, ok = e.reason, False
    run = as_user(
        "sbatch", "-H", "--parsable", "--gres=gpumem:20G", *options, "-o", "/dev/null", "--wrap", "true"
    )
    if run.returncode == 0:
        slurm("scancel", run.stdout.strip().split(";")[0])
    assert (run.returncode == 0) == ok and said in run.stderr, (run.stderr, said)


@pytest.mark.parametrize(
    "options",
    [
        ["-O", "-n", "32"],
        ["-O", "-c", "12"],
        ["--mincpus=12"],  # 24.11 pends `gpu:l40s:1 --mincpus=5` itself (Resources, typed too)
        ["-n", "2", "-c", "3", "--mincpus=12"],
        # stop 30: the tasks spread over the two 8-CPU l40s nodes, as Slurm spreads them typed
        ["-C", "l40s", "-n", "9"],
        ["-C", "l40s", "-N", "1-2", "-n", "16"],
        ["-C", "l40s", "--gpus=2", "-n", "16"],
    ],
    ids=" ".join,
)
def test_overcommit_and_mincpus_are_decided_as_slurm_allocates_them(
    dev_cluster: Cluster, suite_config: Path, options: list[str]
) -> None:
    """Issue 26 (adversarial, stops 29 and 30): -O allocates the CPUs of one task a node (the hook
    read -n 32 as 32 CPUs a node and refused), --mincpus holds each node to its count (the hook
    ignored it and the rewritten job pended on BadConstraints), and Slurm spreads -n over more
    nodes where -N leaves room (the hook took the fewest and refused). Each is a job Slurm runs
    typed: the hook rewrites it, as explain says, and it starts."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    texts = texts_of(values(parse_options(options)[0]))  # read as the wrapper reads them
    predicted = hook.submit(
        job_from_options(**{"gres": "gpumem:20G", **texts}, uid=uid, slurm_release=dev_cluster.name)
    )
    assert predicted.ok and predicted.action == "rewrite", predicted.message
    run = as_user("sbatch", "--parsable", "--gres=gpumem:20G", *options, "-o", "/dev/null", "--wrap", "true")
    assert run.returncode == 0 and predicted.message in run.stderr, run.stderr
    job_id = run.stdout.strip().split(";")[0]
    try:
        fields = _wait_started(job_id, 60)
        assert fields["JobState"] != "PENDING", fields.get("Reason")
        for key, name in (("TresPerNode", "tres_per_node"), ("TresPerJob", "tres_per_job")):
            assert tres(fields.get(key, "")) == tres(getattr(predicted.job, name) or ""), key
    finally:
        slurm("scancel", job_id)


def test_an_edited_pending_job_is_rewritten_or_refused_like_a_submission(dev_cluster: Cluster) -> None:
    """Issue 10 item 5: slurm_job_modify applies the rules to `scontrol update ... gres=`. The job
    starts on a whole device (a count: no shards): 22.05 refuses any gres change of a job holding
    shards with the constraint the hook added, even by root (`_update_job: invalid GRES`)."""
    run = as_user(
        "sbatch", "--parsable", "-H", "--gres=gpu:1,gpumem:20G", "-o", "/dev/null", "--wrap", "true"
    )
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip().split(";")[0]
    try:
        if dev_cluster.name == "22.05":  # 22.05 would keep the l40s beside the new type: refused
            held = job_fields(job_id)["TresPerNode"]
            edit = as_user("scontrol", "update", f"jobid={job_id}", "gres=gpumem:70G")
            assert edit.returncode != 0 and job_fields(job_id)["TresPerNode"] == held
            return
        # excnodelist= reqnodelist= (none): Slurm does not show the hook the job's -x or -w, so a move
        # to another type needs them stated in the update
        hidden = as_user("scontrol", "update", f"jobid={job_id}", "gres=gpumem:70G")
        assert hidden.returncode != 0 and "excnodelist=HOSTS" in hidden.stderr, hidden.stderr
        half = as_user("scontrol", "update", f"jobid={job_id}", "gres=gpumem:70G", "excnodelist=")
        assert half.returncode != 0 and "reqnodelist=" in half.stderr, half.stderr  # adversarial r6 N01
        edit = as_user(
            "scontrol", "update", f"jobid={job_id}", "gres=gpumem:70G", "excnodelist=", "reqnodelist="
        )
        assert edit.returncode == 0 and "error" not in edit.stderr, edit.stderr  # told in the log only
        stored = tres(job_fields(job_id)["TresPerNode"])
        match = re.fullmatch(r"gres:gpu:([\w.-]+):1", stored)
        assert match, stored
        memory = {
            d.type: d.memory_mib for devices in node_devices(dev_cluster.inventory).values() for d in devices
        }
        assert memory[match.group(1)] >= 70 * 1024, stored
        refused = as_user("scontrol", "update", f"jobid={job_id}", "gres=gpumem:900G")
        assert refused.returncode != 0
        # 22.05 drops log_user text from slurm_job_modify (SchedMD bug 14539, fixed in 23.02)
        if dev_cluster.name != "22.05":
            assert "gpumem:900G: largest device is" in refused.stderr, refused.stderr
        assert tres(job_fields(job_id)["TresPerNode"]) == stored  # the refused edit changed nothing
    finally:
        slurm("scancel", job_id)


# `excnodelist= reqnodelist=`: slurmctld clears the job's -x and -w, the hook sees ""
NO_X = {"exc_nodes": "", "req_nodes": ""}


def _wait_started(job_id: str, timeout: float = 30) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        fields = job_fields(job_id)
        if fields["JobState"] != "PENDING" or time.monotonic() > deadline:
            return fields
        time.sleep(1)


@pytest.mark.parametrize(
    ("submitted", "update", "change"),
    [
        # excnodelist= (none) states the job's -x, which Slurm does not show the hook: another type
        (
            ["--gpus=2", "--gres=gpumem:20G"],
            ["gres=gpumem:70G", "excnodelist=", "reqnodelist="],
            {"gres": "gpumem:70G", **NO_X},
        ),
        (
            ["-n2", "--gpus-per-task=1", "--gres=gpumem:20G"],
            ["gres=gpumem:70G", "excnodelist=", "reqnodelist="],
            {"gres": "gpumem:70G", **NO_X},
        ),
        (
            ["--gres=gpu:1,gpumem:20G"],
            ["gres=gpumem:70G", "excnodelist=", "reqnodelist="],
            {"gres": "gpumem:70G", **NO_X},
        ),
        (
            ["--gres=gpu:1,gpumem:20G"],
            ["gres=gpumem:60G", "features=[ascend|nvidia]", "excnodelist=", "reqnodelist="],
            {"gres": "gpumem:60G", "constraint": "[ascend|nvidia]", **NO_X},
        ),
        # without it, a move to another type is refused (the job's -x may exclude it)
        (["--gres=gpu:1,gpumem:20G"], ["gres=gpumem:70G"], {"gres": "gpumem:70G"}),
        (["--gres=gpu:1,gpumem:20G"], ["numnodes=2"], {"nodes": "2"}),
        (["-n1", "--gpus-per-task=1", "--gres=gpumem:20G"], ["numtasks=8"], {"ntasks": "8"}),
        # not checked before: the job pended forever where its type is not
        (["--gres=gpu:1,gpumem:20G"], ["partition=ascend"], {"partition": "ascend"}),
        (["--gres=gpu:1,gpumem:20G"], ["partition=nvidia"], {"partition": "nvidia"}),
        (["--gres=gpu:1,gpumem:20G"], ["features=ascend"], {"constraint": "ascend"}),
        (["--gres=gpu:1,gpumem:20G"], ["features=nvidia"], {"constraint": "nvidia"}),
        # issue 10 adversarial pass: node lists (A22-A26, S20)
        (["--gres=gpu:1,gpumem:20G"], ["excnodelist=l40sn1"], {"exclude": "l40sn1"}),
        (
            ["-p", "nvidia", "-x", "a100n1", "--gres=gpu:1,gpumem:20G"],
            ["excnodelist=a100n1,l40sn1"],
            {"exclude": "a100n1,l40sn1"},
        ),
        (["--gres=gpu:1,gpumem:20G"], ["excnodelist=a100n1"], {"exclude": "a100n1"}),
        (["--gres=gpu:1,gpumem:20G"], ["reqnodelist=a100n1"], {"nodelist": "a100n1"}),
        (["--gres=gpu:1,gpumem:20G"], ["reqnodelist=l40sn1"], {"nodelist": "l40sn1"}),
        (
            ["--gres=gpu:1,gpumem:20G"],
            ["excnodelist=l40sn1", "gres=gpumem:20G"],
            {"exclude": "l40sn1", "gres": "gpumem:20G"},
        ),
        (["-x", "l40sn1", "--gres=gpu:a100_80g:1"], ["gres=gpumem:20G"], {"gres": "gpumem:20G"}),
        (["-x", "l40sn1", "--gres=gpu:1,gpumem:20G"], ["gres=gpumem:30G"], {"gres": "gpumem:30G"}),
    ],
    ids=[
        "gpus",
        "per-task",
        "per-node",
        "matching-or",
        "per-node-hidden-x",
        "numnodes",
        "numtasks",
        "partition-without",
        "partition-with",
        "features-without",
        "features-with",
        "x-held-type",
        "x-partition-x",
        "x-other-type",
        "w-other-type",
        "w-held-type",
        "x-with-gpumem",
        "typed-x-gpumem",
        "x-gpumem-again",
    ],
)
def test_an_edited_job_runs_where_its_request_fits_or_the_edit_is_refused(
    dev_cluster: Cluster, suite_config: Path, submitted: list[str], update: list[str], change: dict[str, Any]
) -> None:
    """Issue 10 item 2 (edits): accepted and refused as the hook (through lupa) says; after an accepted
    edit no raw gpumem is left and the job starts on a node whose devices hold the request (22.05
    kept the old type beside the new one: it ran on l40sn1 for 70G, or ended in BadConstraints);
    a refused edit changes nothing; a successful one prints no "error:" line (24.11's scontrol
    prints every log_user line of an update so)."""
    from slurm_hetero.cli.submit import compiled, inventory_nodes

    settings = load_settings(suite_config)
    model = compiled(inventory_nodes(dev_cluster.inventory), settings)
    hook = cluster_hook(model, exempt_uids(settings.exempt_users), settings.fail_policy, dev_cluster.name)
    uid = int(subprocess.run(["id", "-u", USER], capture_output=True, text=True, check=True).stdout)
    run = as_user("sbatch", "--parsable", "-H", *submitted, "-o", "/dev/null", "--wrap", "true")
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip()
    try:
        before = job_fields(job_id)
        record = record_of(before, uid, None)
        options = {k: v for k, v in change.items() if k not in NO_X}
        edit = replace(job_from_options(**options, slurm_release=dev_cluster.name), submit_uid=uid)
        edit = replace(edit, **{k: v for k, v in change.items() if k in NO_X})
        predicted = hook.modify(edit, record)
        result = as_user("scontrol", "update", f"jobid={job_id}", *update)
        if predicted.ok and result.returncode != 0 and "partition" in change and dev_cluster.name == "24.11":
            # 24.11 without accounting storage may refuse a partition update after the hook
            # accepted it: _update_job -> _retrieve_new_assoc finds no association and hands back
            # whatever errno was left (seen: "Resource temporarily unavailable"; other runs accept)
            assert "Resource temporarily unavailable" in result.stderr, result.stderr
            return
        assert (result.returncode == 0) == predicted.ok, (result.stderr, predicted.message)
        if not predicted.ok:
            if dev_cluster.name != "22.05":  # 22.05 drops log_user in job_modify
                assert predicted.message in result.stderr
            assert stored_view(job_fields(job_id)) == stored_view(before)
            return
        assert "error" not in result.stderr, result.stderr
        fields = job_fields(job_id)
        assert "gpumem" not in str(stored_view(fields)), fields
        slurm("scontrol", "release", job_id)
        fields = _wait_started(job_id)
        assert fields["JobState"] in ("RUNNING", "COMPLETING", "COMPLETED"), fields
        gpumem = re.findall(r"gpumem:(\d+)G", " ".join([*submitted, str(change.get("gres", ""))]))
        size = int(gpumem[-1]) if gpumem else 1  # the edit's, else the submitted one
        listed = job_fields(job_id)
        assert fields["NodeList"] not in hostlist.expand(change.get("exclude") or "") and (
            "nodelist" not in change or fields["NodeList"] in hostlist.expand(change["nodelist"])
        ), (fields, listed.get("ExcNodeList"), listed.get("ReqNodeList"))
        memory = {
            h: max(d.memory_mib for d in ds) for h, ds in node_devices(dev_cluster.inventory).items() if ds
        }
        assert memory[fields["NodeList"]] >= size * 1024, fields
    finally:
        slurm("scancel", job_id)


@pytest.mark.parametrize("submitted", [["--gpus-per-node=2", "--gres=gpumem:20G"], ["--gres=gpu:a100_80g:2"]])
def test_a_gpumem_edit_keeps_the_jobs_per_node_device_count(
    dev_cluster: Cluster, submitted: list[str]
) -> None:
    """Adversarial round 6, R01/R05 (22.05 and 24.11): `scontrol update gres=gpumem:30G` of a job holding
    two devices per node left it one (the update replaces TresPerNode whole); the count stays."""
    run = as_user("sbatch", "--parsable", "-H", *submitted, "-o", "/dev/null", "--wrap", "true")
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip()
    try:
        result = as_user("scontrol", "update", f"jobid={job_id}", "gres=gpumem:30G")
        assert result.returncode == 0 and "error" not in result.stderr, result.stderr
        fields = job_fields(job_id)
        assert re.search(r"gpu:[\w.-]+:2(\D|$)", fields.get("TresPerNode", "")), fields.get("TresPerNode")
        assert "gpumem" not in fields.get("TresPerNode", ""), fields.get("TresPerNode")
        slurm("scontrol", "release", job_id)
        started = _wait_started(job_id)
        assert started["JobState"] in ("RUNNING", "COMPLETING", "COMPLETED"), started
    finally:
        slurm("scancel", job_id)


@pytest.mark.parametrize(
    ("submitted", "edit"),
    [
        (["--gres=gpu:1"], "gpumem:30G"),  # untyped stays untyped (22.05: "with and without type ...")
        (["--gres=gpu:l40s:1"], "gpumem:30G"),  # whole devices stay whole (22.05: gpu -> shard refused)
        (["--gres=gpumem:10G"], "gpumem:20G,gpu:2"),  # shards stay shards: refused with the reason
    ],
    ids=["untyped", "typed", "shards"],
)
def test_edits_the_fuzz_found_refused_by_slurmctld_are_decided_as_explain_says(
    dev_cluster: Cluster, suite_config: Path, submitted: list[str], edit: str
) -> None:
    from slurm_hetero.cli.submit import compiled, inventory_nodes

    settings = load_settings(suite_config)
    model = compiled(inventory_nodes(dev_cluster.inventory), settings)
    hook = cluster_hook(model, exempt_uids(settings.exempt_users), settings.fail_policy, dev_cluster.name)
    uid = int(subprocess.run(["id", "-u", USER], capture_output=True, text=True, check=True).stdout)
    run = as_user("sbatch", "--parsable", "-H", *submitted, "-o", "/dev/null", "--wrap", "true")
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip()
    try:
        before = job_fields(job_id)
        record = record_of(before, uid, None)
        change = replace(job_from_options(gres=edit, slurm_release=dev_cluster.name), submit_uid=uid)
        predicted = hook.modify(change, record)
        result = as_user("scontrol", "update", f"jobid={job_id}", f"gres={edit}")
        assert (result.returncode == 0) == predicted.ok, (result.stderr, predicted.message)
        if not predicted.ok and dev_cluster.name != "22.05":  # 22.05 drops log_user in job_modify
            assert predicted.message in result.stderr
        after = stored_view(job_fields(job_id))
        assert after == (
            {n: getattr(predicted.job, n) for n in after} if predicted.ok else stored_view(before)
        )
    finally:
        slurm("scancel", job_id)


@pytest.mark.parametrize(
    "submitted",
    [["--cpus-per-gpu=2"], ["--gres=gpu:1", "--cpus-per-gpu=2", "--mem-per-gpu=1G"]],
    ids=["no-gpu", "gpu"],
)
def test_a_gpumem_edit_of_a_job_with_cpus_or_memory_per_gpu_gets_whole_devices_and_starts(
    dev_cluster: Cluster, suite_config: Path, submitted: list[str]
) -> None:
    """22.05 fuzz (seed 20261127): `sbatch --cpus-per-gpu=2` without a gpu (22.05 accepts it)
    edited as the user to `gres=gpumem:512` was rewritten to shards, and slurmctld refused the
    update (shards beside cpus_per_tres). job_rec carries cpus_per_tres / mem_per_tres on both
    releases: the edit gets whole devices, as the hook (through lupa) says, and the released job starts.
    24.11's sbatch refuses --cpus-per-gpu without a gpu: there only the refusal is checked."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    run = as_user("sbatch", "--parsable", "-H", *submitted, "-o", "/dev/null", "--wrap", "true")
    if dev_cluster.name == "24.11" and "--gres=gpu:1" not in submitted:
        assert run.returncode != 0 and "did not request any GPU" in run.stderr, run.stderr
        return
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip().split(";")[0]
    try:
        before = job_fields(job_id)
        record = record_of(before, uid, None)
        assert record.cpus_per_tres, before  # the twin sees what job_rec shows
        edit = replace(job_from_options(gres="gpumem:512", slurm_release=dev_cluster.name), submit_uid=uid)
        predicted = hook.modify(edit, record)
        assert predicted.ok and kind_of(predicted) != "shard", predicted
        result = as_user("scontrol", "update", f"jobid={job_id}", "gres=gpumem:512")
        assert result.returncode == 0 and "error" not in result.stderr, (result.stderr, predicted.message)
        after = stored_view(job_fields(job_id))
        assert after == {n: getattr(predicted.job, n) for n in after}, (after, predicted.message)
        assert "shard" not in str(after) and "gpumem" not in str(after), after
        slurm("scontrol", "release", job_id)
        fields = _wait_started(job_id)
        assert fields["JobState"] in ("RUNNING", "COMPLETING", "COMPLETED"), fields
    finally:
        slurm("scancel", job_id)


def test_a_gpumem_edit_of_a_het_component_is_refused_as_explain_says(
    dev_cluster: Cluster, suite_config: Path
) -> None:
    """Issue 10 r3 (24.11): `scontrol update jobid=J+0 gres=gpumem:70G` of an (l40s + a100) het
    job was accepted: component 0 became a100_80g:1 beside component 1's a100 (one a100 node) and
    both pended forever. The hook cannot see the other components: such an edit is refused."""
    from slurm_hetero.cli.submit import compiled, inventory_nodes

    settings = load_settings(suite_config)
    model = compiled(inventory_nodes(dev_cluster.inventory), settings)
    hook = cluster_hook(model, exempt_uids(settings.exempt_users), settings.fail_policy, dev_cluster.name)
    uid = int(subprocess.run(["id", "-u", USER], capture_output=True, text=True, check=True).stdout)
    argv = ("--gres=gpu:l40s:1", ":", "--gres=gpu:a100_80g:1")
    run = as_user("sbatch", "--parsable", "-H", "-o", "/dev/null", *argv, "--wrap", "true")
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip().split(";")[0]
    try:
        before = job_fields(f"{job_id}+0")
        record = replace(record_of(before, uid, None), het_job_id=int(job_id))
        change = replace(job_from_options(gres="gpumem:70G", slurm_release=dev_cluster.name), submit_uid=uid)
        predicted = hook.modify(change, record)
        assert not predicted.ok and "heterogeneous job" in predicted.message, predicted.message
        result = as_user("scontrol", "update", f"jobid={job_id}+0", "gres=gpumem:70G")
        assert result.returncode != 0, result.stderr
        if dev_cluster.name != "22.05":  # 22.05 drops log_user in job_modify
            assert predicted.message in result.stderr, result.stderr
        assert stored_view(job_fields(f"{job_id}+0")) == stored_view(before)
    finally:
        slurm("scancel", job_id)


def test_a_constraint_naming_an_unknown_feature_is_refused_by_the_hook(dev_cluster: Cluster) -> None:
    """slurmctld refused it after the hook had accepted it (`-C 'nosuch|xgmi'`, found by the fuzz)."""
    run = as_user(
        "sbatch", "-H", "--gres=gpumem:20G", "-C", "nosuch|l40s", "-o", "/dev/null", "--wrap", "true"
    )
    assert run.returncode != 0 and "--constraint=nosuch|l40s: no node has feature nosuch" in run.stderr


@pytest.mark.parametrize("partition", ["nosuch", "nvidia,nosuch", ",", "nvidia,,ascend"])
def test_an_unknown_partition_is_refused_by_the_hook_as_explain_says(
    dev_cluster: Cluster, suite_config: Path, partition: str
) -> None:
    """`sbatch -p nosuch --gres=gpumem:20G` was decided as if in the default partition, and that
    decision printed before slurmctld's own "Invalid partition name". Now the hook refuses it with
    slurmctld's error, naming the known partitions; an empty name in a list is skipped, as
    slurmctld skips it. A job without gpumem is slurmctld's to refuse, without a word from the hook."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    job = job_from_options(gres="gpumem:20G", partition=partition, uid=uid, slurm_release=dev_cluster.name)
    predicted = hook.submit(job)
    run = as_user(
        "sbatch",
        "-H",
        "--parsable",
        "-p",
        partition,
        "--gres=gpumem:20G",
        "-o",
        "/dev/null",
        "--wrap",
        "true",
    )
    if predicted.ok:
        assert run.returncode == 0 and predicted.message in run.stderr, (run.stderr, predicted.message)
        slurm("scancel", run.stdout.strip().split(";")[0])
    else:
        assert run.returncode != 0 and predicted.code == "ESLURM_INVALID_PARTITION_NAME", run.stderr
        lines = run.stderr.strip().splitlines()
        assert predicted.message in lines[0] and " -> " not in run.stderr, run.stderr
        assert lines[-1].endswith("Invalid partition name specified"), run.stderr
    plain = as_user(
        "sbatch", "-H", "--parsable", "-p", partition, "--gres=gpu:1", "-o", "/dev/null", "--wrap", "true"
    )
    assert (plain.returncode == 0) == predicted.ok and "slurm_hetero" not in plain.stderr, plain.stderr
    assert "known partitions" not in plain.stderr, plain.stderr
    if plain.returncode == 0:
        slurm("scancel", plain.stdout.strip().split(";")[0])


def test_user_text_with_a_newline_is_told_on_one_line_as_explain_says(
    dev_cluster: Cluster, suite_config: Path
) -> None:
    """A constraint with a newline in it: the hook told the user (and `request explain` printed)
    the newline verbatim, so the answer spanned lines. Both escape it (\\010), the same way."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    features = "ib\nslurm_hetero: forged"
    job = job_from_options(gres="gpumem:20G", constraint=features, uid=uid, slurm_release=dev_cluster.name)
    predicted = hook.submit(job)
    assert not predicted.ok and "\\010" in predicted.message and predicted.message.isprintable()
    run = as_user("sbatch", "-H", "--gres=gpumem:20G", "-C", features, "-o", "/dev/null", "--wrap", "true")
    assert run.returncode != 0 and predicted.message in run.stderr, (run.stderr, predicted.message)
    assert "\nslurm_hetero: forged" not in run.stderr


def test_gpus_per_socket_with_gpumem_is_refused_by_the_hook_as_explain_says(
    dev_cluster: Cluster, suite_config: Path
) -> None:
    """U14/Y05: `--gpus-per-socket=3 --sockets-per-node=1 --gres=gpumem:20G` was accepted as
    TresPerSocket a100_80g:3 (22.05: pending forever on BadConstraints; 24.11: the accept line,
    then "Requested node configuration is not available"). The table knows no sockets, so the
    hook refuses it in one line, with explain's words; without gpumem it is slurmctld's job."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    job = job_from_options(
        gres="gpumem:20G", gpus_per_socket="3", sockets_per_node="1", uid=uid, slurm_release=dev_cluster.name
    )
    predicted = hook.submit(job)
    assert not predicted.ok and predicted.code == "ESLURM_INVALID_GRES", predicted
    run = as_user(
        "sbatch",
        "-H",
        "--gpus-per-socket=3",
        "--sockets-per-node=1",
        "--gres=gpumem:20G",
        "-o",
        "/dev/null",
        "--wrap",
        "true",
    )
    assert run.returncode != 0 and predicted.message in run.stderr, (run.stderr, predicted.message)
    assert " -> " not in run.stderr, run.stderr


def test_a_typed_refusal_names_only_the_type_asked_for_as_explain_says(
    dev_cluster: Cluster, suite_config: Path
) -> None:
    """Issue 26 repro 8: `gpu:a100_80g:2,gpumem:1G` on a cluster of one device per node was told
    "a100_80g has at most 1 per node; at most 1 devices per node (h100_sxm)". Here a100_80g has 4
    per node and no type 9: the refusal names a100_80g alone, in explain's words."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    gres = "gpu:a100_80g:9,gpumem:1G"
    predicted = hook.submit(job_from_options(gres=gres, uid=uid, slurm_release=dev_cluster.name))
    assert not predicted.ok and predicted.message == f"{gres}: a100_80g has at most 4 per node", predicted
    run = as_user("sbatch", "-H", f"--gres={gres}", "-o", "/dev/null", "--wrap", "true")
    assert run.returncode != 0 and predicted.message in run.stderr, (run.stderr, predicted.message)
    others = set(model.types) - {"a100_80g"}
    assert not [name for name in others if re.search(rf"\b{name}\b", run.stderr)], run.stderr


def test_srun_without_an_allocation_gets_its_device_through_the_cli_filter(dev_cluster: Cluster) -> None:
    """Issue 10 item 6: cli_filter.lua rewrites the options in srun itself, so the step (not only
    the job) asks for the device and sees CUDA_VISIBLE_DEVICES."""
    script = "env | grep -E '^(SLURMD_NODENAME|CUDA_VISIBLE_DEVICES)='"
    run = as_user("srun", "--gres=gpumem:20G", "sh", "-c", script)
    assert run.returncode == 0, run.stderr
    env = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)
    assert "CUDA_VISIBLE_DEVICES" in env, (run.stdout, run.stderr)
    device = node_devices(dev_cluster.inventory)[env["SLURMD_NODENAME"]][
        int(env["CUDA_VISIBLE_DEVICES"].split(",")[0])
    ]
    assert device.memory_mib >= 20 * 1024, device
    assert "gpumem:20G ->" in run.stderr  # the decision, printed by the filter


@pytest.mark.parametrize(
    "options",
    [["--gpus=2"], ["--gpus-per-node=2"], ["-n2", "--gpus-per-task=1"]],
    ids=lambda o: " ".join(o),
)
def test_srun_with_the_count_in_another_option_runs_its_step(
    dev_cluster: Cluster, options: list[str]
) -> None:
    """Issue 10: `srun --gpus=2 --gres=gpumem:20G` (or --gpus-per-node, --gpus-per-task) allocated
    the job and then failed the step on 22.05 ("Step requested GRES (gpumem:(null)) not found in
    the job"); 24.11 refused --gpus-per-node ("... with and without type identification"). The
    filter now writes the decision into the count's option and a zero-count gpu item into --gres."""
    script = "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
    run = as_user("srun", "--gres=gpumem:20G", *options, "sh", "-c", script)
    assert run.returncode == 0, run.stderr
    # the decision printed by the filter (the gpu item first, as srun sends --gpus-per-node)
    assert "gpumem:20G" in run.stderr and " -> " in run.stderr, run.stderr
    assert "not found in the job" not in run.stderr, run.stderr
    if "-n2" not in options:  # 22.05 exports no CUDA_VISIBLE_DEVICES to a --gpus-per-task step here
        devices = run.stdout.strip().removeprefix("CUDA_VISIBLE_DEVICES=")
        assert len([d for d in devices.split(",") if d.isdigit()]) == 2, (run.stdout, run.stderr)


def _cluster_model(dev_cluster: Cluster, suite_config: Path) -> tuple[Any, Hook, int]:
    """The cluster's model, the hook slurmctld runs (through lupa) and the test user's uid."""
    from slurm_hetero.cli.submit import compiled, inventory_nodes

    settings = load_settings(suite_config)
    model = compiled(inventory_nodes(dev_cluster.inventory), settings)
    hook = cluster_hook(model, exempt_uids(settings.exempt_users), settings.fail_policy, dev_cluster.name)
    uid = int(subprocess.run(["id", "-u", USER], capture_output=True, text=True, check=True).stdout)
    return model, hook, uid


@pytest.mark.parametrize("which", ["nodelist", "exclude", "cpus_per_task", "mem"])
def test_srun_decides_with_its_node_options_as_the_hook_does(
    dev_cluster: Cluster, suite_config: Path, which: str
) -> None:
    """srun's half of the cli_filter ignored -w/-x, -c and --mem: `srun -w NODE --gres=gpumem:20G`
    was rewritten in srun and then accepted by the hook (no gpumem left), and -c/--mem beyond the
    chosen type's nodes gave a job that could not start. Now srun's decision is the hook's on the
    job srun sends: the same refusal and message, or a step on a device of the chosen type."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    plain = hook.submit(job_from_options(gres="gpumem:20G", uid=uid, slurm_release=dev_cluster.name))
    assert plain.ok and type_of(plain) is not None
    shapes = model.types[str(type_of(plain))].shapes
    options: dict[str, Any] = {
        "nodelist": {"nodelist": "l40sn1"},
        # every node of the type chosen without it: the next type, or a refusal
        "exclude": {"exclude": hostlist.fold(h for s in shapes for r in s.hosts for h in hostlist.expand(r))},
        "cpus_per_task": {"cpus_per_task": str(max(s.cpus for s in shapes) + 1)},
        "mem": {"mem": f"{max(s.memory_mib for s in shapes) + 1}M"},
    }[which]
    job = job_from_options(gres="gpumem:20G", uid=uid, slurm_release=dev_cluster.name, **options)
    predicted = hook.submit(job)
    assert (predicted.ok, predicted.message) != (plain.ok, plain.message)  # the option decides
    flag = {"nodelist": "-w", "exclude": "-x", "cpus_per_task": "-c", "mem": "--mem"}[which]
    script = "echo NODE=$SLURMD_NODENAME CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
    run = as_user("srun", "-t", "1", "--gres=gpumem:20G", flag, str(options[which]), "sh", "-c", script)
    if not predicted.ok:
        assert run.returncode != 0 and predicted.message in run.stderr, (run.stderr, predicted.message)
        assert "->" not in run.stderr  # no rewrite printed by srun first
        return
    assert run.returncode == 0 and predicted.message in run.stderr, run.stderr
    fields = dict(part.split("=", 1) for part in run.stdout.split())
    assert fields.get("CUDA_VISIBLE_DEVICES"), run.stdout
    held = {d.type for d in node_devices(dev_cluster.inventory)[fields["NODE"]]}
    assert type_of(predicted) in held, (fields, predicted.message)


def test_srun_on_two_nodes_without_n_gives_each_task_its_device(
    dev_cluster: Cluster, suite_config: Path
) -> None:
    """`srun -N2 --gres=gpumem:20G cmd` (no -n) left gpumem in the step: the filter could not tell
    -N2 from -N2 -n1 and left the job to the hook, which rewrote only the job ("Step requested GRES
    (gpumem:(null)) not found in the job" or no device). Now both tasks, one per node, see one."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    predicted = hook.submit(
        job_from_options(gres="gpumem:20G", nodes="2", uid=uid, slurm_release=dev_cluster.name)
    )
    script = "echo NODE=$SLURMD_NODENAME CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
    run = as_user("srun", "-t", "1", "-N2", "--gres=gpumem:20G", "sh", "-c", script)
    if not predicted.ok:
        assert run.returncode != 0 and predicted.message in run.stderr, (run.stderr, predicted.message)
        return
    assert run.returncode == 0 and predicted.message in run.stderr, run.stderr
    lines = [dict(part.split("=", 1) for part in line.split()) for line in run.stdout.splitlines()]
    assert len(lines) == 2 and len({line["NODE"] for line in lines}) == 2, run.stdout
    assert all(line.get("CUDA_VISIBLE_DEVICES") for line in lines), run.stdout


def test_each_heterogeneous_component_is_rewritten(dev_cluster: Cluster, tmp_path: Path) -> None:
    script = "#!/bin/bash\n#SBATCH --gres=gpumem:70G\n#SBATCH hetjob\n#SBATCH --gres=gpumem:30G\ntrue\n"
    run = as_user("sbatch", "-H", "--parsable", "-o", "/dev/null", stdin=script)
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip().split(";")[0]
    first, second = job_fields(f"{job_id}+0"), job_fields(f"{job_id}+1")
    for fields in (first, second):
        assert tres(fields["TresPerNode"]).startswith(("gres:gpu:", "gres:shard:")), fields["TresPerNode"]
        assert "gpumem" not in fields["TresPerNode"] or "shard" in fields["TresPerNode"]
        assert "slurm_hetero:" in fields["AdminComment"]
    slurm("scancel", job_id)


@pytest.mark.parametrize(
    "components",
    [
        ({"exclude": "a100n1"}, {"gres": "gpumem:70G"}),  # another type with 70G, or refused
        ({"exclude": "a100n1"}, {"gres": "gpumem:70G,gpu:a100_80g:1"}),  # refused: a100n1 excluded
        ({"nodelist": "l40sn1"}, {"gres": "gpumem:20G"}),  # decided around l40sn1, starts
        ({"exclude": "a100n1"}, {"gres": "gpumem:20G"}),  # adversarial F02/G01
        ({"gres": "gpumem:20G"}, {"nodelist": "a100n1", "gres": "gpu:a100_80g:1"}),  # F03/G02
    ],
)
def test_het_components_decide_around_the_jobs_node_lists(
    dev_cluster: Cluster, suite_config: Path, components: tuple[dict[str, str], ...]
) -> None:
    """Adversarial D18/F02/F03/G01/G02/L15: Slurm gives every component of a het job each -x and
    the other components' -w nodes as exc_nodes, and the hook refused gpumem in components with
    no node list of their own. Now -x is decided: each component as explain predicts it on what
    Slurm hands it (`het_sent`), a refusal naming the excluded type, an accepted job starting
    (every component) once released, the gpumem component on none of the excluded nodes."""
    outcomes = _het_predicted(dev_cluster, suite_config, components)
    refused = [o for o in outcomes if not o.ok]
    if refused:
        assert "excludes a100_80g:1" in refused[0].message or "a100_80g has 0 node(s)" in refused[0].message
    _het_submitted(dev_cluster, components, outcomes)


def test_a_het_refusal_names_what_x_excludes_beside_what_components_take(
    dev_cluster: Cluster, suite_config: Path
) -> None:
    """Adversarial A21: a het component refused for too few nodes named only what the earlier
    components take, though -x (which Slurm gives every component) had removed the other types:
    now it names both, as explain predicts, and sbatch prints it."""
    other = {"partition": "nvidia", "gres": "gpumem:70G"}
    components = ({**other, "exclude": "a800n1,h100n1,labn1"}, other)  # a100n1 left, comp 0 takes it
    outcomes = _het_predicted(dev_cluster, suite_config, components)
    assert outcomes[0].ok and not outcomes[1].ok, outcomes
    assert "take a100_80g:1 (type:nodes), and -x/--exclude excludes a800:1, h100:1" in outcomes[1].message
    _het_submitted(dev_cluster, components, outcomes)


@pytest.mark.parametrize(
    "spec",
    [",a100n1,", "a100n1,,l40sn1", "a100n1 l40sn1", ",", "a100n[3-1]", "a100n[1-999999]", "a100n[1,,1]"],
)
def test_exclude_is_read_as_slurm_reads_it(dev_cluster: Cluster, suite_config: Path, spec: str) -> None:
    """Adversarial A16/A14/A18: Slurm skips empty -x items and takes spaces as commas, and the hook
    refused `-x ,a100n1,`; an -x neither can read was refused by the hook as a gres error while
    Slurm answers "Invalid node name specified". Now the gpumem job is decided on the hosts
    Slurm reads (as explain predicts), and where Slurm refuses the -x of a typed job the hook
    refuses the gpumem job with Slurm's error (the client's last line is the same)."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    runs = {}
    for gres in ("gpu:l40s:1", "gpumem:70G"):
        runs[gres] = as_user(
            "sbatch", "-H", "--parsable", "-o", "/dev/null", "-x", spec, f"--gres={gres}", "--wrap", "true"
        )
        if runs[gres].returncode == 0:
            slurm("scancel", runs[gres].stdout.strip().split(";")[0])
    typed, ours = runs["gpu:l40s:1"], runs["gpumem:70G"]
    predicted = hook.submit(
        job_from_options(gres="gpumem:70G", exclude=spec, uid=uid, slurm_release=dev_cluster.name),
    )
    if typed.returncode != 0:  # Slurm cannot read it: neither can the hook, with Slurm's error
        assert not predicted.ok and predicted.code == "ESLURM_INVALID_NODE_NAME", predicted
        assert ours.returncode != 0 and predicted.message in ours.stderr, (ours.stderr, predicted.message)
        assert ours.stderr.strip().splitlines()[-1] == typed.stderr.strip().splitlines()[-1], ours.stderr
        return
    assert predicted.ok or "this hook reads" not in predicted.message, predicted.message
    if predicted.ok:
        assert ours.returncode == 0, ours.stderr
    else:
        assert ours.returncode != 0 and predicted.message in ours.stderr, (ours.stderr, predicted.message)


def _het_predicted(
    dev_cluster: Cluster, suite_config: Path, components: tuple[dict[str, str], ...]
) -> list[Outcome]:
    """The hook's outcome for each component of a het job, as sbatch sends it (`het_sent`), in order
    (the hook decides each on what the earlier ones take)."""
    from scripts.devcluster.fuzz import het_sent, predict

    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    outcomes = []
    for offset, options in enumerate(het_sent(list(components), dev_cluster.name)):
        outcome = predict(model, hook, options, uid, dev_cluster.name, offset)
        assert not isinstance(outcome, str), outcome
        outcomes.append(outcome)
    return outcomes


def _het_submitted(
    dev_cluster: Cluster, components: tuple[dict[str, str], ...], outcomes: list[Outcome]
) -> None:
    """Submit the het job as a plain user: refused with the first refusal's words where explain
    refuses a component, else every component stored as explain says, started once released, on
    none of the nodes its exc_nodes names."""
    from scripts.devcluster.fuzz import het_sent

    run = as_user(*sbatch_argv(Request(list(components))))
    refused = [o for o in outcomes if not o.ok]
    if refused:
        assert run.returncode != 0 and refused[0].message in run.stderr, (run.stderr, refused[0].message)
        return
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip().split(";")[0]
    try:
        for offset, outcome in enumerate(outcomes):
            assert tres(job_fields(f"{job_id}+{offset}").get("TresPerNode", "")) == tres(
                outcome.job.tres_per_node or ""
            )
        slurm("scontrol", "release", job_id)
        for offset, options in enumerate(het_sent(list(components), dev_cluster.name)):
            fields = _wait_started(f"{job_id}+{offset}", timeout=60)
            assert fields["JobState"] in ("RUNNING", "COMPLETING", "COMPLETED"), (offset, fields["JobState"])
            excluded = hostlist.expand(options["exclude"]) if options.get("exclude") else []
            assert fields["NodeList"] not in excluded, (offset, fields["NodeList"], excluded)
    finally:
        slurm("scancel", job_id)


@pytest.mark.parametrize(
    ("components", "refused_at"),
    [
        # two l40s nodes (l40sn1, socketn1): comp 0's -w host was counted as taken AND as comp 1's
        # exc_nodes (Slurm adds it), so this job, which starts (comp 1 on socketn1), was refused
        (({"nodelist": "l40sn1", "gres": "gpu:l40s:1"}, {"gres": "gpumem:20G", "constraint": "l40s"}), None),
        # three components: the -w host once, the rewrite's node by count: the third finds none
        (
            (
                {"nodelist": "l40sn1", "gres": "gpu:l40s:1"},
                {"gres": "gpumem:20G", "constraint": "l40s"},
                {"gres": "gpumem:20G", "constraint": "l40s"},
            ),
            2,
        ),
        # the reverse: a later typed component counted its type's nodes without the job's -x,
        # was accepted and waited forever (socketn1 taken by comp 0, l40sn1 excluded)
        (({"exclude": "l40sn1", "gres": "gpumem:20G", "constraint": "l40s"}, {"gres": "gpu:l40s:1"}), 1),
        # an untyped component only one type can hold (-C h100: h100n1) takes that node: the
        # gpumem component went to h100 beside it (best fit for 70G) and never started
        (({"gres": "gpu:1", "constraint": "h100"}, {"gres": "gpumem:70G"}), None),
        (({"gpus": "1", "constraint": "h100"}, {"gres": "gpumem:70G"}), None),
    ],
)
def test_het_nodes_named_by_node_lists_count_once(
    dev_cluster: Cluster,
    suite_config: Path,
    components: tuple[dict[str, str], ...],
    refused_at: int | None,
) -> None:
    """Issue 10: each node a het job's components take or exclude counts once (double counting),
    and an untyped component that only one type can hold takes that type's nodes, so the hook
    refuses exactly the components Slurm could not place, and what it accepts starts."""
    outcomes = _het_predicted(dev_cluster, suite_config, components)
    assert next((i for i, o in enumerate(outcomes) if not o.ok), None) == refused_at, outcomes
    _het_submitted(dev_cluster, components, outcomes)


@pytest.mark.parametrize(
    ("gres", "form"),
    [
        (("gpumem:70G", "gpumem:70G"), ":"),
        (("gpumem:70G",) * 6, ":"),
        (("gpu:l40s:1", "gpumem:20G"), ":"),
        (("gpu:l40s:1", "gpumem:20G"), "hetjob"),
        # A24: a typed component after the hook's choices took its type's nodes (two l40s nodes
        # here: the first pair runs, the third component of the triple is refused)
        (("gpumem:20G", "gpu:l40s:1"), ":"),
        (("gpumem:20G", "gpumem:20G", "gpu:l40s:1"), ":"),
        (("gpumem:20G", "gpumem:20G", "gpu:l40s:1"), "hetjob"),
    ],
)
def test_heterogeneous_components_the_hook_accepts_start(
    dev_cluster: Cluster, suite_config: Path, gres: tuple[str, ...], form: str
) -> None:
    """The adversarial pass: `--gres=gpumem:70G : --gres=gpumem:70G` put both components on the
    one-node type and they stayed PENDING (Resources) on an idle cluster: components never share
    a node. Each later component now decides on the nodes the earlier ones leave (explain with
    `taken`); what is accepted starts and ends, a refusal says what explain says. Issue 10 r3:
    `--gres=gpu:l40s:1 : --gres=gpumem:20G` (one l40s node) rewrote the second to l40s too: a
    component left alone takes its typed nodes as well, in `:` jobs and `#SBATCH hetjob` scripts."""
    from slurm_hetero.cli.submit import compiled, inventory_nodes

    settings = load_settings(suite_config)
    model = compiled(inventory_nodes(dev_cluster.inventory), settings)
    hook = cluster_hook(model, exempt_uids(settings.exempt_users), settings.fail_policy, dev_cluster.name)
    uid = int(subprocess.run(["id", "-u", USER], capture_output=True, text=True, check=True).stdout)
    outcomes = []
    for offset, item in enumerate(gres):
        outcomes.append(
            hook.submit(job_from_options(gres=item, uid=uid, slurm_release=dev_cluster.name), offset)
        )
    if form == "hetjob":
        lines = "#SBATCH hetjob\n".join(f"#SBATCH --gres={item}\n" for item in gres)
        run = as_user_wait("sbatch", "--parsable", "-o", "/dev/null", stdin=f"#!/bin/bash\n{lines}true\n")
    else:
        argv = [a for i, item in enumerate(gres) for a in ([":"] if i else []) + [f"--gres={item}"]]
        run = as_user_wait("sbatch", "--parsable", "-o", "/dev/null", *argv, "--wrap", "true")
    refused = [o for o in outcomes if not o.ok]
    if refused:
        assert run.returncode != 0 and refused[0].message in run.stderr, (run.stderr, refused[0].message)
        return
    assert run.returncode == 0, run.stderr  # every component started and ended
    job_id = run.stdout.strip().split(";")[0]
    for offset, outcome in enumerate(outcomes):
        fields = job_fields(f"{job_id}+{offset}")
        assert tres(fields["TresPerNode"]) == tres(outcome.job.tres_per_node or ""), offset


def test_gpumem_in_a_step_is_refused_naming_what_the_job_holds_and_its_count_runs(
    dev_cluster: Cluster,
) -> None:
    """Issue 21 item 2: a step's devices are its job's. Steps asking gpumem were decided among them
    (issue 10: as a new job they became another type and failed "Invalid generic resource"); now
    gpumem in a step is refused in one line naming what the job holds and the count to ask, and the
    count it names, or no device option at all, gets the job's device."""
    script = "echo CVD=$CUDA_VISIBLE_DEVICES"
    inner = (
        "srun --gres=gpumem:20G hostname; echo rc=$?; "
        f"srun sh -c '{script}'; echo rc=$?; "
        f"srun --gres=gpu:1 sh -c '{script}'; echo rc=$?"
    )
    # whole devices of the type the hook chooses for 70G (this suite shares l40s: 20G would hold shards)
    run = as_user("salloc", "-t", "2", "--gres=gpumem:70G", "sh", "-c", inner)
    assert re.findall(r"rc=(\d+)", run.stdout) == ["1", "0", "0"], (run.stdout, run.stderr)
    chosen = re.search(r"gpumem:70G -> gres[:/]gpu:([\w.-]+):1 ", run.stderr)
    assert chosen, run.stderr
    assert re.search(
        rf"gpumem:20G: this srun is a step of job \d+, which holds gpu:{chosen[1]}:1 on \S+; gpumem/gpucore "
        r"choose a new job's devices and a step gets its job's: ask --gres=gpu:N \(N up to 1 per node\), or "
        r"leave the device options out for all of them",
        run.stderr,
    ), run.stderr
    assert re.findall(r"CVD=(\S*)", run.stdout) == ["0", "0"], (run.stdout, run.stderr)
    assert "Invalid generic resource" not in run.stderr and "Unable to create step" not in run.stderr, (
        run.stderr
    )


def test_srun_in_a_job_that_does_not_exist_gets_sruns_own_answer(dev_cluster: Cluster) -> None:
    """Adversarial round 6, D07b: `srun --jobid=99999 --gres=gpumem:20G` was refused by the filter ("cannot
    read which devices it holds; ask --gres=gpu:N"), hiding srun's "Invalid job id specified"."""
    run = as_user("srun", "--jobid=99999", "--gres=gpumem:20G", "hostname")
    assert run.returncode != 0 and "Invalid job id specified" in run.stderr, run.stderr
    assert "slurm-hetero" not in run.stderr and "cannot read" not in run.stderr, run.stderr


def test_srun_het_components_are_decided_on_the_nodes_earlier_ones_leave(
    dev_cluster: Cluster, suite_config: Path
) -> None:
    """Issue 10 item 5: `srun --gres=gpumem:20G A : --gres=gpumem:20G B` (no allocation) rewrote
    both components to l40s (components never share a node) and waited forever. Each component is
    now decided as the hook decides het components (explain with `taken`)."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    outcomes = []
    for offset in range(2):
        job = job_from_options(gres="gpumem:20G", uid=uid, slurm_release=dev_cluster.name)
        outcomes.append(hook.submit(job, offset))
    run = as_user("srun", "-t", "1", "--gres=gpumem:20G", "hostname", ":", "--gres=gpumem:20G", "hostname")
    refused = [o for o in outcomes if not o.ok]
    if refused:
        assert run.returncode != 0 and refused[0].message in run.stderr, (run.stderr, refused[0].message)
        return
    assert run.returncode == 0, run.stderr  # both started (before: PENDING until the timeout)
    for outcome in outcomes:
        assert outcome.message in run.stderr, (outcome.message, run.stderr)


def _hosts_of(dev_cluster: Cluster, gpu_type: str) -> list[str]:
    devices = node_devices(dev_cluster.inventory)
    return sorted(host for host, held in devices.items() if any(d.type == gpu_type for d in held))


def test_srun_het_component_left_alone_still_takes_its_nodes(
    dev_cluster: Cluster, suite_config: Path
) -> None:
    """Issue 10 adversarial B33 (24.11): `srun --gres=gpu:l40s:1 A : --gres=gpumem:20G B` rewrote B
    to l40s beside A on the one l40s node, and the job waited on an idle cluster: the filter never
    counted a component without gpumem, unlike the hook for sbatch. A takes every l40s node here."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    l40s = len(_hosts_of(dev_cluster, "l40s"))
    first = job_from_options(gres="gpu:l40s:1", nodes=str(l40s), uid=uid, slurm_release=dev_cluster.name)
    hook.submit(first, 0)
    second = job_from_options(gres="gpumem:20G", uid=uid, slurm_release=dev_cluster.name)
    predicted = hook.submit(second, 1)
    script = "echo NODE=$SLURMD_NODENAME"
    argv = ["srun", "-t", "1", f"-N{l40s}", "--gres=gpu:l40s:1", "sh", "-c", script, ":"]
    run = as_user(*argv, "--gres=gpumem:20G", "sh", "-c", script)
    if not predicted.ok:
        assert run.returncode != 0 and predicted.message in run.stderr, (run.stderr, predicted.message)
        return
    assert run.returncode == 0 and predicted.message in run.stderr, (run.stderr, predicted.message)
    assert type_of(predicted) != "l40s", predicted.message
    nodes = [line.split("=", 1)[1] for line in run.stdout.split()]
    assert len(set(nodes)) == l40s + 1, run.stdout  # components never share a node


@pytest.mark.parametrize("gres", ["gpu:1,gpumem:20G", "gpumem:20G"])
def test_srun_het_typed_component_after_a_decided_one_is_refused_as_the_hook_does(
    dev_cluster: Cluster, suite_config: Path, gres: str
) -> None:
    """Issue 10 adversarial C05 (24.11) / M24 (22.05): `srun --gres=gpumem:20G A : --gres=gpu:l40s:1
    B` (one l40s node) put A on l40s, and B, typed l40s, waited for resources forever on an idle
    cluster; sbatch's hook refuses that shape (het_typed). srun now refuses it with the hook's words,
    before any job exists. Whole devices (`gpu:1,gpumem:20G`; without sharing, every gpumem) reach
    slurmctld typed, so only srun can refuse them; shards keep their gpumem for slurmctld's hook."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    l40s = len(_hosts_of(dev_cluster, "l40s"))
    first = job_from_options(gres=gres, nodes=str(l40s), uid=uid, slurm_release=dev_cluster.name)
    decided = hook.submit(first, 0)
    assert decided.ok and type_of(decided) == "l40s", decided.message
    second = job_from_options(gres="gpu:l40s:1", uid=uid, slurm_release=dev_cluster.name)
    predicted = hook.submit(second, 1)
    assert not predicted.ok and "put it before" in predicted.message, predicted.message
    # srun waits for resources (before): `timeout` ends it, and srun then withdraws its job
    argv = ["timeout", "40", "srun", "-t", "1", f"-N{l40s}", f"--gres={gres}", "hostname", ":"]
    run = as_user(*argv, "--gres=gpu:l40s:1", "hostname")
    assert run.returncode != 0 and predicted.message in run.stderr, (run.stderr, predicted.message)
    assert "Requested node configuration" not in run.stderr and "job_id" not in run.stderr.lower(), run.stderr
    queue = dev_cluster.run(["squeue", "-h", "-u", USER, "-o", "%i %T"], timeout=30)
    assert queue.stdout.strip() == "", queue.stdout  # nothing left waiting


@pytest.mark.parametrize("option", ["-w", "-x"])
def test_srun_het_component_is_decided_around_the_hosts_earlier_ones_name(
    dev_cluster: Cluster, suite_config: Path, option: str
) -> None:
    """Issue 10 adversarial G02 (24.11) / G06 (22.05): `srun -w l40sn1 A : --gres=gpumem:20G B` wrote
    B as l40s, the node A names, and srun failed "Requested node configuration is not available":
    slurmctld gives B A's -w hosts as exc_nodes, but srun's filter sees B's own options only (srun
    resets -w for each component; -x carries over, so `srun -x l40sn1 A : B` already worked). B is
    now decided around them, as sbatch's hook decides (A08)."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    hosts = _hosts_of(dev_cluster, "l40s")
    named = ",".join(hosts)
    key = "nodelist" if option == "-w" else "exclude"
    hook.submit(job_from_options(**{key: named}, uid=uid, slurm_release=dev_cluster.name), 0)
    inherited = {} if option == "-w" else {"exclude": named}  # srun keeps -x for later components
    second = job_from_options(gres="gpumem:20G", uid=uid, slurm_release=dev_cluster.name, **inherited)
    predicted = hook.submit(second, 1)
    assert predicted.ok and type_of(predicted) not in (None, "l40s"), predicted.message
    nodes = f"-N{len(hosts)}" if option == "-w" else "-N1"
    argv = ["srun", "-t", "1", nodes, option, named, "sh", "-c", "echo A=$SLURMD_NODENAME"]
    run = as_user(*argv, ":", "--gres=gpumem:20G", "sh", "-c", "echo B=$SLURMD_NODENAME")
    assert run.returncode == 0 and predicted.message in run.stderr, (run.stderr, predicted.message)
    where = [line.split("=", 1) for line in run.stdout.split()]
    assert {part for part, _ in where} == {"A", "B"}, run.stdout
    assert not {node for part, node in where if part == "B"} & set(hosts), run.stdout  # B not on A's hosts


@pytest.mark.parametrize("form", [["-w"], ["--nodelist"], ["-p", "nvidia", "-w"]])
def test_srun_het_component_is_decided_around_the_hosts_later_ones_name(
    dev_cluster: Cluster, suite_config: Path, form: list[str]
) -> None:
    """Issue 10 adversarial round 6, S06 (22.05 and 24.11): `srun --gres=gpumem:20G A : -w l40sn1 B` wrote
    A as l40s (srun calls the filter for A before it parses B) and failed "Requested node configuration is
    not available": slurmctld keeps A off B's -w hosts. A is now decided around them (read from srun's
    command line), as sbatch's hook decides the same job (B06)."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    hosts = _hosts_of(dev_cluster, "l40s")
    named = ",".join(hosts)
    first = job_from_options(gres="gpumem:20G", exclude=named, uid=uid, slurm_release=dev_cluster.name)
    predicted = hook.submit(first)
    assert predicted.ok and type_of(predicted) not in (None, "l40s"), predicted.message
    argv = ["srun", "-t", "1", "--gres=gpumem:20G", "sh", "-c", "echo A=$SLURMD_NODENAME", ":"]
    run = as_user(*argv, f"-N{len(hosts)}", *form, named, "sh", "-c", "echo B=$SLURMD_NODENAME")
    assert run.returncode == 0 and predicted.message in run.stderr, (run.stderr, predicted.message)
    where = [line.split("=", 1) for line in run.stdout.split()]
    assert {part for part, _ in where} == {"A", "B"}, run.stdout
    assert not {node for part, node in where if part == "A"} & set(hosts), run.stdout  # A not on B's hosts


@pytest.fixture()
def l40s_hostfile(dev_cluster: Cluster) -> Iterator[tuple[str, list[str]]]:
    """A host file naming the l40s hosts (a comment, one a line), readable by the job user (mode
    0644 under /tmp, which the clients see at the same path): its path and the hosts."""
    hosts = _hosts_of(dev_cluster, "l40s")
    fd, path = tempfile.mkstemp(prefix="slurm-hetero-hosts.", dir="/tmp")
    try:
        os.write(fd, ("# the l40s hosts\n" + "".join(f"{h} # l40s\n" for h in hosts)).encode())
        os.close(fd)
        os.chmod(path, 0o644)
        yield path, hosts
    finally:
        os.unlink(path)


@pytest.mark.parametrize("het", [False, True], ids=["own-x", "later-w"])
def test_srun_host_file_is_read_as_srun_reads_it(
    dev_cluster: Cluster, suite_config: Path, l40s_hostfile: tuple[str, list[str]], het: bool
) -> None:
    """Adversarial round 6, L01/P02b (22.05 and 24.11): a -w/-x value with a "/" is a host file srun
    reads itself, sending its hosts to slurmctld's hook; the filter did not read it: `srun
    --gres=gpumem:20G A : -w FILE B` wrote A as l40s, and on 22.05 `srun -x FILE --gres=gpumem:20G`
    was left unrewritten, the hook rewrote the job and the step failed "Step requested GRES
    (gpumem:(null)) not found in the job". The filter now reads the file: A, and the -x job, run
    off those hosts with the device visible, decided as sbatch's hook decides them."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    path, hosts = l40s_hostfile
    job = job_from_options(
        gres="gpumem:20G", exclude=",".join(hosts), uid=uid, slurm_release=dev_cluster.name
    )
    predicted = hook.submit(job)
    assert predicted.ok and type_of(predicted) not in (None, "l40s"), predicted.message
    script = "echo NODE=$SLURMD_NODENAME CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
    if het:
        later = [":", f"-N{len(hosts)}", "-w", path, "true"]
        run = as_user("srun", "-t", "1", "--gres=gpumem:20G", "sh", "-c", script, *later)
    else:
        run = as_user("srun", "-t", "1", "-x", path, "--gres=gpumem:20G", "sh", "-c", script)
    assert run.returncode == 0 and predicted.message in run.stderr, (run.stderr, predicted.message)
    fields = dict(part.split("=", 1) for part in run.stdout.split())
    assert fields.get("CUDA_VISIBLE_DEVICES") and fields["NODE"] not in hosts, run.stdout
    held = {d.type for d in node_devices(dev_cluster.inventory)[fields["NODE"]]}
    assert type_of(predicted) in held, (fields, predicted.message)


def test_srun_het_component_the_hosts_later_ones_name_leave_nothing_is_refused_in_one_line(
    dev_cluster: Cluster, suite_config: Path
) -> None:
    """Adversarial round 6, B06c: `srun --gres=gpumem:70G A : -w <the a100_80g hosts> B` wrote A as
    a100_80g and failed "Requested node configuration is not available"; now it is left to slurmctld's
    hook, which sees B's hosts in A's exc_nodes and refuses it in one line, as for sbatch."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    devices = node_devices(dev_cluster.inventory)
    big = [
        h
        for h, held in devices.items()
        if any(d.vendor == "nvidia" and (d.memory_mib or 0) >= 70 << 10 for d in held)
    ]
    hosts = sorted(big)  # every host of the default vendor with a device of 70G or more
    named = ",".join(hosts)
    first = job_from_options(gres="gpumem:70G", exclude=named, uid=uid, slurm_release=dev_cluster.name)
    predicted = hook.submit(first)
    assert not predicted.ok, predicted.message
    run = as_user("srun", "-t", "1", "--gres=gpumem:70G", "true", ":", f"-N{len(hosts)}", "-w", named, "true")
    assert run.returncode != 0 and predicted.message in run.stderr, (run.stderr, predicted.message)
    assert "Requested node configuration" not in run.stderr, run.stderr


@pytest.mark.parametrize(("group", "offset"), [(None, 0), ("1", 1)])
def test_gpumem_in_a_het_allocations_step_names_its_components_devices(
    dev_cluster: Cluster, group: str | None, offset: int
) -> None:
    """Issue 10 adversarial B26 (24.11): in an (l40s : a100_80g) het allocation, `srun --het-group=0
    --gres=gpumem:70G` was written as a100_80g, which component 0 lacks. A step's refusal names the
    devices of the component srun runs it on (--het-group; without it, component 0)."""
    held = ("l40s", "a100_80g")[offset]
    inner = "srun" + (f" --het-group={group}" if group else "") + " --gres=gpumem:20G hostname"
    run = as_user("salloc", "-t", "2", "--gres=gpu:l40s:1", ":", "--gres=gpu:a100_80g:1", "sh", "-c", inner)
    assert run.returncode != 0, run.stderr
    assert re.search(
        rf"this srun is a step of job \d+\+{offset}, which holds gpu:{held}:1 on \S+;", run.stderr
    )
    assert "Invalid generic resource" not in run.stderr, run.stderr


def test_a_bare_request_stays_on_the_default_vendor_and_its_feature_chooses_another(
    dev_cluster: Cluster,
) -> None:
    """Issue 10 item 4 on the real cluster: one whole device of 20G would best fit a chip of a
    Cambricon MLU370-X8 (22.8G); the default scope (nvidia) keeps it on NVIDIA and says so,
    `-C cambricon` (or the vendor's partition) chooses the MLU."""
    vendor_of = {
        d.type: d.vendor for devices in node_devices(dev_cluster.inventory).values() for d in devices
    }
    for extra, vendor, note in (
        ((), "nvidia", "[vendor nvidia: the default here for a request without a type; for another add -C "),
        (("-C", "cambricon"), "cambricon", None),
        (("-p", "cambricon"), "cambricon", None),
    ):
        run = as_user(
            "sbatch",
            "-H",
            "--parsable",
            "--gres=gpu:1,gpumem:20G",
            *extra,
            "-o",
            "/dev/null",
            "--wrap",
            "true",
        )
        assert run.returncode == 0, run.stderr
        job_id = run.stdout.strip().split(";")[0]
        try:
            item = tres(job_fields(job_id)["TresPerNode"])
            assert vendor_of[item.split(":")[2]] == vendor, (extra, item)
            assert (note in run.stderr) if note else ("[vendor" not in run.stderr), run.stderr
        finally:
            slurm("scancel", job_id)
    refused = as_user("sbatch", "-H", "--gres=gpumem:150G", "-o", "/dev/null", "--wrap", "true")
    assert refused.returncode != 0
    hint = r"largest device is a100_80g with 80G; mi30\w+ of vendor amd would fit: add -C amd"
    assert re.search(hint, refused.stderr), refused.stderr


def test_root_is_exempt(dev_cluster: Cluster) -> None:
    job_id = slurm(
        "sbatch", "-H", "--parsable", "--gres=gpumem:20G", "-o", "/dev/null", "--wrap", "true"
    ).strip()
    assert tres(job_fields(job_id)["TresPerNode"]) == "gres:gpumem:20G"
    slurm("scancel", job_id)


@pytest.fixture
def restore_hook(dev_cluster: Cluster, suite_config: Path) -> Iterator[Path]:
    yield dev_cluster.inventory
    render_hook(dev_cluster.inventory, suite_config)
    assert slurm("scontrol", "ping").count("UP") >= 1


@pytest.mark.parametrize("policy", ["open", "closed"])
def test_a_broken_data_table_follows_the_fail_policy(restore_hook: Path, tmp_path: Path, policy: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"sharing:\n  shard_size: {{l40s: 4G}}\njob_submit:\n  fail_policy: {policy}\n")
    render_hook(restore_hook, config)
    table = active().etc / "slurm_hetero_tables.lua"
    table.write_text(table.read_text().replace("return {", "return {{ broken", 1))
    reload_hook()
    run = as_user("sbatch", "-H", "--parsable", "--gres=gpumem:20G", "-o", "/dev/null", "--wrap", "true")
    if policy == "open":
        assert run.returncode == 0, run.stderr
        assert tres(job_fields(run.stdout.strip())["TresPerNode"]) == "gres:gpumem:20G"
        slurm("scancel", run.stdout.strip())
    else:
        assert run.returncode != 0
    assert "UP" in slurm("scontrol", "ping")
    untouched = as_user("sbatch", "-H", "--parsable", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "true")
    assert untouched.returncode == 0, untouched.stderr  # jobs without gpumem/gpucore are never affected
    slurm("scancel", untouched.stdout.strip())


def test_fuzz_sample_agrees_with_request_explain(dev_cluster: Cluster, suite_config: Path) -> None:
    """Issue 10 acceptance, sampled (scripts/fuzz_submit runs 2,000): random requests over -N, -n,
    --ntasks-per-node, --gpus*, --gres mixes, constraints, partitions, arrays, het jobs and edits;
    every decision, message and stored request as `request explain` says, slurmctld up, released
    jobs start. SLURM_HETERO_FUZZ_JOBS sets the count."""
    model, hook, uid = _cluster_model(dev_cluster, suite_config)
    fuzz = Fuzz(
        lambda argv, user=None: dev_cluster.run(list(argv), user, timeout=120, cwd="/tmp"),
        model,
        hook,
        dev_cluster.name,
        USER,
        uid,
    )
    report = run_fuzz(
        fuzz, int(os.environ.get("SLURM_HETERO_FUZZ_JOBS", "150")), seed=20261122, release_sample=4
    )
    print(f"fuzz {dev_cluster.name}: {report.summary()}", file=sys.stderr)
    assert not report.mismatches, report.mismatches[:10]
    assert (
        report.counts["accepted"] and report.counts["refused by the hook"] and report.counts["started"] == 4
    )


@pytest.mark.parametrize(
    "options",
    [
        {"nodes": "2", "gres": "gpumem:20G"},
        {"nodes": "2", "gres": "gpumem:20G", "gpus": "2"},
        {"nodes": "2", "gres": "gpumem:10G", "gpus_per_node": "1"},
        {"ntasks": "2", "ntasks_per_node": "1", "gres": "gpumem:20G", "gpus_per_task": "1"},
        {"nodes": "9", "gres": "gpumem:20G"},
        # found by the fuzz: sbatch lowers -N3 to the task count; cli_filter + hook on shards;
        # 24.11's gres/gpu=N per-task form; sbatch's own refusal of --gpus-per-task without -n
        {"nodes": "3", "ntasks": "1", "gres": "gpumem:10G", "gpus_per_node": "2"},
        {"gres": "gpumem:10G"},
        {"ntasks": "2", "gres": "gpumem:20G", "gpus_per_task": "1"},
        {"gres": "gpumem:20g", "gpus_per_task": "2"},
        # the adversarial pass (accepted, then never started): node lists, node CPUs and memory,
        # and 24.11's typed -n4 --gpus-per-task=1 without -N (the hook now pins the node count)
        {"gres": "gpumem:20G", "nodelist": "a100n1"},
        {"gres": "gpumem:70G", "exclude": "a100n1"},
        {"gres": "gpumem:20G", "ntasks": "9"},
        {"gres": "gpumem:20G", "nodes": "1", "cpus_per_task": "9"},
        {"gres": "gpumem:70G", "gpus": "2", "cpus_per_gpu": "8"},
        {"gres": "gpumem:70G", "gpus": "2", "mem_per_gpu": "10000"},
        {"gres": "gpumem:20G", "mem": "20000"},
        {"gres": "gpumem:20G", "ntasks": "9", "mem_per_cpu": "2000"},
        {"gres": "gpumem:20G", "ntasks": "4", "gpus_per_task": "1"},
        {"gres": "gpumem:20G", "ntasks": "2", "gpus_per_task": "1", "cpus_per_task": "2"},
    ],
    ids=lambda o: " ".join(f"{k}={v}" for k, v in o.items()),
)
def test_multi_node_requests_run_or_are_rejected_as_explain_says(
    dev_cluster: Cluster, suite_config: Path, options: dict[str, str]
) -> None:
    """Issue 10: a rewritten multi-node job can start (it runs to the end); a rejection says
    exactly what `request explain` says."""
    from slurm_hetero.cli.submit import compiled, inventory_nodes

    settings = load_settings(suite_config)
    model = compiled(inventory_nodes(dev_cluster.inventory), settings)
    hook = cluster_hook(model, exempt_uids(settings.exempt_users), settings.fail_policy, dev_cluster.name)
    uid = int(subprocess.run(["id", "-u", USER], capture_output=True, text=True, check=True).stdout)
    argv = [a for a in sbatch_argv(Request([options])) if a != "-H"]
    run = as_user_wait(*argv)
    try:
        predicted = hook.submit(job_from_options(**options, uid=uid, slurm_release=dev_cluster.name))
    except RequestError as e:  # sbatch's own refusal
        assert run.returncode != 0 and e.reason in run.stderr, (run.stderr, e.reason)
        return
    if not predicted.ok:
        assert run.returncode != 0 and predicted.message in run.stderr, (run.stderr, predicted.message)
        return
    assert run.returncode == 0, (options, run.stderr)  # started, ran, ended
    fields = job_fields(run.stdout.strip().split(";")[0])
    if predicted.job.max_nodes:  # the node count the hook pinned is the one the job ran on
        assert fields.get("NumNodes") == str(predicted.job.max_nodes), fields.get("NumNodes")
    for key, name in (
        ("TresPerJob", "tres_per_job"),
        ("TresPerNode", "tres_per_node"),
        ("TresPerTask", "tres_per_task"),
    ):
        assert tres(fields.get(key, "")) == tres(getattr(predicted.job, name) or ""), key
    assert (
        fields.get("NumNodes", "").split("-")[0] == str(max(int(options.get("nodes", "1")), 1))
        or "ntasks" in options
    )


def test_sbatch_wrapper_sizes_the_request_and_the_hook_picks_the_type(dev_cluster: Cluster) -> None:
    """`slurm-hetero sbatch --model ...` as a plain user: fit -> gpumem -> hook -> gpu type."""
    python = "/opt/slurm-hetero/venv/bin/python"  # built by dev-cluster for job users
    run = as_user(
        "env",
        f"PYTHONPATH={REPO}",
        python,
        "-m",
        "slurm_hetero",
        "sbatch",
        "--model",
        "llama-3-8b",
        "--mode",
        "infer",
        "--seq",
        "4096",
        "--gpus=2",
        "-H",
        "--parsable",
        "-o",
        "/dev/null",
        "--wrap",
        "true",
    )
    assert run.returncode == 0, run.stderr
    assert "slurm-hetero: llama-3-8b needs" in run.stderr and "on 2 device(s)" in run.stderr, run.stderr
    assert re.search(r"-> gres[:/]gpu:", run.stderr), run.stderr
    fields = job_fields(run.stdout.strip())
    gpu_type = tres(fields["TresPerJob"]).split(":")[2]  # --gpus is a job total: it stays in TresPerJob
    memory = {d.type: d.memory_mib for ds in node_devices(dev_cluster.inventory).values() for d in ds}[
        gpu_type
    ]
    amount, unit = re.search(r"gpumem:(\d+)([MG])", fields["AdminComment"]).groups()
    assert memory >= int(amount) * (1024 if unit == "G" else 1)
    slurm("scancel", run.stdout.strip())
