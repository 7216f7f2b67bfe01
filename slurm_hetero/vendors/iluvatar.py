"""Iluvatar CoreX GPUs (BI-V100, BI-V150, BI-V150S, MR-V100, ...) through `ixsmi`.

Tools and versions parsed: the default `ixsmi` table, an nvidia-smi look-alike, as printed by
IX-ML 3.0.1 (driver 3.0.1), IX-ML 4.0.0 (driver 4.1.0) and IX-ML 4.3.0 (driver 4.3.0): an optional
`Timestamp ...` line, a banner `IX-ML: <v>  Driver Version: <v>  CUDA Version: <v|N/A>`, header
`GPU Name | Bus-Id | Clock-SM Clock-Mem` over `Fan Temp Perf Pwr:Usage/Cap | Memory-Usage |
GPU-Util Compute M.`, two rows per GPU closed by `+---+`, then a blank line and the `Processes:`
box, which must be complete. A capture may stop at that blank line (one fixture was cut there by
`ixsmi | grep -B99999 '^ *$'` in its author's script) but not on the table's last border.

Fields: `index` is the GPU number, `model` the Name as printed (`Iluvatar BI-V150`), `file`
`/dev/iluvatar<index>` (the driver's per-GPU node; Iluvatar's Kubernetes device plugin hands out
`/dev/iluvatar<minor>` plus the shared `/dev/itrctl` since driver 4.4.0), `pci_bus_id` in sysfs form,
`memory_mib` the Memory-Usage total, `driver_version` from the banner, `runtime_version` the banner's
CUDA Version (the CUDA API level the CoreX runtime implements; unset when `N/A`).
`visible_devices_env` is None: CoreX exposes its GPUs through a CUDA-compatible runtime that
selects devices by CUDA_VISIBLE_DEVICES, which Slurm's gres/gpu already sets (Iluvatar's own job
scripts read CUDA_VISIBLE_DEVICES; IX_VISIBLE_DEVICES is only the container runtime's variable).

Fixtures (tests/fixtures/iluvatar/), all public captures: `ixsmi_2x-bi-v150_drv4.3.0_paddle-docs.txt`
(PaddlePaddle/docs), `ixsmi_1x-bi-v150s_drv4.1.0_ix-device-plugin.txt` (Deep-Spark/ix-device-plugin)
and `ixsmi_7x-bi-v100_drv3.0.1_reset-script.txt` (dillonfzw/utils, comment prefix stripped).

Known gaps: the ixsmi index is not a stable device-node number. In the BI-V100 capture a GPU that
failed (0C, 65535W) vanished after a reset and the GPUs behind it were renumbered, so
`/dev/iluvatar<index>` can point at the wrong GPU on such a node; `ixsmi -q` (Minor Number) is not
parsed for lack of a public capture, nor is `ixsmi topo -m` (IX-Link) - links stay empty. ixsmi prints
no device count: a capture cut right after a GPU block's border and the blank line cannot be told
from a smaller node.
No health signal (the table has none; the 65535W sentinel of the failed GPU is not interpreted).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from slurm_hetero.core.model import Capture, Device
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors._table import (
    Line,
    TableError,
    guarded,
    in_index_order,
    mib_pair,
    numbered_lines,
    read_box_table,
    read_trailing_processes,
    sysfs_bus_id,
)
from slurm_hetero.vendors.base import Vendor

TOOL = "ixsmi"

_BANNER = re.compile(r"IX-ML:\s*(\S+)\s+Driver Version:\s*(\S+)\s+CUDA Version:\s*(\S+)")
_FIRST = re.compile(r"(\d+)\s+(\S.*)")


def _device(block: tuple[Line, ...], driver: str, cuda: str | None) -> Device:
    first, second = block
    ident = _FIRST.fullmatch(first.cells()[0])
    bus = sysfs_bus_id(first.cells()[1])
    memory = mib_pair(second.cells()[1])
    if not (ident and bus and memory):
        raise TableError("expected `GPU Name | Bus-Id` and a `used MiB / total MiB` Memory-Usage cell", first)
    index = int(ident.group(1))
    return Device(
        vendor="iluvatar",
        model=ident.group(2),
        index=index,
        file=f"/dev/iluvatar{index}",
        memory_mib=memory[1],
        pci_bus_id=bus,
        driver_version=driver,
        runtime_version=cuda,
    )


def _parse(text: str) -> list[Device]:
    lines = numbered_lines(text)
    table = read_box_table(lines)
    banner = _BANNER.search(table.banner[0].text) if table.banner else None
    if banner is None or not table.header[0].cells()[0].startswith("GPU"):
        raise TableError(
            "not an ixsmi table (no `IX-ML: ... Driver Version: ...` banner)",
            table.banner[0] if table.banner else None,
        )
    if not table.blocks:
        raise TableError("ixsmi table lists no GPUs", table.last_separator)
    if not table.last_separator.text.startswith("+"):
        raise TableError("GPU table not closed by a +---+ border (output cut short?)", table.last_separator)
    read_trailing_processes(lines, table.end)
    cuda = banner.group(3) if banner.group(3) != "N/A" else None
    devices = [_device(block, banner.group(2), cuda) for block in table.blocks]
    return in_index_order(devices, "GPU number")


@register_vendor("iluvatar")
class IluvatarVendor(Vendor):
    """Iluvatar CoreX GPUs as GRES gpu, one `/dev/iluvatarN` each; Slurm's CUDA_VISIBLE_DEVICES applies."""

    tools = (TOOL,)
    device_glob = "/dev/iluvatar[0-9]*"
    visible_devices_env = None
    slurm_gpu_env = "nvidia_gpu_env"  # CoreX reads CUDA_VISIBLE_DEVICES
    torch_backend = "nccl"  # CoreX's CUDA-compatible collectives
    ccl_env_prefix = "NCCL"

    def parse(self, captures: Sequence[Capture]) -> list[Device]:
        return guarded(self, self.one_capture(captures, "ixsmi table"), _parse)
