"""Huawei Ascend NPUs through `npu-smi` (CANN driver / HDK).

Tools and versions parsed:
- `npu-smi info` of drivers 23.0.0, 23.0.rc3, 23.0.2.1, 24.1.rc1 and 25.2.0. The second header row
  names the chip ids: `Chip` (910B), `Chip Device` (310P, 310B) or `Chip Phy-ID` (25.x, two dies per
  NPU); usage columns `Memory-Usage(MB)` and, on HBM parts, `HBM-Usage(MB)`.
- `npu-smi info -t topo`: the NPU matrix, optional `CPU Affinity` column, legend; "This device does
  not support querying topo." yields no links.

Numbering (one Slurm device per chip): `index` is the logical id ASCEND_RT_VISIBLE_DEVICES takes
(CANN env reference): the `Device` column, else the chip's position (NPU ids need not be contiguous:
0 and 64 on one 310P3 host). `file` is /dev/davinciN, N the physical id (`npu-smi info -t
phyid-remap`): `Phy-ID`, else `Device` (logical = physical on the host), else for one chip per NPU
the NPU id; a multi-chip NPU without either column is a ParseError. `tool_id` is `npu<NPU>-chip<Chip>`.

Fields: `memory_mib` is the HBM total where there is an HBM column (DDR on 910-class chips is the
control CPU's), else the `Memory-Usage` total (310P/310B LPDDR); 0 leaves it to the catalog. Health
other than OK is unhealthy. HCCS cells give `Link(kind="hccs")`, `CPU Affinity` gives `cores`;
matrix labels NPU<k> are logical ids, or NPU ids.

Fixtures: tests/fixtures/ascend/ (provenance in each .source).

Known gaps: `npu-smi info -m` (authoritative logical ids, e.g. in containers) is not parsed; multi-
die and 310P topo matrices are unseen; the Ascend 950 `NPU ID | Name` layout is not recognised.
`npu-smi info` always ends with its process table, so a capture without it is refused as cut
unless a topo capture comes with it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from slurm_hetero.core import proc
from slurm_hetero.core.errors import ParseError, ToolError
from slurm_hetero.core.model import Capture, Device, Health, Link, VendorTraits
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors._nvidia_smi import normalize_cpu_list
from slurm_hetero.vendors._table import (
    Line,
    TableError,
    guarded,
    nonblank_lines,
    read_legend,
    read_matrix,
    sysfs_bus_id,
)
from slurm_hetero.vendors.base import Vendor

logger = logging.getLogger(__name__)

VENDOR = "ascend"
INFO = "npu-smi info"
TOPO = "npu-smi info -t topo"
INFO_ARGV = ["npu-smi", "info"]
TOPO_ARGV = ["npu-smi", "info", "-t", "topo"]

_BORDER = re.compile(r"\+[-=+]*\+")
_DEVICE_HEADER = re.compile(r"\|\s*NPU\s+Name\s*\|\s*Health\s*\|")
_VERSION = re.compile(r"\bVersion:\s*(\S+)")
_NAME_CELL = re.compile(r"(\d+)\s+(\S.*)")
_HEALTH = re.compile(r"[A-Za-z][A-Za-z_-]*")
_USAGE = re.compile(r"(\d+)\s*/\s*(\d+)")
_USAGE_COLUMN = re.compile(r"([A-Za-z]+)-Usage\(MB\)")
_NPU_LABEL = re.compile(r"NPU(\d+)")
_UNSUPPORTED = "This device does not support"


@dataclass(frozen=True)
class _Line(Line):
    """One non-blank line of a table: a border ('=' or '-') or a complete row split into parts."""

    kind: str = "row"  # "=", "-" or "row"
    parts: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Chip:
    """One chip row pair of the `npu-smi info` device table."""

    npu_id: int
    chip_id: int
    column_id: int | None  # the Device or Phy-ID column
    name: str
    health: str
    bus_id: str | None
    memory_mib: int | None


@dataclass(frozen=True)
class _Table:
    numbered: list[tuple[int, int, _Chip]]  # (logical index, davinci number, chip) in index order
    driver_version: str | None
    last: _Line
    complete: bool = True  # the process table npu-smi always prints follows the device table


@dataclass(frozen=True)
class _Topo:
    labels: tuple[int, ...]
    hccs: dict[int, tuple[int, ...]]
    affinity: dict[int, str | None]


# npu-smi info --------------------------------------------------------------------------------------


def _table_lines(text: str) -> list[_Line]:
    """Every non-blank line as a border or a complete row; anything else means a cut or foreign text."""
    lines = []
    for line in nonblank_lines(text):
        no, text = line.no, line.text
        if _BORDER.fullmatch(text):
            lines.append(_Line(no, text, "=" if "=" in text else "-"))
        elif len(text) > 1 and text[0] == "|" and text[-1] == "|":
            lines.append(_Line(no, text, "row", tuple(c.strip() for c in text[1:-1].split("|"))))
        else:
            raise TableError("incomplete table line (truncated capture?)", line)
    if lines and lines[-1].kind == "row":
        raise TableError("table has no closing border (truncated capture?)", lines[-1])
    return lines


def _header(lines: list[_Line]) -> tuple[int, str, list[str], str | None]:
    """Find the two header rows: (first record position, id column, usage columns, driver version)."""
    pos = next((i for i, line in enumerate(lines) if _DEVICE_HEADER.match(line.text)), None)
    if pos is None:
        raise TableError("no device table header (NPU Name | Health)")
    version = None
    for line in lines[:pos]:
        if line.kind != "row":
            continue
        if not (match := _VERSION.search(line.text)):
            raise TableError("unexpected row before the device table header", line)
        version = match.group(1)
    second = lines[pos + 1] if pos + 1 < len(lines) else lines[pos]
    if second.kind != "row" or len(second.parts) != 3 or not second.parts[0].startswith("Chip"):
        raise TableError("second header row (Chip ... | Bus-Id | ...) missing", second)
    id_column = second.parts[0].split()[1:]
    if id_column not in ([], ["Device"], ["Phy-ID"]):
        raise TableError(f"unknown chip id column {' '.join(id_column)!r}", second)
    usage = _USAGE_COLUMN.findall(second.parts[2])
    if "Memory" not in usage or pos + 2 >= len(lines) or lines[pos + 2].kind != "=":
        raise TableError("header has no Memory-Usage(MB) column or no '+===' border", second)
    return pos + 3, "".join(id_column), usage, version


def _chip(rows: tuple[_Line, _Line], id_column: str, usage: list[str]) -> _Chip:
    """Parse one name row + chip row pair."""
    name_row, chip_row = rows
    if len(name_row.parts) != 3 or not (named := _NAME_CELL.fullmatch(name_row.parts[0])):
        raise TableError("NPU row is not 'NPU Name | Health | ...'", name_row)
    if not _HEALTH.fullmatch(name_row.parts[1]):
        raise TableError("Health cell is empty or malformed", name_row)
    ids = chip_row.parts[0].split() if len(chip_row.parts) == 3 else []
    if len(ids) != (2 if id_column else 1) or not all(i.isdigit() for i in ids):
        raise TableError(f"chip row does not match header 'Chip {id_column}'".rstrip(), chip_row)
    bus = chip_row.parts[1]
    if bus != "NA" and sysfs_bus_id(bus) is None:
        raise TableError(f"bad Bus-Id {bus!r}", chip_row)
    pairs = _USAGE.findall(chip_row.parts[2])
    if len(pairs) != len(usage):
        raise TableError(f"expected {len(usage)} used/total pairs ({', '.join(usage)})", chip_row)
    total = int(pairs[usage.index("HBM" if "HBM" in usage else "Memory")][1])
    return _Chip(
        npu_id=int(named.group(1)),
        chip_id=int(ids[0]),
        column_id=int(ids[1]) if id_column else None,
        name=named.group(2).strip(),
        health=name_row.parts[1],
        bus_id=None if bus == "NA" else bus,
        memory_mib=total or None,
    )


def _is_record(line: _Line | None) -> bool:
    return line is not None and line.kind == "row" and line.parts[0][:1].isdigit()


def _records(lines: list[_Line], pos: int, id_column: str, usage: list[str]) -> tuple[list[_Chip], int]:
    """Chip records from `pos` until the device table ends; returns them and the position after."""
    chips: list[_Chip] = []
    while _is_record(lines[pos] if pos < len(lines) else None):
        pair = lines[pos : pos + 3]
        if len(pair) < 3 or pair[1].kind != "row" or pair[2].kind == "row":
            raise TableError("half NPU record: name row without chip row and border", lines[pos])
        chip = _chip((pair[0], pair[1]), id_column, usage)
        chips.append(chip)
        pos += 3
        # after a '+---' chip separator the same NPU goes on with its next chip
        same_npu = (
            pos < len(lines) and _is_record(lines[pos]) and lines[pos].parts[0].split()[0] == str(chip.npu_id)
        )
        if pair[2].kind == "-" and not same_npu:
            raise TableError(f"NPU {chip.npu_id} ends after a chip separator (truncated?)", pair[2])
    if not chips:
        raise TableError("device table has no NPU rows", lines[pos - 1])
    return chips, pos


def _check_tail(tail: list[_Line]) -> bool:
    """What follows the device table must be a process table (or nothing: then False)."""
    rows = [line for line in tail if line.kind == "row"]
    if not rows:
        return False
    header = rows[0]
    if len(header.parts) < 2 or header.parts[1] != "Process id":
        raise TableError("unexpected row after the device table", header)
    for row in rows[1:]:
        message = len(row.parts) == 1 and re.search(r"[A-Za-z]", row.parts[0])
        if len(row.parts) != len(header.parts) and not message:
            raise TableError("process row does not match its header (truncated?)", row)
    return True


def _parse_info(text: str) -> _Table:
    """The device table of `npu-smi info`, its chips numbered."""
    lines = _table_lines(text)
    pos, id_column, usage, version = _header(lines)
    chips, pos = _records(lines, pos, id_column, usage)
    complete = _check_tail(lines[pos:])
    return _Table(_numbers(chips, id_column), version, lines[-1], complete)


# npu-smi info -t topo ------------------------------------------------------------------------------


def _parse_topo(text: str) -> _Topo:
    """The NPU matrix of `npu-smi info -t topo`, and its Legend when the capture goes on."""
    lines = nonblank_lines(text)
    if lines[0].text.strip().startswith(_UNSUPPORTED):
        return _Topo((), {}, {})
    names, rows, end = read_matrix(lines, 0, r"NPU\d+", ("CPU Affinity",), "NPU")
    labels = tuple(int(name[3:]) for name in names)
    hccs: dict[int, tuple[int, ...]] = {}
    affinity: dict[int, str | None] = {}
    for label, (line, cells) in zip(labels, rows):
        hccs[label] = tuple(peer for peer, cell in zip(labels, cells) if cell == "HCCS")
        cpus = cells[-1] if len(cells) > len(labels) else "NA"
        try:
            affinity[label] = None if cpus in ("NA", "-") else normalize_cpu_list(cpus)
        except ValueError as e:
            raise TableError(str(e), line) from None
    if end < len(lines):
        codes, end = read_legend(lines, end, "Legend:")
        if end < len(lines):
            raise TableError("legend line is not `CODE = meaning`", lines[end])
        if missing := sorted({code for _, cells in rows for code in cells[: len(labels)]} - codes):
            raise TableError(f"the Legend does not explain {missing} (output cut short?)", lines[-1])
    return _Topo(labels, hccs, affinity)


# devices ---------------------------------------------------------------------------------------------


def _numbers(chips: list[_Chip], id_column: str) -> list[tuple[int, int, _Chip]]:
    """(logical index, davinci number, chip) per chip, in index order; see the module docstring."""
    out: list[tuple[int, int, _Chip]] = []
    for position, chip in enumerate(chips):
        column = chip.column_id if chip.column_id is not None else chip.npu_id
        if id_column == "Device":
            out.append((column, column, chip))
        else:  # Phy-ID, or the NPU id of a one-chip NPU
            out.append((position, column, chip))
    npu_ids = [c.npu_id for c in chips]
    if not id_column and len(set(npu_ids)) != len(npu_ids):
        message = "NPUs with several chips but no Device/Phy-ID column: /dev/davinci numbers unknown"
        raise TableError(message)
    for what, values in (("logical id", [e[0] for e in out]), ("/dev/davinci number", [e[1] for e in out])):
        if len(set(values)) != len(values):
            raise TableError(f"duplicate {what} in {sorted(values)}")
    return sorted(out, key=lambda entry: entry[0])


def _device(index: int, davinci: int, chip: _Chip, driver: str | None) -> Device:
    healthy = chip.health == "OK"
    return Device(
        vendor=VENDOR,
        model=chip.name,
        index=index,
        file=f"/dev/davinci{davinci}",
        memory_mib=chip.memory_mib,
        pci_bus_id=chip.bus_id,
        tool_id=f"npu{chip.npu_id}-chip{chip.chip_id}",
        health=Health.OK if healthy else Health.UNHEALTHY,
        health_reason=None if healthy else f"npu-smi Health={chip.health}",
        driver_version=driver,
    )


def _label_map(topo: _Topo, numbered: list[tuple[int, int, _Chip]]) -> dict[int, int]:
    """Topology label k -> device index: logical ids first, NPU ids of one-chip NPUs second."""
    labels = set(topo.labels)
    if labels == {index for index, _, _ in numbered}:
        return {label: label for label in labels}
    by_npu = {chip.npu_id: index for index, _, chip in numbered}
    if len(by_npu) == len(numbered) and labels == set(by_npu):
        return by_npu
    listed = f"{len(labels)} NPUs (NPU{min(labels)}..NPU{max(labels)})"
    message = (
        f"matrix lists {listed}, matching neither the logical ids nor the NPU ids of `npu-smi info` "
        f"({len(numbered)} chips; truncated, or captured on another node?)"
    )
    raise TableError(message)


def _with_topology(devices: list[Device], topo: _Topo, label_map: dict[int, int]) -> list[Device]:
    by_index = {label_map[label]: label for label in topo.labels}
    out = []
    for device in devices:
        label = by_index[device.index]
        links = tuple(Link(peer=label_map[p], kind="hccs") for p in topo.hccs[label])
        links = tuple(sorted(links, key=lambda link: link.peer))
        out.append(replace(device, links=links, cores=topo.affinity[label]))
    return out


def _classify(text: str) -> str:
    """'info' or 'topo' by content; TableError for anything else."""
    lines = nonblank_lines(text)
    if not lines:
        raise TableError("empty capture")
    if any(_DEVICE_HEADER.match(line.text) for line in lines):
        return "info"
    first = lines[0].text.split()
    if (first and _NPU_LABEL.fullmatch(first[0])) or lines[0].text.strip().startswith(_UNSUPPORTED):
        return "topo"
    raise TableError("neither `npu-smi info` nor `npu-smi info -t topo` output", lines[0])


@register_vendor("ascend")
class AscendVendor(Vendor):
    tools = ("npu-smi",)
    device_glob = "/dev/davinci[0-9]*"
    traits = VendorTraits(
        visible_devices_env="ASCEND_RT_VISIBLE_DEVICES",
        torch_backend="hccl",
        torch_package="torch_npu",
        torch_device="npu",
        stack_label="cann",
    )
    memory_capture_hint = "npu-smi info -t memory -i <NPU id>"

    def commands(self) -> list[list[str]]:
        """The device table (with memory for every chip) and the topology matrix."""
        return [list(INFO_ARGV), list(TOPO_ARGV)]

    def probe(self) -> list[Device]:
        """Live discovery; a failing topology query only costs links and CPU affinity."""
        captures = [Capture(INFO, proc.run(INFO_ARGV))]
        try:
            captures.append(Capture(TOPO, proc.run(TOPO_ARGV)))
        except ToolError as e:
            logger.warning("%s failed, devices get no HCCS links or CPU affinity: %s", TOPO, e)
        return self.parse(captures)

    def parse(self, captures: Sequence[Capture]) -> list[Device]:
        """Devices from one `npu-smi info` capture, plus links and cores from an optional topo capture."""
        if not captures:
            raise ParseError(VENDOR, INFO, "no captures: capture `npu-smi info`", "<none>")
        found: dict[str, Capture] = {}
        for capture in captures:
            kind = guarded(self, capture, _classify)
            if kind in found:
                raise self.parse_error(capture, f"two {kind} captures ({found[kind].source} and this one)")
            found[kind] = capture
        if "info" not in found:
            message = "the topology matrix alone has no devices: also capture `npu-smi info`"
            raise self.parse_error(found["topo"], message, tool=TOPO)
        info = found["info"]
        table = guarded(self, info, _parse_info, INFO)
        numbered = table.numbered
        devices = [_device(index, davinci, chip, table.driver_version) for index, davinci, chip in numbered]
        if "topo" not in found:
            if not table.complete:
                raise self.parse_error(
                    info,
                    "ends after the device table, without the process table npu-smi always prints: "
                    "the capture looks cut; capture the whole output, or add `npu-smi info -t topo`",
                    table.last.no,
                    table.last.text,
                    INFO,
                )
            return devices
        topo = guarded(self, found["topo"], _parse_topo, TOPO)
        if not topo.labels:
            return devices
        label_map = guarded(self, found["topo"], lambda _: _label_map(topo, numbered), TOPO)
        return _with_topology(devices, topo, label_map)
