"""Node facts from the kernel (sysfs, /proc/meminfo) and device affinity as Slurm core indices,
on trees built from the real-host descriptions in tests/fixtures/host/ (see their .source)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from slurm_hetero.cli import cli
from slurm_hetero.core.model import ClusterInventory, Device
from slurm_hetero.inventory import discover
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.hosttopo import read_topology, topology_from_cpus
from slurm_hetero.render.context import RenderOptions, build_context
from slurm_hetero.render.templates import render_configs
from slurm_hetero.slurm.syntax import cpu_ids
from slurm_hetero.vendors import get_vendor
from tests.conftest import FIXTURES
from tests.hosttree import ATLAS, DGX, HOSTS, sysfs_tree


def expected_slurmd_c(host: str) -> dict[str, str]:
    source = (HOSTS / f"{host}.lscpu-p.txt.source").read_text()
    line = re.search(r"what slurmd -C reports for this host: (.*)", source)
    assert line
    return dict(field.split("=") for field in line.group(1).split())


@pytest.mark.parametrize("host", [DGX, ATLAS])
def test_sysfs_facts_are_what_slurmd_reports(tmp_path: Path, host: str) -> None:
    topology = read_topology(sysfs_tree(tmp_path, host))
    assert topology is not None
    want = expected_slurmd_c(host)
    got = (topology.cpus, topology.sockets, topology.cores_per_socket, topology.threads_per_core)
    assert got == tuple(int(want[k]) for k in ("CPUs", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore"))
    memkb = int((HOSTS / f"{host}.meminfo.txt").read_text().split()[1])
    assert topology.real_memory_mib == memkb // 1024


def test_dgx_affinity_with_smt_siblings_becomes_core_indices(tmp_path: Path) -> None:
    topology = read_topology(sysfs_tree(tmp_path, DGX))
    assert topology is not None
    # the real DGX A100 `nvidia-smi topo -m` affinities (tests/fixtures/nvidia/topo-m_dgx-a100_...)
    assert topology.slurm_cores("48-63,176-191") == "48-63"
    assert topology.slurm_cores("112-127,240-255") == "112-127"
    assert topology.slurm_cores("48-63,300") is None  # not a CPU of this host


def test_atlas_affinity_without_smt_is_unchanged(tmp_path: Path) -> None:
    topology = read_topology(sysfs_tree(tmp_path, ATLAS))
    assert topology is not None and topology.slurm_cores("144-167") == "144-167"


def test_adjacent_sibling_numbering_is_mapped_by_topology_not_arithmetic() -> None:
    # POWER-style numbering: CPUs 2k and 2k+1 are the two threads of core k
    topology = topology_from_cpus({cpu: (0 if cpu < 8 else 1, cpu // 2) for cpu in range(16)})
    assert (topology.sockets, topology.cores_per_socket, topology.threads_per_core) == (2, 4, 2)
    assert topology.slurm_cores("8-11") == "4-5"


def test_live_discover_renders_the_cores_and_node_line_slurmd_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = sysfs_tree(tmp_path, DGX)
    affinity = {0: "48-63,176-191", 1: "48-63,176-191", 2: "16-31,144-159", 3: "16-31,144-159"}
    devices = [
        Device("nvidia", "NVIDIA A100-SXM4-40GB", i, f"/dev/nvidia{i}", 40960, cores=cpus)
        for i, cpus in affinity.items()
    ]
    monkeypatch.setattr(discover, "devices_live", lambda names: [(get_vendor("nvidia"), devices)])
    node = discover.discover_node(load_catalog(), node_name="dgx1", root=root)
    assert [d.cores for d in node.devices] == ["48-63", "48-63", "16-31", "16-31"]
    context = build_context(ClusterInventory(nodes=(node,)), load_catalog(), RenderOptions())
    context["source"] = "t"
    files = render_configs(context)
    assert "File=/dev/nvidia[0-1] Cores=48-63" in files["gres.conf"]
    line = next(x for x in files["slurm-nodes.conf"].splitlines() if x.startswith("NodeName=dgx1"))
    want = expected_slurmd_c(DGX)
    for key, name in (("CPUs", "CPUs"), ("SocketsPerBoard", "Sockets"), ("CoresPerSocket", "CoresPerSocket")):
        assert f" {name}={want[key]} " in line
    assert f" ThreadsPerCore={want['ThreadsPerCore']} " in line and " RealMemory=" in line
    assert all(max(cpu_ids(d.cores or "0")) < 128 for d in node.devices)


@pytest.mark.skipif(not shutil.which("slurmd"), reason="slurmd not installed")
def test_this_host_matches_slurmd_c() -> None:
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30, check=True).stdout
    want = dict(f.split("=", 1) for f in out.splitlines()[0].split() if "=" in f)
    facts, topology = discover.live_facts()
    assert topology is not None
    assert facts["cpus"] == int(want["CPUs"])
    assert facts["sockets"] * int(want.get("Boards", "1")) == int(want["SocketsPerBoard"])
    assert facts["cores_per_socket"] == int(want["CoresPerSocket"])
    assert facts["threads_per_core"] == int(want["ThreadsPerCore"])
    assert abs(facts["real_memory_mib"] - int(want["RealMemory"])) <= 1


def test_from_file_takes_node_facts_on_the_command_line() -> None:
    info = FIXTURES / "ascend" / "npu-smi-info_910b2c_hbm_drv23.0.2.1.txt"
    args = ["discover", "--vendor", "ascend", "--from-file", str(info), "--node", "npu1"]
    args += ["--cpus", "192", "--sockets", "4", "--cores-per-socket", "48", "--threads-per-core", "1"]
    result = CliRunner().invoke(cli, [*args, "--real-memory", "1500G"])
    assert result.exit_code == 0, result.output
    node = yaml.safe_load(result.stdout)["nodes"][0]
    assert (node["cpus"], node["sockets"], node["cores_per_socket"], node["real_memory_mib"]) == (
        192,
        4,
        48,
        1536000,
    )


def test_from_file_reads_node_facts_from_scontrol_when_slurm_knows_the_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    line = (Path("/work/shared/slurm-lab/samples/scontrol_show_node_oneliner.txt")).read_text()
    sample = next((x for x in line.splitlines() if x.startswith("NodeName=ascendn1")), None)
    if sample is None:
        pytest.skip("shared scontrol sample not present")
    monkeypatch.setattr(discover.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr("slurm_hetero.core.proc.run", lambda argv, timeout=60.0: sample + "\n")
    info = FIXTURES / "ascend" / "npu-smi-info_910b2c_hbm_drv23.0.2.1.txt"
    node = discover.discover_node(load_catalog(), ["ascend"], [info], "ascendn1")
    assert (node.cpus, node.sockets, node.real_memory_mib) == (16, 16, 16000)


def test_from_file_without_facts_renders_with_a_warning() -> None:
    info = FIXTURES / "ascend" / "npu-smi-info_910b2c_hbm_drv23.0.2.1.txt"
    node = discover.discover_node(load_catalog(), ["ascend"], [info], "lonely1")
    assert node.cpus is None
    context = build_context(ClusterInventory(nodes=(node,)), load_catalog(), RenderOptions())
    assert any("lonely1: no CPUs or RealMemory" in n and "CPUs=1" in n for n in context["notes"])


ATLAS_NPU = [
    FIXTURES / "ascend" / "npu-smi-info_8x-910b3_drv24.1.rc1.txt",
    FIXTURES / "ascend" / "npu-smi-info-t-topo_8x-910b3_hccs_cpu-affinity.txt",
]


def test_from_file_with_host_root_takes_the_captured_hosts_facts_and_cores(tmp_path: Path) -> None:
    """The Atlas 800T A2's real npu-smi captures with its topology tree: slurmd -C's facts, and the
    tool's affinity (first NUMA node of each socket) as Slurm core indices."""
    root = sysfs_tree(tmp_path, ATLAS)
    args = ["discover", "--vendor", "ascend", "--node", "atlasn1", "--host-root", str(root)]
    result = CliRunner().invoke(cli, [*args, *[a for f in ATLAS_NPU for a in ("--from-file", str(f))]])
    assert result.exit_code == 0, result.output
    node = yaml.safe_load(result.stdout)["nodes"][0]
    want = expected_slurmd_c(ATLAS)
    assert (node["cpus"], node["sockets"], node["cores_per_socket"], node["threads_per_core"]) == tuple(
        int(want[k]) for k in ("CPUs", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
    )
    assert sorted({d["cores"] for d in node["devices"]}) == ["0-23", "144-167", "48-71", "96-119"]


def test_host_root_maps_smt_siblings_of_a_captured_affinity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = sysfs_tree(tmp_path, DGX)
    device = Device("nvidia", "NVIDIA A100-SXM4-40GB", 0, "/dev/nvidia0", 40960, cores="112-127,240-255")
    monkeypatch.setattr(discover, "devices_from_files", lambda *a: [(get_vendor("nvidia"), [device])])
    node = discover.discover_node(load_catalog(), ["nvidia"], [Path("x")], "dgx1", root=root)
    assert (node.cpus, node.threads_per_core, node.devices[0].cores) == (256, 2, "112-127")


def test_host_root_facts_on_the_command_line_win(tmp_path: Path) -> None:
    root = sysfs_tree(tmp_path, ATLAS)
    args = [
        "discover",
        "--vendor",
        "ascend",
        "--node",
        "a1",
        "--host-root",
        str(root),
        "--cpus",
        "96",
        "--sockets",
        "2",
    ]
    result = CliRunner().invoke(cli, [*args, *[a for f in ATLAS_NPU for a in ("--from-file", str(f))]])
    assert result.exit_code == 0, result.output
    node = yaml.safe_load(result.stdout)["nodes"][0]
    assert (node["cpus"], node["sockets"], node["cores_per_socket"]) == (96, 2, 48)


def test_host_root_without_topology_or_captures_is_one_line(tmp_path: Path) -> None:
    args = ["discover", "--vendor", "ascend", "--node", "a1", "--host-root", str(tmp_path)]
    result = CliRunner().invoke(cli, [*args, *[a for f in ATLAS_NPU for a in ("--from-file", str(f))]])
    assert result.exit_code == 1
    assert "--host-root" in result.output and "sys/devices/system/cpu" in result.output
    result = CliRunner().invoke(cli, ["discover", "--host-root", str(tmp_path)])
    assert result.exit_code == 1 and "use it with --from-file" in result.output


# Adversarial pass of issue 12 (admin): each find kept.
def _discover(*extra: str, node: str = "a1") -> Result:
    """discover on the real Atlas 800T A2 npu-smi captures."""
    args = ["discover", "--vendor", "ascend", "--node", node, *extra]
    return CliRunner().invoke(cli, [*args, *[a for f in ATLAS_NPU for a in ("--from-file", str(f))]])


def _one_line_error(result: Result, *words: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("slurm-hetero: "), result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("damaged", "text", "expected"),
    [
        ("sys/devices/system/cpu/online", "0-2000000000", "ids up to 65535"),  # hung
        ("sys/devices/system/cpu/online", "7-0", "reversed range '7-0' in CPU list"),
        ("sys/devices/system/cpu/cpu5/topology/core_id", "garbage", "not usable"),  # warned, then failed
        ("sys/devices/system/cpu/cpu3/topology/physical_package_id", "7", "irregular topology"),
    ],
)
def test_a_damaged_host_root_is_one_line_at_once(
    tmp_path: Path, damaged: str, text: str, expected: str
) -> None:
    root = sysfs_tree(tmp_path, ATLAS)
    (root / damaged).write_text(f"{text}\n")
    _one_line_error(_discover("--host-root", str(root)), expected)


def test_host_root_meminfo_fifo_or_dev_zero_does_not_block(tmp_path: Path) -> None:
    root = sysfs_tree(tmp_path, ATLAS)
    meminfo = root / "proc/meminfo"
    meminfo.unlink()
    os.mkfifo(meminfo)
    _one_line_error(_discover("--host-root", str(root)), "FIFO")
    meminfo.unlink()
    meminfo.symlink_to("/dev/zero")
    _one_line_error(_discover("--host-root", str(root)), "character device")


def test_facts_slurmctld_would_reset_are_refused() -> None:
    args = ["--cpus", "8", "--sockets", "2", "--cores-per-socket", "8", "--threads-per-core", "2"]
    _one_line_error(_discover(*args), "cpus 8 matches none of sockets (2)")


def test_an_empty_node_name_is_refused_not_replaced_by_this_host() -> None:
    _one_line_error(_discover(node=""), "node name")
