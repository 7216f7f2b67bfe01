"""Issue 12 under the real Slurm: an admin's day on real nodes.

- A node discovered from captured tool output plus the captured host's topology tree
  (`discover --from-file ... --host-root DIR`, atlasn1 in the session inventory: the real npu-smi
  captures of an 8x 910B3 server on the Atlas 800T A2's 4 x 48 cores) starts slurmd with each
  device's `Cores=` bound: slurmd's own GRES view (`slurmd -G`) and slurmctld's node record show
  them, the node is not INVALID, and a job's CPUs come from its device's cores.
- `slurm-hetero health --from-file` run as the cluster's client (the release's own scontrol) drains
  the node when its capture reports one device unhealthy, naming that device, resumes it when the
  capture is healthy again, and never resumes an admin's own drain.
- `slurm-hetero health` on the live path with the vendor tool failing or gone (a dead driver, issue
  26) drains the node naming the tool and what it said, and resumes it once the tool answers.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from slurm_hetero.core import hostlist
from slurm_hetero.inventory import document as inventory
from slurm_hetero.slurm.scontrol import parse_fields
from slurm_hetero.slurm.syntax import cpu_ids
from tests.conftest import FIXTURES, REPO
from tests.integration.conftest import HOST_NODES, Cluster, slurm

NODE = "atlasn1"
VENDOR, CAPTURES, _HOST, _MODEL = HOST_NODES[NODE]
INFO, TOPO = (FIXTURES / VENDOR / c for c in CAPTURES)
SICK_INDEX = 3


def rendered_cores(cluster: Cluster, node: str = NODE) -> dict[str, str]:
    """Device file name -> Cores= as gres.conf on the cluster says for `node` (widened on 24.11)."""
    cores = {}
    for line in (cluster.etc / "gres.conf").read_text().splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if line.startswith("NodeName=") and node in hostlist.expand(fields["NodeName"]) and "Cores" in fields:
            cores[Path(fields["File"]).name] = fields["Cores"]
    return cores


def node_record(name: str = NODE) -> dict[str, str]:
    return parse_fields(slurm("scontrol", "show", "node", "-d", "-o", name).strip())


def assert_node_started(name: str, shape: tuple[str, str, str, str], gres: str) -> None:
    """slurmctld's record of `name`: usable, with the CPUs/Sockets/Cores/Threads and Gres rendered."""
    fields = node_record(name)
    state = fields["State"]
    assert "INVALID" not in state and state.split("+")[0] in {"IDLE", "MIXED", "ALLOCATED"}, fields
    assert (fields["CPUTot"], fields["Sockets"], fields["CoresPerSocket"], fields["ThreadsPerCore"]) == shape
    assert fields["Gres"].startswith(gres), fields["Gres"]


def test_the_captured_hosts_node_starts_with_its_devices_cores_bound(dev_cluster: Cluster) -> None:
    record = inventory.load(dev_cluster.inventory)
    node = next(n for n in record.nodes if n.name == NODE)
    assert (node.cpus, node.sockets, node.cores_per_socket, node.threads_per_core) == (192, 4, 48, 1)
    assert sorted({d.cores for d in node.devices}) == ["0-23", "144-167", "48-71", "96-119"]

    want = rendered_cores(dev_cluster)
    assert len(want) == 8, want
    if dev_cluster.name == "22.05":
        assert want == {f"davinci{d.index}": d.cores for d in node.devices}
    else:  # widened to whole sockets: 24.11 refuses Cores= that split a socket
        assert set(want.values()) == {"0-47", "48-95", "96-143", "144-191"}

    # slurmd's own view of its GRES: every device with the Cores= rendered for it
    result = dev_cluster.run(["slurmd", "-G", "-N", NODE], timeout=30)
    text = result.stdout + result.stderr
    seen = dict(re.findall(r"File=\S+/(davinci\d+) Cores=(\S+) CoreCnt=192\b", text))
    assert seen == want, text

    assert_node_started(NODE, ("192", "4", "48", "1"), "gpu:ascend910b3:8(S:0-3)")


def test_the_captured_smt_hosts_node_starts_with_its_devices_cores_bound(dev_cluster: Cluster) -> None:
    """A DGX A100 (2 x 64 cores x 2 threads): topo -m prints OS CPU ids with the SMT siblings
    (GPU0: 48-63,176-191); gres.conf gets Slurm core indices below 128 (48-63), slurmd accepts them."""
    smt = "dgxn1"
    record = inventory.load(dev_cluster.inventory)
    node = next(n for n in record.nodes if n.name == smt)
    assert (node.cpus, node.sockets, node.cores_per_socket, node.threads_per_core) == (256, 2, 64, 2)
    by_file = {Path(d.file).name: d.cores for d in node.devices}
    assert by_file["nvidia0"] == "48-63" and by_file["nvidia4"] == "112-127", by_file
    assert all(d.cores and max(cpu_ids(d.cores)) < 128 for d in node.devices), by_file

    want = rendered_cores(dev_cluster, smt)
    assert len(want) == 8, want
    if dev_cluster.name == "22.05":
        assert want == by_file
    else:  # widened to whole sockets on 24.11
        assert set(want.values()) == {"0-63", "64-127"}, want

    result = dev_cluster.run(["slurmd", "-G", "-N", smt], timeout=30)
    text = result.stdout + result.stderr
    assert "invalid GRES core specification" not in text, text
    # (slurmd -G prints CoreCnt=256 here on both releases, its count under config_overrides on this
    # 2-CPU box; slurmctld's node record below, sized sockets x cores, is what binds jobs)
    seen = dict(re.findall(r"File=\S+/(nvidia\d+) Cores=(\S+) CoreCnt=\d+", text))
    assert seen == want, text

    assert_node_started(smt, ("256", "2", "64", "2"), "gpu:a100_40g:8(S:0-1)")
    job = slurm("srun", "-w", smt, "--gres=gpu:a100_40g:1", "-t", "1", "printenv", "CUDA_VISIBLE_DEVICES")
    assert job.strip().isdigit(), job


def test_a_jobs_cpus_come_from_its_devices_cores(dev_cluster: Cluster) -> None:
    job = slurm(
        "sbatch", "--parsable", "-w", NODE, "--gres=gpu:ascend910b3:1", "--gres-flags=enforce-binding",
        "-c", "4", "--mem=500", "-o", "/dev/null", "--wrap", "sleep 30",
    ).strip().split(";")[0]  # fmt: skip
    try:
        detail = ""
        for _ in range(100):
            detail = slurm("scontrol", "show", "job", "-d", job)
            if "CPU_IDs=" in detail:
                break
            time.sleep(0.2)
        match = re.search(r"CPU_IDs=(\S+) .*GRES=gpu:ascend910b3:1\(IDX:(\d+)\)", detail)
        assert match, detail
        cpus, index = cpu_ids(match.group(1)), int(match.group(2))
        cores = cpu_ids(rendered_cores(dev_cluster)[f"davinci{index}"])
        # every CPU from the device's cores (24.11 lists 48 CPU_IDs here, the device's whole socket)
        assert set(cpus) <= set(cores), (cpus, index, cores)
        assert len(cpus) == 4 or dev_cluster.name != "22.05", detail
    finally:
        slurm("scancel", job, check=False)


def health(cluster: Cluster, info: Path) -> subprocess.CompletedProcess:
    """`slurm-hetero health` as the cluster's client: the release's Python and scontrol."""
    argv = [cluster.python, "-m", "slurm_hetero", "health", "--inventory", str(cluster.inventory)]
    argv += ["--node", NODE, "--vendor", VENDOR, "--from-file", str(info), "--from-file", str(TOPO)]
    return cluster.run(argv, timeout=120, cwd=str(REPO))


def write_sick_capture(directory: Path) -> Path:
    """The real capture with NPU SICK_INDEX's Health `OK` turned to `Critical` (same column width)."""
    lines = INFO.read_text().splitlines(keepends=True)
    row = next(i for i, ln in enumerate(lines) if re.match(rf"\| {SICK_INDEX}\s+910B3\s+\| OK ", ln))
    lines[row] = lines[row].replace("| OK            |", "| Critical      |", 1)
    path = directory / "npu-smi-info_one-critical.txt"
    path.write_text("".join(lines))
    path.chmod(0o644)
    return path


@pytest.fixture
def sick_capture(tmp_path: Path) -> Path:
    return write_sick_capture(tmp_path)


def wait_drained(drained: bool, timeout: float = 20) -> dict[str, str]:
    """The node's record once DRAIN is (or is no longer) among its state words."""
    deadline = time.monotonic() + timeout
    fields = node_record()
    while time.monotonic() < deadline and ("DRAIN" in fields["State"]) != drained:
        time.sleep(0.2)
        fields = node_record()
    return fields


def test_health_drains_on_an_unhealthy_device_and_resumes_only_its_own_drain(
    dev_cluster: Cluster, sick_capture: Path
) -> None:
    try:
        healthy = health(dev_cluster, INFO)
        assert healthy.returncode == 0, healthy.stderr
        assert "DRAIN" not in node_record()["State"]

        sick = health(dev_cluster, sick_capture)
        assert sick.returncode == 1, sick.stderr
        fields = wait_drained(True)
        assert "DRAIN" in fields["State"], fields
        reason = fields["Reason"]
        assert reason.startswith("slurm-hetero:"), reason
        assert f"ascend {SICK_INDEX} (/dev/davinci{SICK_INDEX}): npu-smi Health:Critical" in reason, reason
        assert "ascend 0 " not in reason, reason  # only the sick device is named

        again = health(dev_cluster, INFO)
        assert again.returncode == 0, again.stderr
        fields = wait_drained(False)
        assert "DRAIN" not in fields["State"], fields
        # 24.11 keeps showing the old reason on the resumed node: still quiet, and a fault drains again
        quiet = health(dev_cluster, INFO)
        assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
        assert health(dev_cluster, sick_capture).returncode == 1
        assert "DRAIN" in wait_drained(True)["State"]
        assert health(dev_cluster, INFO).returncode == 0
        assert "DRAIN" not in wait_drained(False)["State"]

        slurm("scontrol", "update", f"nodename={NODE}", "state=drain", "reason=admin: swapping NPU 3")
        for capture in (INFO, sick_capture):
            result = health(dev_cluster, capture)
            fields = node_record()
            assert "DRAIN" in fields["State"], (capture, fields)
            assert fields["Reason"].startswith("admin: swapping NPU 3"), (capture, fields)
        assert "drained by an admin" in result.stderr, result.stderr
        # adv26b F8: Slurm keeps an admin's leading blank (`Reason= slurm-hetero: ...`); not ours
        slurm("scontrol", "update", f"nodename={NODE}", "state=drain", "reason= slurm-hetero: admin")
        for capture in (INFO, sick_capture):
            result = health(dev_cluster, capture)
            fields = node_record()
            assert "DRAIN" in fields["State"], (capture, fields, result.stderr)
            assert fields["Reason"].startswith(" slurm-hetero: admin"), (capture, fields)
    finally:
        slurm("scontrol", "update", f"nodename={NODE}", "state=resume", check=False)


def live_health(cluster: Cluster, bin_dir: Path, npu_smi: str | None) -> subprocess.CompletedProcess:
    """`slurm-hetero health` with no capture: `npu-smi` is the script `npu_smi` first on PATH (None:
    none there, and none on the node either)."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "npu-smi"
    script.unlink(missing_ok=True)
    if npu_smi is not None:
        script.write_text(f"#!/bin/sh\n{npu_smi}\n")
        script.chmod(0o755)
    bin_dir.chmod(0o755)
    argv = [cluster.python, "-m", "slurm_hetero", "health", "--inventory", str(cluster.inventory)]
    path_first = ["sh", "-c", 'PATH="$0:$PATH" exec "$@"', str(bin_dir)]
    return cluster.run([*path_first, *argv, "--node", NODE], timeout=120, cwd=str(REPO))


def test_health_drains_when_the_vendor_tool_cannot_ask_the_devices(
    dev_cluster: Cluster, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    answers = f'if [ "$2" = -t ]; then exec cat {TOPO}; else exec cat {INFO}; fi'
    try:
        healthy = live_health(dev_cluster, bin_dir, answers)
        assert healthy.returncode == 0 and healthy.stderr == "", healthy.stderr
        dead = live_health(
            dev_cluster, bin_dir, "echo 'dcmi module initialize failed. ret is -8005' >&2; exit 1"
        )
        assert dead.returncode == 1, dead.stderr
        reason = wait_drained(True)["Reason"]
        assert reason.startswith("slurm-hetero: ascend: `npu-smi info` failed (exit code 1): dcmi module"), (
            reason
        )
        assert live_health(dev_cluster, bin_dir, answers).returncode == 0
        assert "DRAIN" not in wait_drained(False)["State"]
        gone = live_health(dev_cluster, bin_dir, None)
        assert gone.returncode == 1, gone.stderr
        reason = wait_drained(True)["Reason"]
        assert reason.startswith("slurm-hetero: ascend: `npu-smi info` failed (not found)"), reason
        assert live_health(dev_cluster, bin_dir, answers).returncode == 0
        assert "DRAIN" not in wait_drained(False)["State"]
        garbled = live_health(dev_cluster, bin_dir, "exec head -c 3000 /dev/urandom")  # adv26: a traceback
        assert garbled.returncode == 1 and "Traceback" not in garbled.stderr, garbled.stderr
        reason = wait_drained(True)["Reason"]
        assert reason.startswith("slurm-hetero: ascend: ") and "npu-smi info" in reason, reason
        assert live_health(dev_cluster, bin_dir, answers).returncode == 0
        assert "DRAIN" not in wait_drained(False)["State"]
    finally:
        slurm("scontrol", "update", f"nodename={NODE}", "state=resume", check=False)
