"""Intel Gaudi (Gaudi 2 HL-225, Gaudi 3 HL-325/HL-338, ...) through `hl-smi`.

Tools and versions parsed:
- the default `hl-smi` table (hl-1.16.0): `HL-SMI Version` / `Driver Version` banner, two rows per
  AIP, then `Compute Processes` in the same box; process rows (long ones lack the closing `|`) must
  name a listed AIP.
- `hl-smi -Q index,module_id,bus_id,name,uuid,memory.total,driver_version -f csv,noheader` (or with
  a header), joined to the table by index and checked against it.

Fields: `index` is the AIP (HLML) index; `file` is /dev/accel/accel<index>, the kernel accel node
(Linux 6.3, Gaudi software ~1.13; the device plugin mounts only /dev/accel/* since 1.14/1.15); older
drivers' /dev/hl<N> needs a site override. `tool_id` is the module id (OAM slot) from `-Q`, which
HABANA_VISIBLE_MODULES takes and which differs from the AIP index. Volatile Uncorr. ECC > 0 is
unhealthy.

Fixtures (tests/fixtures/gaudi/): `hl-smi_8x-gaudi2-hl225_hl-1.16.0_denvr.txt` (CRLF).

Known gaps: no public `-Q` capture (tested on synthetic text; a cut inside the last field of a `-Q`
capture alone goes unnoticed); the accel minor is assumed equal to the AIP index
(`/sys/class/accel/accel<N>/device/module_id` is authoritative); no links, NUMA or CPU affinity.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import replace

from slurm_hetero.core.errors import ParseError
from slurm_hetero.core.model import Capture, Device, Health, VendorTraits
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors._table import (
    BoxTable,
    Line,
    TableError,
    guarded,
    mib_pair,
    numbered_lines,
    read_box_table,
    read_closed_box,
    read_trailing_processes,
    sysfs_bus_id,
)
from slurm_hetero.vendors.base import Vendor

TOOL = "hl-smi"
QUERY_FIELDS = ("index", "module_id", "bus_id", "name", "uuid", "memory.total", "driver_version")

_PROCESS_AIP = re.compile(r"^\|\s*(\d+)\s")
_MIB = re.compile(r"(\d+)\s*(?:MiB)?")


def _habanalabs_nodes() -> bool:
    """Gaudi device nodes: /dev/accel/accelN bound to the habanalabs driver (the accel class is
    shared with other drivers), or the legacy /dev/hlN."""
    drivers = glob.glob("/sys/class/accel/accel*/device/driver")
    return any(os.path.basename(os.path.realpath(d)) == "habanalabs" for d in drivers) or bool(
        glob.glob("/dev/hl[0-9]*")
    )


def _banner_value(table: BoxTable, key: str) -> str | None:
    for line in table.banner:
        if m := re.search(rf"{key}:\s*(\S+)", line.text):
            return m.group(1)
    return None


def _device(block: tuple[Line, ...], driver: str | None) -> Device:
    first, second = block
    words = first.cells()[0].split()
    bus = sysfs_bus_id(first.cells()[1].split()[0]) if first.cells()[1] else None
    memory = mib_pair(second.cells()[1])
    if len(words) < 3 or not words[0].isdigit() or not bus or not memory:
        raise TableError("expected `AIP Name Persistence-M | Bus-Id | ECC` and a Memory-Usage cell", first)
    ecc = first.cells()[2]
    bad = ecc.isdigit() and int(ecc) > 0
    return Device(
        vendor="gaudi",
        model=" ".join(words[1:-1]),
        index=int(words[0]),
        file=f"/dev/accel/accel{words[0]}",
        memory_mib=memory[1],
        pci_bus_id=bus,
        driver_version=driver,
        health=Health.UNHEALTHY if bad else Health.OK,
        health_reason=f"hl-smi reports {ecc} volatile uncorrectable ECC errors" if bad else None,
    )


def _parse_table(text: str) -> list[Device]:
    lines = numbered_lines(text)
    table = read_box_table(lines)
    driver = _banner_value(table, "Driver Version")
    if _banner_value(table, "HL-SMI Version") is None or not table.header[0].cells()[0].startswith("AIP"):
        raise TableError(
            "not an hl-smi table (no `HL-SMI Version` banner)", table.banner[0] if table.banner else None
        )
    if not table.blocks:
        raise TableError("hl-smi table lists no AIPs", table.last_separator)
    devices = [_device(block, driver) for block in table.blocks]
    if table.last_separator.text.startswith("+"):
        read_trailing_processes(lines, table.end)
    elif table.end < len(lines) and "Processes" in lines[table.end].text:
        end, listed = read_closed_box(lines, table.end, "Compute Processes table"), {d.index for d in devices}
        for line in lines[table.end : end]:
            m = _PROCESS_AIP.match(line.text)
            if m and int(m.group(1)) not in listed:
                raise TableError(f"process row names AIP {m.group(1)}, which the table does not list", line)
    else:
        raise TableError("table not closed after the last AIP (output cut short?)", table.last_separator)
    return devices


def _query_rows(text: str) -> list[tuple[Line, dict[str, str]]]:
    lines = [line for line in numbered_lines(text) if line.text.strip()]
    names = list(QUERY_FIELDS)
    if lines and lines[0].text.split(",")[0].strip().lower() == "index":
        names = [field.strip().split(" [")[0].lower() for field in lines[0].text.split(",")]
        lines = lines[1:]
    if "index" not in names or "module_id" not in names or not lines:
        raise TableError("not hl-smi output: neither its table nor `hl-smi -Q` CSV with index and module_id")
    rows = []
    for line in lines:
        fields = [field.strip() for field in line.text.split(",")]
        if len(fields) != len(names) or not fields[names.index("index")].isdigit():
            raise TableError(
                f"expected the table or {len(names)} CSV fields starting with an index (output cut short?)",
                line,
            )
        rows.append((line, dict(zip(names, fields))))
    return rows


def _query_device(line: Line, row: dict[str, str]) -> Device:
    bus = sysfs_bus_id(row["bus_id"]) if row.get("bus_id") else None
    memory = _MIB.fullmatch(row.get("memory.total", ""))
    if not row["module_id"].isdigit() or (row.get("bus_id") and not bus) or not row.get("name") or not memory:
        raise TableError("bad module_id, bus_id, name or memory.total in the hl-smi -Q row", line)
    uuid = row.get("uuid")
    return Device(
        vendor="gaudi",
        model=row["name"],
        index=int(row["index"]),
        file=f"/dev/accel/accel{row['index']}",
        memory_mib=int(memory.group(1)),
        pci_bus_id=bus,
        tool_id=row["module_id"],
        uuid=uuid if uuid and uuid != "N/A" else None,
        driver_version=row.get("driver_version") or None,
    )


def _parse_query(text: str) -> list[tuple[Line, Device]]:
    return [(line, _query_device(line, row)) for line, row in _query_rows(text)]


def _join(table: list[Device], query: list[tuple[Line, Device]]) -> list[Device]:
    """Table devices with module id and uuid from the -Q rows; both must describe the same AIPs."""
    by_index = {device.index: (line, device) for line, device in query}
    if len(by_index) != len(query) or set(by_index) != {d.index for d in table}:
        raise TableError(f"hl-smi -Q lists AIPs {sorted(by_index)}, the table {[d.index for d in table]}")
    joined = []
    for device in table:
        line, row = by_index[device.index]
        same_bus = row.pci_bus_id in (None, device.pci_bus_id)
        same_driver = row.driver_version in (None, device.driver_version)
        if not (same_bus and same_driver):
            raise TableError(f"hl-smi -Q row disagrees with the table for AIP {device.index}", line)
        joined.append(replace(device, tool_id=row.tool_id, uuid=row.uuid))
    return joined


def _is_table(text: str) -> bool:
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return "HL-SMI Version" in text or first.startswith(("+", "|"))


@register_vendor("gaudi")
class GaudiVendor(Vendor):
    tools = (TOOL,)
    traits = VendorTraits(
        visible_devices_env="HABANA_VISIBLE_MODULES",
        visible_by_tool_id=True,  # module ids; the AIP index only when no -Q capture gave them
        torch_backend="hccl",
        torch_package="habana_frameworks.torch.distributed.hccl",  # registers hccl (and, by its parent, hpu)
        torch_device="hpu",
    )

    def affinity(self) -> int:
        if self.unavailable_reason:
            return -1
        return 1 if shutil.which(TOOL) or _habanalabs_nodes() else 0

    def commands(self) -> list[list[str]]:
        return [[TOOL], [TOOL, "-Q", ",".join(QUERY_FIELDS), "-f", "csv,noheader"]]

    def parse(self, captures: Sequence[Capture]) -> list[Device]:
        tables = [(c, guarded(self, c, _parse_table)) for c in captures if _is_table(c.text)]
        queries = [(c, guarded(self, c, _parse_query)) for c in captures if not _is_table(c.text)]
        if not captures or len(tables) > 1 or len(queries) > 1:
            source = captures[-1].source if captures else "<no capture>"
            raise ParseError(self.name, TOOL, "give one hl-smi table and/or one hl-smi -Q capture", source)
        if not queries:
            return tables[0][1]
        capture, query = queries[0]
        if not tables:
            return sorted((device for _, device in query), key=lambda d: d.index)
        table = tables[0][1]
        return guarded(self, capture, lambda _text: _join(table, query))
