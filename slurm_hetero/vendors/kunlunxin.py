"""Kunlunxin (Baidu) XPU through `xpu_smi` (underscore; Intel's tool is `xpu-smi`).

Tools and versions parsed: the default `xpu_smi` text of XRE 4.x (Runtime 4.31, Driver 4.0): an
optional `Key: Value` preamble, then dash-bordered `DEVICES`, optional `VIDEO` and `PROCESSES`
tables, columns found by name (DevID, PCI Addr, Model, INODE and Memory required). The output must
end with a complete PROCESSES table, so a cut anywhere is a ParseError.

Fields: `file` is the INODE column (/dev/xpuN per compute device; a K200 card shows two),
`memory_mib` the total of `used / total MB` (MiB really: 32768 on a 32 GiB R300). State (XRE guide:
N normal, E error) gives health. An SR-IOV physical function (`<model>-PF`) has no compute left:
unhealthy, `partition_mode: sriov-pf`; virtual functions (`R200-VF-5G`) are `sriov-vf`.

Fixtures (tests/fixtures/kunlunxin/): `xpu_smi_2x-kunlunxin-r300_paddle-docs.txt` (SN masked).

Known gaps: no serial, UUID, NUMA, CPU affinity or links; `xpu_smi -m` is not parsed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_hetero.core.model import Capture, Device, Health, VendorTraits
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors._table import Line, TableError, check_row, guarded, nonblank_lines, sysfs_bus_id
from slurm_hetero.vendors.base import Vendor

TOOL = "xpu_smi"
SECTIONS = ("DEVICES", "VIDEO", "PROCESSES")
REQUIRED = ("DevID", "PCI Addr", "Model", "INODE", "Memory")

_BORDER = re.compile(r"^-{10,}$")
_PREAMBLE = re.compile(r"^([A-Za-z][A-Za-z ]*):\s*(\S.*)$")
_MEMORY = re.compile(r"^(\d+)\s*/\s*(\d+)\s*MB$")
_INODE = re.compile(r"^/dev/\S+$")
_RECOGNISE = re.compile(r"^\s*DEVICES\s*\n-+\n\|\s*DevID\s*\|", re.MULTILINE)


@dataclass(frozen=True)
class _Table:
    header: list[str]
    rows: list[tuple[Line, list[str]]]


def _split_sections(lines: list[Line]) -> tuple[dict[str, str], dict[str, list[Line]], int]:
    """Preamble `Key: Value` pairs, the lines under each section title, and the last line number."""
    preamble: dict[str, str] = {}
    sections: dict[str, list[Line]] = {}
    current: str | None = None
    for line in lines:
        title = line.text.strip()
        if title in SECTIONS:
            if title in sections:
                raise TableError(f"a second {title} section", line)
            current = title
            sections[title] = []
        elif current is not None:
            sections[current].append(line)
        elif m := _PREAMBLE.match(line.text.strip()):
            preamble[m.group(1)] = m.group(2).strip()
        else:
            raise TableError("expected 'Key: Value' or a section title before DEVICES", line)
    return preamble, sections, lines[-1].no if lines else 1


def _parse_table(name: str, lines: list[Line], after: int) -> _Table:
    """Border, header row, border, rows, closing border (same length as the opening one)."""
    if len(lines) < 4:
        raise TableError(
            f"the {name} table is incomplete (output cut short?)", lines[-1] if lines else Line(after, "")
        )
    top, head, mid = lines[:3]
    if not _BORDER.match(top.text) or not (head.is_row() and head.text.endswith("|")) or mid.text != top.text:
        raise TableError(f"expected a border, a header row and a border under {name}", head)
    header = head.cells()
    if lines[-1].text != top.text:
        raise TableError(
            f"the {name} table has no closing border like its top (output cut short?)", lines[-1]
        )
    return _Table(header, [(line, check_row(line, len(header))) for line in lines[3:-1]])


def _column(table: _Table, cells: list[str], name: str) -> str:
    return cells[table.header.index(name)] if name in table.header else ""


def _device(table: _Table, row: tuple[Line, list[str]], versions: dict[str, str]) -> Device:
    line, cells = row
    col = {name: _column(table, cells, name) for name in (*REQUIRED, "State")}
    memory, inode, pci = _MEMORY.match(col["Memory"]), col["INODE"], col["PCI Addr"]
    if not col["DevID"].isdigit() or not col["Model"] or not _INODE.match(inode) or sysfs_bus_id(pci) is None:
        raise TableError("expected DevID, PCI Addr, Model and INODE (/dev/...)", line)
    if not memory or int(memory.group(2)) <= 0:
        raise TableError(f"Memory {col['Memory']!r} is not 'used / total MB'", line)
    model = col["Model"]
    health, reason, mode = _health(model, col["State"])
    return Device(
        vendor="kunlunxin",
        model=model,
        index=int(col["DevID"]),
        file=inode,
        memory_mib=int(memory.group(2)),
        pci_bus_id=pci,
        health=health,
        health_reason=reason,
        driver_version=versions.get("Driver Version"),
        runtime_version=versions.get("Runtime Version"),
        partition_mode=mode,
    )


def _health(model: str, state: str) -> tuple[Health, str | None, str | None]:
    """(health, reason, partition_mode) from the State column and the SR-IOV model suffix."""
    if state and state != "N":
        return Health.UNHEALTHY, f"xpu_smi State {state} (N = normal, E = error)", None
    if model.upper().endswith("-PF"):
        return Health.UNHEALTHY, "SR-IOV physical function: compute is on its virtual functions", "sriov-pf"
    if "-VF" in model.upper():
        return Health.OK, None, "sriov-vf"
    return Health.OK, None, None


def _check_devids(name: str, table: _Table, devids: list[int], exact: bool) -> None:
    """VIDEO must list exactly the DEVICES' DevIDs; PROCESSES only DevIDs among them."""
    seen = []
    for line, cells in table.rows:
        value = _column(table, cells, "DevID")
        if not value.isdigit() or int(value) not in devids:
            raise TableError(f"{name} row names DevID {value!r}, not one of DEVICES {devids}", line)
        seen.append(int(value))
    if exact and seen != devids:
        where = table.rows[-1][0] if table.rows else None
        raise TableError(f"{name} lists DevIDs {seen} but DEVICES lists {devids} (output cut short?)", where)


def _parse_text(text: str) -> list[Device]:
    lines = nonblank_lines(text)
    if not _RECOGNISE.search(text):
        raise TableError(
            "not xpu_smi output (expected a DEVICES title over a table whose header starts with DevID)",
            lines[0] if lines else None,
        )
    preamble, sections, last = _split_sections(lines)
    if "DEVICES" not in sections or "PROCESSES" not in sections:
        missing = "DEVICES" if "DEVICES" not in sections else "PROCESSES"
        raise TableError(f"no {missing} section (output cut short?)", line_no=last)
    tables = {name: _parse_table(name, lines, last) for name, lines in sections.items()}
    devices_table = tables["DEVICES"]
    if absent := [c for c in REQUIRED if c not in devices_table.header]:
        raise TableError(f"the DEVICES header lacks {absent}", line_no=sections["DEVICES"][1].no)
    devices = [_device(devices_table, row, preamble) for row in devices_table.rows]
    if not devices:
        raise TableError("the DEVICES table lists no device", line_no=last)
    devids = sorted(d.index for d in devices)
    if len(set(devids)) != len(devids):
        raise TableError(f"DevIDs {devids} repeat", line_no=devices_table.rows[0][0].no)
    if "VIDEO" in tables:
        _check_devids("VIDEO", tables["VIDEO"], devids, exact=True)
    _check_devids("PROCESSES", tables["PROCESSES"], devids, exact=False)
    return devices


@register_vendor("kunlunxin")
class KunlunxinVendor(Vendor):
    tools = (TOOL,)
    device_glob = "/dev/xpu[0-9]*"
    # torch_xmlir exposes the XPU as torch.cuda and routes nccl to BKCL (baidu/vLLM-Kunlun,
    # vllm_kunlun/platforms/kunlun.py: dist_backend = "nccl")
    traits = VendorTraits(
        visible_devices_env="XPU_VISIBLE_DEVICES",
        torch_backend="nccl",
        torch_package="torch_xmlir",
        ccl_env_prefix="NCCL",
    )

    def parse(self, captures: Sequence[Capture]) -> list[Device]:
        if not captures:
            raise self.parse_error(Capture("<none>", ""), "no captures given")
        devices = [d for capture in captures for d in guarded(self, capture, _parse_text)]
        indexes = [d.index for d in devices]
        if len(set(indexes)) != len(indexes):
            raise self.parse_error(captures[-1], f"DevIDs {indexes} repeat across captures; give one output")
        return sorted(devices, key=lambda d: d.index)
