"""One real Slurm dev cluster per test session (marker `slurm`).

The cluster runs the bundled example inventory plus a second inventory generated here the way an
admin would: `slurm-hetero discover --from-file` on real captures of several vendors' tools,
then `inventory merge`. Needs root and Debian's Slurm packages (dev-cluster installs them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, REPO

DEV_CLUSTER = REPO / "scripts" / "dev-cluster"
EXAMPLE = REPO / "gres_conf" / "examples" / "mixed.yaml"
SITE_NAMES = REPO / "gres_conf" / "examples" / "site-names.yaml"  # Type= names that are not catalog types

# node name -> (vendor, captures under tests/fixtures/<vendor>/) for the generated inventory
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
    "npu310n1": ("ascend", ["npu-smi-info_2x-310p3_npu-id-0-and-64_drv23.0.rc3.txt"]),
    "npu910n1": ("ascend", ["npu-smi-info_ascend910-2chips-per-npu_phy-id_drv25.2.0.txt"]),
    "edge310n1": ("ascend", ["npu-smi-info_310b4_nohbm_alarm_drv23.0.0.txt"]),
}


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
        args = ["discover", "--vendor", vendor, "--node", node, "--json"]
        lines.append(cli(*args, *[a for f in files for a in ("--from-file", f)]).stdout.strip())
    (directory / "captured.jsonl").write_text("\n".join(lines) + "\n")
    combined = directory / "cluster.yaml"
    inputs = [str(EXAMPLE), str(SITE_NAMES), str(directory / "captured.jsonl")]
    cli("inventory", "merge", *inputs, "-o", str(combined))
    return combined


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the dev cluster needs root")


@pytest.fixture(scope="session")
def cluster_inventory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_inventory(tmp_path_factory.mktemp("inventory"))


SUITE_CONFIG = "sharing:\n  shard_size: {l40s: 4G}\njob_submit:\n  fail_policy: open\n"


@pytest.fixture(scope="session")
def suite_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("config") / "config.yaml"
    path.write_text(SUITE_CONFIG)
    return path


@pytest.fixture(scope="session")
def dev_cluster(cluster_inventory: Path, suite_config: Path) -> Iterator[Path]:
    """Start the dev cluster once for the session, with the job_submit hook and l40s sharing."""
    _need_root()
    started = time.monotonic()
    argv = [
        sys.executable,
        str(DEV_CLUSTER),
        "up",
        "--inventory",
        str(cluster_inventory),
        "--job-submit",
        "--config",
        str(suite_config),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.fail(f"dev-cluster up failed:\n{result.stdout}\n{result.stderr}")
    print(f"dev cluster up in {time.monotonic() - started:.1f}s", file=sys.stderr)
    yield cluster_inventory
    subprocess.run([sys.executable, str(DEV_CLUSTER), "down"], check=False)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.slurm)


def slurm(*argv: str, check: bool = True, timeout: float = 60) -> str:
    assert shutil.which(argv[0]), f"{argv[0]} not installed"
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout
