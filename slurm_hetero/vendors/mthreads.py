"""Moore Threads MTT GPUs (S80, S3000, S4000, S5000, ...) through `mthreads-gmi`.

Tools and versions parsed: the default `mthreads-gmi` output (1.12.2, driver 1.2.0): a banner
`mthreads-gmi:<ver>  Driver Version:<ver>` between dashed rules, a three-line header, three lines
per GPU separated by `+---+`, an optional complete `Processes:` section. Not a box table: columns are
located by the header's `|` positions, which every device line repeats.

Fields: `file` is /dev/mtgpu.<ID>, `memory_mib` the total of `used(total)`; a Device Type other than
`Physical` (`MPC Parent`) goes to `partition_mode`. MUSA_VISIBLE_DEVICES is the runtime's variable
(MTHREADS_VISIBLE_DEVICES the container toolkit's). Used memory above the total is the wrong total
of an IOMMU that is off (Moore Threads environment_FAQ.md question 5): the GPU is kept, unhealthy,
with `memory_mib` unset so the catalog supplies the real size.

Fixtures (tests/fixtures/mthreads/): `mthreads-gmi_mtt-s4000_drv1.2.0_wrong-mem-total_faq.txt`.

Known gaps: only a single-GPU capture exists, so the multi-GPU separator is untested; no device
count, so a cut at the end of a GPU block (or inside its ECC line) goes unnoticed; the /dev/mtgpu.N
minor is assumed equal to the ID; no links, health flags, UUID or NUMA (`-q`).
"""

from __future__ import annotations

import re

from slurm_hetero.core.model import Device, Health, VendorTraits
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors._table import (
    TOP_BORDER,
    Line,
    TableError,
    in_index_order,
    numbered_lines,
    skip_blank,
    sysfs_bus_id,
)
from slurm_hetero.vendors.base import Vendor

TOOL = "mthreads-gmi"

_BANNER = re.compile(r"^\s*mthreads-gmi:(\S+)\s+Driver Version:\s*(\S+)$")
_DASHES = re.compile(r"^-{10,}$")
_FIRST = re.compile(r"^(\d+)\s+(\S.*)$")
_USAGE = re.compile(r"^(\d+)%\s+(\d+)MiB\((\d+)MiB\)$")
_FAQ = (
    "mthreads-gmi reports {used} MiB used of a {total} MiB total: the total is wrong when the IOMMU is "
    "off or not in effect (Moore Threads tutorial_on_musa FAQ/environment_FAQ.md, question 5); enable it "
    "as that FAQ's question 3 says (intel_iommu=on or amd_iommu=on with iommu.passthrough=0) and reboot"
)


def _pipes(text: str) -> list[int]:
    return [i for i, char in enumerate(text) if char == "|"]


def _cells(line: Line, pipes: list[int]) -> list[str]:
    bounds = [-1, *pipes, len(line.text)]
    return [line.text[a + 1 : b].strip() for a, b in zip(bounds, bounds[1:])]


def _banner(lines: list[Line]) -> tuple[int, str]:
    """Index of the line after the banner's closing rule, and the driver version."""
    for i, line in enumerate(lines):
        m = _BANNER.match(line.text)
        if (
            m
            and 0 < i < len(lines) - 1
            and _DASHES.match(lines[i - 1].text)
            and _DASHES.match(lines[i + 1].text)
        ):
            return i + 2, m.group(2)
    raise TableError("not mthreads-gmi output (no `mthreads-gmi:<ver>  Driver Version:<ver>` banner)")


def _header(lines: list[Line], i: int) -> tuple[list[Line], int]:
    header: list[Line] = []
    while i < len(lines) and not TOP_BORDER.match(lines[i].text):
        header.append(lines[i])
        i += 1
    if (
        i == len(lines)
        or len(header) != 3
        or not header[0].text.startswith("ID")
        or "Mem" not in header[0].text
    ):
        raise TableError(
            "expected the three-line `ID Name | PCIe | %GPU Mem` header and a +---+ rule",
            header[0] if header else lines[-1],
        )
    return header, i + 1


def _device(block: list[Line], header: list[Line], driver: str) -> Device:
    first, second, _ = (_cells(line, _pipes(head.text)) for line, head in zip(block, header))
    ident, usage, bus = _FIRST.match(first[0]), _USAGE.match(first[-1]), sysfs_bus_id(first[1])
    if not (ident and usage and bus and second[0]):
        raise TableError(
            "expected `ID Name | bus id | util% used MiB(total MiB)` (output cut short?)", block[0]
        )
    index, used, total = int(ident.group(1)), int(usage.group(2)), int(usage.group(3))
    kind = re.sub(r"\s+P\d+$", "", second[0])
    wrong_total = used > total
    return Device(
        vendor="mthreads",
        model=ident.group(2),
        index=index,
        file=f"/dev/mtgpu.{index}",
        memory_mib=None if wrong_total else total,
        pci_bus_id=bus,
        driver_version=driver,
        health=Health.UNHEALTHY if wrong_total else Health.OK,
        health_reason=_FAQ.format(used=used, total=total) if wrong_total else None,
        partition_mode=None if kind == "Physical" else kind,
    )


def _block(lines: list[Line], i: int, header: list[Line]) -> list[Line]:
    block = lines[i : i + len(header)]
    if len(block) != len(header) or not all(line.text.strip() for line in block):
        count = next((n for n, line in enumerate(block) if not line.text.strip()), len(block))
        raise TableError(
            f"device block of {count} lines, the header has {len(header)} (output cut short?)",
            lines[min(i + count, len(lines)) - 1],
        )
    for line, head in zip(block, header):
        if _pipes(line.text) != _pipes(head.text):
            raise TableError("device line does not follow the header's columns (output cut short?)", line)
    return block


def _processes(lines: list[Line], i: int) -> None:
    """Nothing, or a dashed `Processes:` section closed by a dashed rule."""
    i = skip_blank(lines, i)
    if i == len(lines):
        return
    if not (
        _DASHES.match(lines[i].text) and i + 1 < len(lines) and lines[i + 1].text.startswith("Processes")
    ):
        raise TableError("unexpected line after the GPU list", lines[i])
    if not any(_DASHES.match(line.text) for line in lines[i + 2 :]):
        raise TableError("Processes section not closed by a dashed rule (output cut short?)", lines[-1])


def _parse(text: str) -> list[Device]:
    lines = numbered_lines(text)
    i, driver = _banner(lines)
    header, i = _header(lines, i)
    devices: list[Device] = []
    while True:
        devices.append(_device(_block(lines, i, header), header, driver))
        i += len(header)
        if i < len(lines) and TOP_BORDER.match(lines[i].text):
            i += 1
            continue
        if i < len(lines) and _DASHES.match(lines[i].text):
            i += 1
        break
    _processes(lines, i)
    return in_index_order(devices, "GPU ID")


@register_vendor("mthreads")
class MthreadsVendor(Vendor):
    tools = (TOOL,)
    device_glob = "/dev/mtgpu.[0-9]*"
    traits = VendorTraits(
        visible_devices_env="MUSA_VISIBLE_DEVICES",
        torch_backend="mccl",
        ccl_env_prefix="MCCL",  # MCCL, the MUSA port of NCCL, reads MCCL_* network variables
        torch_package="torch_musa",
        torch_device="musa",
    )
    parse_text = _parse
