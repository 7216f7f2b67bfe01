"""Host topology trees for tests: the real-host descriptions in tests/fixtures/host/ (see their
.source) as the kernel shows them under /sys and /proc, for `read_topology(root)` and
`discover --from-file ... --host-root DIR`."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import FIXTURES

HOSTS = FIXTURES / "host"
DGX = "dgx-a100_2x-epyc7742_smt2"
ATLAS = "atlas-800t-a2_4x-kunpeng920-48c_nosmt"


def sysfs_tree(root: Path, host: str) -> Path:
    """A /sys + /proc tree as the kernel shows it for `host` (lscpu -p rows -> cpuN/topology)."""
    cpu_dir = root / "sys/devices/system/cpu"
    rows = [
        line.split(",")
        for line in (HOSTS / f"{host}.lscpu-p.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    for cpu, core, socket, _node in rows:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{socket}\n")
        (topo / "core_id").write_text(f"{core}\n")
    (cpu_dir / "online").write_text(f"0-{len(rows) - 1}\n")
    (root / "proc").mkdir()
    shutil.copy(HOSTS / f"{host}.meminfo.txt", root / "proc/meminfo")
    return root
