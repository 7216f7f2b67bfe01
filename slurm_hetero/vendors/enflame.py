"""Enflame GCU (S60, i20, T20, ...) through `efsmi`.

Tools and versions parsed: the default `efsmi` text of EFSMI V1.2 (driver 1.2.0.301): an optional
dashed banner, then one box (`|EFSMI V<x>  Driver Ver: <y>|`, a two-line header, two rows per
device); every line must be as wide as the top border, so a cut anywhere is a ParseError.

Fields: `file` is /dev/gcu<DEV> (the driver's per-card node, what the device plugin hands out);
`pci_bus_id` in sysfs form (`00:01:00.0` -> `0000:01:00.0`); `memory_mib` the `Mem` column, the
capacity after ECC (S60: 49120MiB without ECC, 42976 with), not usage. TOPS_VISIBLE_DEVICES selects.

Fixtures (tests/fixtures/enflame/): `efsmi_2x-enflame-s60_paddle-docs.txt`.

Known gaps: no device count (a cut after a device's closing border looks like fewer cards); no
health (Dpm is a power state), UUID, serial, NUMA or links; `efsmi -q` is not parsed.
"""

from __future__ import annotations

import re

from slurm_hetero.core.model import Device, VendorTraits
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors._table import TOP_BORDER, Line, TableError, check_row, check_width, nonblank_lines
from slurm_hetero.vendors.base import Vendor

TOOL = "efsmi"

_TOP = re.compile(r"^\+.*-{10,}\+$")
_SEPARATOR = re.compile(r"^\|-+\|$")
_VERSION = re.compile(r"^\|\s*EFSMI\s+V(\S+)\s+Driver Ver:\s*(\S+)\s*\|$")
_BANNER = re.compile(r"^-{3,}.*-{3,}$|^-+$")
_ROW1 = re.compile(r"^(\d+)\s+(\S.*)$")
_BUS = re.compile(r"^(?:([0-9a-fA-F]{2,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_MEM = re.compile(r"^(\d+)\s*MiB\b")


def _box(lines: list[Line]) -> list[Line]:
    """The lines of the box after the banner, each checked to be as wide as its top border."""
    start = next((i for i, line in enumerate(lines) if line.text.startswith("+")), None)
    if start is None:
        raise TableError("no box after the efsmi banner (output cut short?)", lines[-1])
    for line in lines[:start]:
        if not _BANNER.match(line.text):
            raise TableError("unexpected line before the efsmi box", line)
    box = lines[start:]
    if not _TOP.match(box[0].text):
        raise TableError("expected the box's top border", box[0])
    check_width(box, "box")
    return box


def _header(box: list[Line]) -> tuple[str, int]:
    """The driver version, and where the device blocks start (after the header and its separator)."""
    version = _VERSION.match(box[1].text) if len(box) > 1 else None
    if not version:
        where = box[min(1, len(box) - 1)]
        raise TableError("expected '|EFSMI V<version>  Driver Ver: <version>|' under the top border", where)
    for i in range(2, len(box) - 1):
        if "BUS-ID" in box[i].text and "Mem" in box[i + 1].text:
            if i + 2 >= len(box) or not _SEPARATOR.match(box[i + 2].text):
                raise TableError(
                    "expected a separator under the column header", box[min(i + 2, len(box) - 1)]
                )
            return version.group(2), i + 3
    raise TableError("no 'DEV NAME | FW VER | BUS-ID' header in the box", box[-1])


def _blocks(box: list[Line], start: int) -> list[list[Line]]:
    """Two rows per device, each block closed by `+---+`; `|---|` lines only between blocks."""
    blocks: list[list[Line]] = [[]]
    for line in box[start:]:
        if TOP_BORDER.match(line.text):
            if len(blocks[-1]) != 2:
                raise TableError(f"a device block of {len(blocks[-1])} rows, expected 2", line)
            blocks.append([])
        elif _SEPARATOR.match(line.text):
            if blocks[-1]:
                raise TableError("a separator inside a device block", line)
        else:
            blocks[-1].append(line)
    if blocks[-1]:
        raise TableError(
            "the last device block has no closing '+---+' border (output cut short?)", blocks[-1][-1]
        )
    if len(box) > start and not TOP_BORDER.match(box[-1].text):  # a `|---|` opening a block never printed
        raise TableError("the box does not end on a '+---+' border (output cut short?)", box[-1])
    return blocks[:-1]


def _bus_id(text: str, line: Line) -> str:
    m = _BUS.match(text)
    if not m:
        raise TableError(f"BUS-ID {text!r} is not a PCI address", line)
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


def _device(block: list[Line], driver: str) -> Device:
    row1, row2 = block
    ident, _firmware, bus = check_row(row1, 3)
    _power, memory, _usage = check_row(row2, 3)
    m = _ROW1.match(ident)
    if not m:
        raise TableError("expected '<DEV> <NAME>' in the first cell", row1)
    mem = _MEM.match(memory)
    if not mem or int(mem.group(1)) <= 0:
        raise TableError(f"Mem {memory!r} is not '<n>MiB'", row2)
    index = int(m.group(1))
    return Device(
        vendor="enflame",
        model=m.group(2).strip(),
        index=index,
        file=f"/dev/gcu{index}",
        memory_mib=int(mem.group(1)),
        pci_bus_id=_bus_id(bus.split()[0] if bus else "", row1),
        driver_version=driver,
    )


def _parse_text(text: str) -> list[Device]:
    lines = nonblank_lines(text)
    if not any("EFSMI" in line.text or "Enflame System Management Interface" in line.text for line in lines):
        raise TableError(
            "not efsmi output (no 'Enflame System Management Interface' banner or 'EFSMI' version line)",
            lines[0] if lines else None,
        )
    box = _box(lines)
    driver, start = _header(box)
    blocks = _blocks(box, start)
    if not blocks:
        raise TableError("the efsmi box lists no device", box[-1])
    devices = [_device(block, driver) for block in blocks]
    indexes = [d.index for d in devices]
    if len(set(indexes)) != len(indexes):
        raise TableError(f"DEV numbers {indexes} repeat", box[start])
    return sorted(devices, key=lambda d: d.index)


@register_vendor("enflame")
class EnflameVendor(Vendor):
    tools = (TOOL,)
    device_glob = "/dev/gcu[0-9]*"
    traits = VendorTraits(
        visible_devices_env="TOPS_VISIBLE_DEVICES",
        torch_backend="eccl",
        torch_package="torch_gcu",
        torch_device="gcu",
    )
    parse_text = _parse_text
