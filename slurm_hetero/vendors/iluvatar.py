"""Iluvatar CoreX GPUs (BI-V100, BI-V150, BI-V150S, MR-V100, ...) through `ixsmi`.

Tools and versions parsed: the default `ixsmi` table (an nvidia-smi look-alike) of IX-ML 3.0.1,
4.0.0 and 4.3.0: banner `IX-ML: <v>  Driver Version: <v>  CUDA Version: <v|N/A>`, two rows per GPU,
then a blank line and the `Processes:` box.

Fields: `file` is /dev/iluvatar<index> (what the device plugin hands out), `runtime_version` the
CUDA API level CoreX implements. No `visible_devices_env`: CoreX's runtime reads
CUDA_VISIBLE_DEVICES, which Slurm sets (IX_VISIBLE_DEVICES is only the container runtime's).

Fixtures: tests/fixtures/iluvatar/ (provenance in each .source).

Known gaps: the ixsmi index is not a stable node number (in the BI-V100 capture a failed GPU
vanished after a reset and the others were renumbered); `ixsmi -q` and `topo -m` are not parsed
(no links); no device count, so a cut after a GPU block and the blank line looks like fewer GPUs;
no health signal.
"""

from __future__ import annotations

import re

from slurm_hetero.core.model import Device, VendorTraits
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors._table import (
    Line,
    TableError,
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
    tools = (TOOL,)
    device_glob = "/dev/iluvatar[0-9]*"
    # CoreX reads CUDA_VISIBLE_DEVICES and presents its collectives as nccl
    traits = VendorTraits(slurm_gpu_env="nvidia_gpu_env", torch_backend="nccl", ccl_env_prefix="NCCL")
    parse_text = _parse
