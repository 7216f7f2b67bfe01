"""Cambricon MLU (MLU370-X4/X8/S4, MLU590, ...) through `cnmon`.

Tools and versions parsed: the default `cnmon` table of CNMON v5.10.13 (driver in the banner, a
Bus-Id column) and v4.20.11 (`Inited Driver` per card, no bus id), columns found by header name.

Fields: `index` and /dev/cambricon_dev<N> are the Card number (each chip of a dual-chip MLU370-X8
is its own card). `Inited` other than `On` is unhealthy; a VF column other than `/` (SR-IOV) gives
`partition_mode` `vf<value>`. MLU_VISIBLE_DEVICES works like CUDA_VISIBLE_DEVICES.

Fixtures (tests/fixtures/cambricon/): 2x MLU370-X8 (v5.10.13) and 3x MLU370-X4 (v4.20.11).

Known gaps: no public `cnmon topo -m` capture, so no MLU-Link links; no device count (a cut after a
card block and the blank line looks like fewer cards); the SR-IOV VF format is unverified; v5 has
no health signal (Ecc-Error is a counter).
"""

from __future__ import annotations

import re

from slurm_hetero.core.model import Device, Health, VendorTraits
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors._table import (
    BoxTable,
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

TOOL = "cnmon"

_BANNER = re.compile(r"CNMON\s+v(\S+)(?:\s+Driver\s+v(\S+))?")


def _column(table: BoxTable, row: int, name: str) -> int | None:
    """Index of the header cell of `row` that names `name` (None when the layout lacks it)."""
    cells = table.header[row].cells()
    return next((i for i, cell in enumerate(cells) if name in cell.split()), None)


def _card_cell(text: str, line: Line) -> tuple[int, str, str]:
    """`0     /   MLU370-X8    v1.1.6` -> (card, vf, name); firmware is the last word."""
    words = text.split()
    if len(words) < 4 or not words[0].isdigit():
        raise TableError("expected `Card VF Name Firmware` in the first cell", line)
    return int(words[0]), words[1], " ".join(words[2:-1])


def _driver_from(table: BoxTable, first: Line, banner_driver: str | None) -> str | None:
    column = _column(table, 0, "Driver")
    if column is None:
        return banner_driver
    words = first.cells()[column].split()
    return words[-1].lstrip("v") if words else banner_driver


def _health(table: BoxTable, first: Line) -> tuple[Health, str | None]:
    column = _column(table, 0, "Inited")
    if column is None:
        return Health.OK, None
    words = first.cells()[column].split()
    if words and words[0] == "On":
        return Health.OK, None
    state = words[0] if words else "empty"
    return Health.UNHEALTHY, f"cnmon reports the card not initialised (Inited: {state})"


def _device(table: BoxTable, block: tuple[Line, ...], banner_driver: str | None) -> Device:
    first, second = block
    card, vf, name = _card_cell(first.cells()[0], first)
    memory = mib_pair(second.cells()[1])
    if not name or memory is None:
        raise TableError("expected a card name and `used MiB/ total MiB` memory", second if name else first)
    bus_column = _column(table, 0, "Bus-Id")
    bus = sysfs_bus_id(first.cells()[bus_column]) if bus_column is not None else None
    if bus_column is not None and bus is None:
        raise TableError("bad Bus-Id", first)
    health, reason = _health(table, first)
    return Device(
        vendor="cambricon",
        model=name,
        index=card,
        file=f"/dev/cambricon_dev{card}",
        memory_mib=memory[1],
        pci_bus_id=bus,
        health=health,
        health_reason=reason,
        driver_version=_driver_from(table, first, banner_driver),
        partition_mode=None if vf == "/" else f"vf{vf}",
    )


def _parse_table(text: str) -> list[Device]:
    lines = numbered_lines(text)
    table = read_box_table(lines)
    banner = _BANNER.search(table.banner[0].text) if table.banner else None
    if banner is None:
        raise TableError(
            "not a cnmon table (no `CNMON v...` banner)", table.banner[0] if table.banner else None
        )
    if _column(table, 0, "Card") != 0 or _column(table, 1, "Memory-Usage") != 1:
        raise TableError("unknown cnmon header layout", table.header[0])
    if not table.blocks:
        raise TableError("cnmon table lists no cards", table.last_separator)
    read_trailing_processes(lines, table.end)
    devices = [_device(table, block, banner.group(2)) for block in table.blocks]
    return in_index_order(devices, "card number")


@register_vendor("cambricon")
class CambriconVendor(Vendor):
    tools = (TOOL,)
    device_glob = "/dev/cambricon_dev[0-9]*"
    traits = VendorTraits(
        visible_devices_env="MLU_VISIBLE_DEVICES",
        torch_backend="cncl",
        torch_package="torch_mlu",
        torch_device="mlu",
    )
    parse_text = _parse_table
