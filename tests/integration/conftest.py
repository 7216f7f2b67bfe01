"""One real Slurm dev cluster per Slurm release per test session (marker `slurm`).

Every test here runs on each release in SLURM_HETERO_RELEASES (comma-separated; default
`22.05,24.11`): the `dev_cluster` fixture is session-scoped and parametrized by release, so pytest
groups the tests by release and brings one release's cluster down before the next one starts.
Tests reach the cluster only through `slurm()` / `slurm_as()` / `Cluster.run()`, which run the
command with the release's own tools (for 24.11 inside its Debian 13 root), exactly as
`scripts/dev-cluster run` does.

The cluster runs the bundled example inventory plus a second inventory generated here the way an
admin would: `slurm-hetero discover --from-file` on real captures of several vendors' tools,
then `inventory merge`. Needs root; dev-cluster installs Debian's Slurm packages (22.05) and
builds the Debian 13 root (24.11) on first use.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scripts.devcluster import client, release
from tests.conftest import FIXTURES, REPO
from tests.hosttree import ATLAS, DGX, sysfs_tree

DEV_CLUSTER = REPO / "scripts" / "dev-cluster"
EXAMPLE = REPO / "gres_conf" / "examples" / "mixed.yaml"
SITE_NAMES = REPO / "gres_conf" / "examples" / "site-names.yaml"  # Type= names that are not catalog types

# node name -> (vendor, captures under tests/fixtures/<vendor>/) for the generated inventory. The
# captures carry no host facts, so discover gets them as an admin passes them (CAPTURED_HOST):
# without them slurm.conf has no CPUs=/RealMemory= and Slurm assumes 1 of each (gres render's note)
# while the hook's model reads "unknown, holds anything": the 24.11 fuzz (seeds 20261126, 7) had a
# `-c 64` gaudi2 job the hook accepted and slurmctld could not place, and a released ascend910c job
# pending on BadConstraints.
CAPTURED_HOST = ("--cpus", "64", "--sockets", "2", "--cores-per-socket", "32", "--threads-per-core", "1")
CAPTURED_HOST += ("--real-memory", "256G")  # every fact given: discover asks no slurmctld (one may be up)
CAPTURED_NODES = {
    "gaudin1": ("gaudi", ["hl-smi_8x-gaudi2-hl225_hl-1.16.0_denvr.txt"]),
    "mlun1": ("cambricon", ["cnmon_2x-mlu370-x8_v5.10.13_paddle-docs.txt"]),
    "mi300n1": (
        "amd",
        [
            "rocm-smi-concise_8gpu-mi300-series_partitions.txt",
            "rocm-smi-u-showmeminfo-vram_8gpu-mi300-series.txt",
            "rocm-smi-showtopo_8gpu-mi300-series_xgmi_2numa.txt",
        ],
    ),
    "npu910n1": ("ascend", ["npu-smi-info_ascend910-2chips-per-npu_phy-id_drv25.2.0.txt"]),
}
# node -> (vendor, captures, host) discovered with `--host-root`: the host's topology tree (built from
# tests/fixtures/host/<host>.*, see tests/hosttree.py) gives CPUs/Sockets/Cores and Cores= indices.
# atlasn1: the real npu-smi captures of an 8x 910B3 server on the Atlas 800T A2's topology (4 x 48
# cores, 192 CPUs, ~1.5 TiB: slurmd takes them from slurm.conf, SlurmdParameters=config_overrides).
# dgxn1: an SMT host, the real `nvidia-smi topo -m` of a DGX A100 (affinity in OS CPU ids such as
# 48-63,176-191) on the DGX A100's topology (2 x 64 cores x 2 threads, 256 CPUs); no device listing
# of that node was published, so the admin names the model (`discover --model`).
HOST_NODES: dict[str, tuple[str, list[str], str, str | None]] = {
    "atlasn1": (
        "ascend",
        ["npu-smi-info_8x-910b3_drv24.1.rc1.txt", "npu-smi-info-t-topo_8x-910b3_hccs_cpu-affinity.txt"],
        ATLAS,
        None,
    ),
    "dgxn1": ("nvidia", ["topo-m_dgx-a100_8gpu-nv12_12x-mlx5_tabs.txt"], DGX, "NVIDIA A100-SXM4-40GB"),
}
# (The published 310P3 and 310B4 npu-smi excerpts end before the process table npu-smi always
# prints, so discover refuses them as cut captures; sickn1 below stands in for the alarmed 310B4.)


# A node whose device affinity splits a socket: Slurm 24.11 refuses such Cores= (node INVALID)
# unless `gres render` widens them to whole sockets, as it does after 22.05.
SPLIT_SOCKET_NODE = """version: 1
nodes:
  - name: socketn1
    cpus: 8
    sockets: 2
    cores_per_socket: 4
    threads_per_core: 1
    real_memory_mib: 16000
    devices:
      - {vendor: nvidia, model: NVIDIA L40S, type: l40s, index: 0, file: /dev/nvidia0,
         memory_mib: 46068, cores: 0-1}
  # two vendors on one node, whose Flags= differ: slurmd takes one per node (adv47 C1: it refused
  # the node's gres.conf when each line carried its vendor's); vendors no other node has and no
  # request without a type gets, so the tests that pick a type are not moved
  - name: mixn1
    cpus: 8
    sockets: 2
    cores_per_socket: 4
    threads_per_core: 1
    real_memory_mib: 16000
    devices:
      - {vendor: iluvatar, model: Iluvatar CoreX BI-V100, type: bi_v100, index: 0, file: /dev/iluvatar0,
         memory_mib: 32768, cores: 0-3}
      - {vendor: intel, model: Intel Data Center GPU Max 1550, type: max1550, index: 0,
         file: /dev/dri/renderD128, memory_mib: 131072, cores: 4-7}
      - {vendor: intel, model: Intel Data Center GPU Max 1550, type: max1550, index: 1,
         file: /dev/dri/renderD129, memory_mib: 131072, cores: 4-7}
  # one device the vendor tool reported unhealthy: left out of gres.conf, the node stays usable
  - name: sickn1
    cpus: 8
    real_memory_mib: 16000
    devices:
      - {vendor: ascend, model: Ascend910B3, type: ascend910b3, index: 0, file: /dev/davinci0,
         memory_mib: 65536}
      - {vendor: ascend, model: Ascend910B3, type: ascend910b3, index: 1, file: /dev/davinci1,
         memory_mib: 65536, health: unhealthy, health_reason: "Alarm (test node)"}
"""


def cli(*args: str, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slurm_hetero", *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        **kw,
    )  # type: ignore[call-overload]


def generate_inventory(directory: Path) -> Path:
    """Discover each captured node from real tool output, then merge with the bundled example."""
    lines = []
    for node, (vendor, captures) in CAPTURED_NODES.items():
        files = [str(FIXTURES / vendor / c) for c in captures]
        if not all(Path(f).exists() for f in files):
            continue
        args = ["discover", "--vendor", vendor, "--node", node, *CAPTURED_HOST, "--json"]
        lines.append(cli(*args, *[a for f in files for a in ("--from-file", f)]).stdout.strip())
    for node, (vendor, captures, host, model) in HOST_NODES.items():
        root = sysfs_tree(directory / f"host-{node}", host)
        args = ["discover", "--vendor", vendor, "--node", node, "--host-root", str(root), "--json"]
        args += ["--model", model] if model else []
        files = [str(FIXTURES / vendor / c) for c in captures]
        lines.append(cli(*args, *[a for f in files for a in ("--from-file", f)]).stdout.strip())
    (directory / "captured.jsonl").write_text("\n".join(lines) + "\n")
    (directory / "split-socket.yaml").write_text(SPLIT_SOCKET_NODE)
    combined = directory / "cluster.yaml"
    parts = [
        str(EXAMPLE),
        str(SITE_NAMES),
        str(directory / "captured.jsonl"),
        str(directory / "split-socket.yaml"),
    ]
    cli("inventory", "merge", *parts, "-o", str(combined))
    return combined


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the dev cluster needs root")


def selected_releases() -> list[str]:
    """SLURM_HETERO_RELEASES (e.g. `24.11`), default every release the dev cluster knows."""
    wanted = os.environ.get("SLURM_HETERO_RELEASES") or ",".join(release.RELEASES)
    names = [n.strip() for n in wanted.split(",") if n.strip()]
    unknown = sorted(set(names) - set(release.RELEASES))
    if unknown:
        raise pytest.UsageError(f"SLURM_HETERO_RELEASES: unknown {unknown}; known {list(release.RELEASES)}")
    return names


# A job's states once it has ended (Slurm's IS_JOB_FINISHED; COMPLETING is shown until its
# steps are cleaned up, and counts as not yet ended here)
FINISHED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}
FINISHED |= {"DEADLINE", "OUT_OF_MEMORY"}


@dataclass(frozen=True)
class Cluster:
    """A running dev cluster of one Slurm release, as the tests see it."""

    release: release.Release
    inventory: Path  # the inventory it was started from
    python: str  # the Python that jobs run (with slurm-hetero and torch) on this release's nodes

    @property
    def name(self) -> str:
        return self.release.name

    @property
    def etc(self) -> Path:
        """The host path of the cluster's /etc/slurm."""
        return self.release.path("/etc/slurm")

    def run(
        self, argv: list[str], user: str | None = None, *, timeout: float = 60, **kw: object
    ) -> subprocess.CompletedProcess:
        """A client command with this release's tools, as `user` (default: this process's)."""
        return client.run(self.release, list(argv), user, timeout=timeout, **kw)  # type: ignore[arg-type]

    def sbatch_wait(
        self, argv: list[str], user: str | None = None, *, timeout: float = 60, **kw: object
    ) -> subprocess.CompletedProcess:
        """`sbatch --wait ARGV[1:]` as `user`, looking at the job every 0.2 s: sbatch's own --wait
        first looks 2 s after submitting, then 8 s and 32 s later (MinJobAge=60), so a job done
        in 3 s held its test for 10 s. The same answer: sbatch's refusal as it prints it, else
        the job's id (--parsable) and sbatch --wait's exit code, the highest of the job's
        components (1 for one ended by a signal), once every component has ended."""
        assert argv[0] == "sbatch" and "--wait" not in argv, argv
        deadline = time.monotonic() + timeout
        submitted = self.run(["sbatch", "--parsable", *argv[1:]], user, timeout=timeout, **kw)
        if submitted.returncode != 0:
            return submitted
        job_id = submitted.stdout.strip().split(";")[0]
        while True:
            shown = self.run(["scontrol", "show", "job", "-o", job_id], timeout=30).stdout
            states = re.findall(r"(?:^|\s)JobState=(\S+)", shown)
            if states and all(state in FINISHED for state in states):
                break
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(argv, timeout, submitted.stdout, submitted.stderr)
            time.sleep(0.2)
        codes = re.findall(r"(?:^|\s)ExitCode=(\d+):(\d+)", shown)
        code = max(int(status) if signal == "0" else 1 for status, signal in codes)
        return subprocess.CompletedProcess(submitted.args, code, submitted.stdout, submitted.stderr)


_active: list[Cluster] = []


def active() -> Cluster:
    assert _active, "no dev cluster is running (use the dev_cluster fixture)"
    return _active[-1]


@pytest.fixture(scope="session")
def cluster_inventory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_inventory(tmp_path_factory.mktemp("inventory"))


SUITE_CONFIG = "sharing:\n  shard_size: {l40s: 4G}\njob_submit:\n  fail_policy: open\n"


@pytest.fixture(scope="session")
def suite_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("config") / "config.yaml"
    path.write_text(SUITE_CONFIG)
    return path


def dev_cluster_argv(*args: str) -> list[str]:
    return [sys.executable, str(DEV_CLUSTER), *args]


def suite_up_argv(name: str, inventory: Path, suite_config: Path) -> list[str]:
    """`dev-cluster up` as the suite runs it (a test that brings the cluster up again uses it too,
    so the tests after it find the same cluster): the hook, l40s sharing, and slurmdbd with MariaDB,
    so sacct and `slurm-hetero report` see the jobs."""
    argv = dev_cluster_argv("up", "--slurm-release", name, "--inventory", str(inventory))
    return argv + ["--job-submit", "--config", str(suite_config), "--accounting"]


@pytest.fixture(scope="session", params=selected_releases())
def dev_cluster(
    request: pytest.FixtureRequest, cluster_inventory: Path, suite_config: Path
) -> Iterator[Cluster]:
    """Start the dev cluster of one release for the session (with the job_submit hook, l40s
    sharing and accounting); in one process the next release's starts after this one is down."""
    _need_root()
    name = request.param
    started = time.monotonic()
    result = subprocess.run(
        suite_up_argv(name, cluster_inventory, suite_config), capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.fail(f"dev-cluster up --slurm-release {name} failed:\n{result.stdout}\n{result.stderr}")
    print(f"dev cluster {name} up in {time.monotonic() - started:.1f}s", file=sys.stderr)
    rel = release.get(name)
    cluster = Cluster(
        rel, cluster_inventory, "/opt/slurm-hetero/venv/bin/python" if rel.chrooted else sys.executable
    )
    _active.append(cluster)
    try:
        yield cluster
    finally:
        _active.remove(cluster)
        subprocess.run(dev_cluster_argv("down", "--slurm-release", name), check=False)


# Tests whose jobs run `slurm-hetero launch` (modules, documented commands). Rank 0 listens on a
# port derived from the job id, which the other release's cluster beside this one (same host, job
# ids alike) derives too, and their step times want the CPUs: one such test at a time.
LAUNCH_MODULES = {"test_launch_slurm.py", "test_launch_default.py", "test_launch_faults_slurm.py"}
LAUNCH_LOCK = Path("/tmp/slurm-hetero-integration-launch.lock")


def _params(item: pytest.Item) -> dict[str, Any]:
    """The item's parameters (the release as `dev_cluster`, a documented `command`), {} if none."""
    callspec = getattr(item, "callspec", None)
    return callspec.params if callspec else {}


def _launches(item: pytest.Item) -> bool:
    command = _params(item).get("command")
    return item.path.name in LAUNCH_MODULES or " launch " in getattr(command, "text", "")


@pytest.fixture(autouse=True)
def _one_launching_test_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    if not _launches(request.node):
        yield
        return
    with LAUNCH_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here is marked `slurm`; with pytest-xdist's `--dist loadgroup`, one worker runs
    all of one release's tests (its cluster comes up once), beside the other release's. Every
    other release takes its launching tests first, the others last, so that the workers seldom
    wait for each other's."""
    releases = selected_releases()

    def launching_last(item: pytest.Item) -> bool:
        launching_first = releases.index(_params(item).get("dev_cluster", releases[0])) % 2 == 1
        return _launches(item) != launching_first

    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.slurm)
        if "dev_cluster" in _params(item):
            item.add_marker(pytest.mark.xdist_group(_params(item)["dev_cluster"]))
    items.sort(key=launching_last)  # stable: each module keeps its order


def slurm_as(
    user: str | None, *argv: str, check: bool = True, timeout: float = 60, stdin: str | None = None
) -> str:
    """stdout of a client command on the active cluster, as `user`; raises on failure (`check`)."""
    result = active().run(list(argv), user, timeout=timeout, stdin=stdin, cwd="/tmp")
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def slurm(*argv: str, check: bool = True, timeout: float = 60) -> str:
    """stdout of a client command (sbatch, srun, scontrol, ...) on the active cluster, as root."""
    return slurm_as(None, *argv, check=check, timeout=timeout)


def tres(text: str) -> str:
    """A TRES string in one form for comparisons: 24.11's `gres/gpu:a100:1` as 22.05's `gres:gpu:a100:1`."""
    return ",".join(("gres:" + item[5:]) if item.startswith("gres/") else item for item in text.split(","))
