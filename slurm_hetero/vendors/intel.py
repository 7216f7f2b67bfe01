"""Intel Data Center GPU Max / Flex through `xpu-smi`, the CLI of Intel XPU Manager.

Tools and versions parsed (xpu-smi 1.x text, intel/xpumanager `doc/smi_user_guide.md` @57e44f5, plus
the later keys `SOC UUID` and `DRM Device`):
- `xpu-smi discovery`: the boxed device table (no memory size: the catalog fills it);
- `xpu-smi discovery -d N`: the same box with every property of one device (live: once per device);
- `xpu-smi topology -m`: the CPU/GPU matrix over tiles, labelled `GPU <card>/<tile>`.
Captures merge by Device ID; a matrix alone, or one whose cards differ, is an error.

Decisions:
- One Slurm device per card, never per tile: both tiles of a Max 1550 share one DRM render node,
  so cgroups can only hand out whole cards (AutoDetect=oneapi lists cards too).
- `file` is /dev/dri/renderD<128+N> (Level Zero opens the render node), assuming xpu-smi numbers
  cards in render-minor order and no other render-capable DRM device (AMD GPU, Intel iGPU) comes first.
- `XL<n>` joins two tiles with n lanes; a card's link to a peer sums its direct tile pairs;
  `XL*` (through MDF), `MDF` and PCIe add none. `cores` is the card's `CPU Affinity`, the same on
  all its tiles.

Fixtures: tests/fixtures/intel/ (from Intel's guide).

Known gaps: no health, no NUMA node; render-node numbering is assumed, not read from sysfs; SR-IOV
VFs get `partition_mode: sriov-vf`; `--dump` CSV and `-j` JSON are not parsed; with one tile per
card a matrix cut inside the last CPU list looks whole, and a table cut after a whole device group
reads as fewer cards unless a matrix comes with it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from slurm_hetero.core import proc
from slurm_hetero.core.errors import ToolError
from slurm_hetero.core.model import Capture, Device, Link, VendorTraits
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors._nvidia_smi import normalize_cpu_list
from slurm_hetero.vendors._table import Line, TableError, check_width, guarded, nonblank_lines, read_matrix
from slurm_hetero.vendors.base import Vendor

logger = logging.getLogger(__name__)

TOOL = "xpu-smi"
RENDER_MINOR_BASE = 128

_BORDER = re.compile(r"^\+-+\+-+\+$")
_ROW = re.compile(r"^\|([^|]*)\|(.*)\|$")
_TOPO_LABEL = re.compile(r"^GPU (\d+)(?:/(\d+))?$")
_TOPO_TOKEN = re.compile(r"^(S|MDF|XL\*|XL(\d+)|PIX|PXB|PHB|NODE|SYS|N/A)$")
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*(MiB|GiB)$")
_UNITS_MIB = {"MiB": 1, "GiB": 1024}


@dataclass
class _Record:
    """One xpu-smi Device ID with its `Key: Value` properties, merged over discovery captures."""

    device_id: int
    line_no: int
    props: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Topology:
    """What the matrix says per card: local CPUs and direct Xe Link lanes to each peer card."""

    cards: tuple[int, ...]
    cores: dict[int, str]
    lanes: dict[int, dict[int, int]]


# -- discovery box ---------------------------------------------------------------------------
def _parse_discovery(text: str) -> list[_Record]:
    """The boxed `xpu-smi discovery [-d N]` table: one record per group between borders."""
    lines = nonblank_lines(text)
    check_width(lines, "table")
    head = _ROW.match(lines[1].text) if len(lines) > 2 else None
    if not head or head.group(1).strip().lower() != "device id" or not _BORDER.match(lines[2].text):
        where = lines[min(1, len(lines) - 1)]
        raise TableError("expected the 'Device ID | Device Information' header between borders", where)
    if not _BORDER.match(lines[-1].text):
        raise TableError("the table has no closing border (output cut short?)", lines[-1])
    groups: list[list[Line]] = [[]]
    for line in lines[3:]:
        if _BORDER.match(line.text):
            groups.append([])
        else:
            groups[-1].append(line)
    records = [_parse_group(group) for group in groups if group]
    if not records:
        raise TableError("the discovery table lists no device", lines[-1])
    return records


def _parse_group(group: list[Line]) -> _Record:
    """Rows of one device: the first names its id, the rest carry `Key: Value` (or wrap one)."""
    record: _Record | None = None
    key = ""
    for line in group:
        row = _ROW.match(line.text)
        if not row:
            raise TableError("expected a table row", line)
        id_cell, info = row.group(1).strip(), row.group(2).strip()
        if record is None:
            if not id_cell.isdigit():
                raise TableError(f"expected a device id, found {id_cell!r}", line)
            record = _Record(int(id_cell), line.no)
        elif id_cell:
            raise TableError("a second device id without a border before it", line)
        name, sep, value = info.partition(": ")
        if sep and name.strip():
            key = name.strip()
            record.props[key] = value.strip()
        elif info and key:  # xpu-smi wraps a long value onto the next row
            record.props[key] += info
        elif info:
            raise TableError("expected 'Key: Value'", line)
    assert record is not None  # groups are never empty
    return record


# -- topology matrix -------------------------------------------------------------------------
def _split(line: str) -> list[str]:
    return [cell.strip() for cell in line.split("|")]


def _parse_topology(text: str) -> _Topology:
    """`xpu-smi topology -m`: one row per column, in the header's order, S on the diagonal."""
    lines = nonblank_lines(text)
    names, rows, end = read_matrix(lines, 0, _TOPO_LABEL.pattern, ("CPU Affinity",), "GPU", "S", _split)
    if end < len(lines):
        raise TableError("unexpected line after the matrix", lines[end])
    labels = [(int(card), int(tile or 0)) for card, _, tile in (name[4:].partition("/") for name in names)]
    cores: dict[int, str | None] = {}
    lanes: dict[int, dict[int, int]] = {}
    for row, (line, cells) in enumerate(rows):
        card = labels[row][0]
        _add_lanes(lanes.setdefault(card, {}), cells[: len(labels)], labels, row, line)
        if len(cells) > len(labels):
            try:
                cpus = normalize_cpu_list(cells[-1])
            except ValueError as e:
                raise TableError(str(e), line) from None
            if cores.setdefault(card, cpus) != cpus:
                raise TableError(
                    f"tiles of card {card} show CPU affinity {cores[card]!r} and {cpus!r}; one "
                    "card has one (output cut short?)",
                    line,
                )
    cards = tuple(sorted({card for card, _ in labels}))
    return _Topology(cards, {card: cpus for card, cpus in cores.items() if cpus is not None}, lanes)


def _add_lanes(
    peers: dict[int, int], tokens: list[str], labels: list[tuple[int, int]], row: int, where: Line
) -> None:
    """Add this tile row's direct Xe Link lanes (`XL<n>`) to its card's per-peer-card totals."""
    for col, token in enumerate(tokens):
        m = _TOPO_TOKEN.match(token)
        if not m:
            raise TableError(f"unknown relationship {token!r}", where)
        if (col == row) != (token == "S"):
            raise TableError(
                f"'S' (self) belongs on the diagonal only, found {token!r} in column {col}", where
            )
        peer = labels[col][0]
        if m.group(2) and peer != labels[row][0]:
            peers[peer] = peers.get(peer, 0) + int(m.group(2))


def _memory_mib(text: str, where: int) -> int:
    m = _MEMORY.match(text)
    mib = round(float(m.group(1)) * _UNITS_MIB[m.group(2)]) if m else 0
    if mib <= 0:
        raise TableError(f"Memory Physical Size {text!r} is not a positive '<number> MiB'", line_no=where)
    return mib


def _device(record: _Record) -> Device:
    props, index = record.props, record.device_id
    if not props.get("Device Name"):
        raise TableError(f"device {index} has no 'Device Name'", line_no=record.line_no)
    memory = props.get("Memory Physical Size")
    return Device(
        vendor="intel",
        model=props["Device Name"],
        index=index,
        file=f"/dev/dri/renderD{RENDER_MINOR_BASE + index}",
        memory_mib=_memory_mib(memory, record.line_no) if memory else None,
        uuid=props.get("UUID") or props.get("SOC UUID") or None,
        pci_bus_id=props.get("PCI BDF Address") or None,
        driver_version=props.get("Driver Version") or None,
        partition_mode="sriov-vf" if props.get("Function Type") == "virtual" else None,
    )


def _with_topology(device: Device, topo: _Topology) -> Device:
    peers = sorted(topo.lanes.get(device.index, {}).items())
    links = tuple(Link(peer=peer, kind="xelink", count=lanes) for peer, lanes in peers)
    return replace(device, cores=topo.cores.get(device.index), links=links)


@register_vendor("intel")
class IntelVendor(Vendor):
    tools = (TOOL,)
    traits = VendorTraits(
        visible_devices_env="ZE_AFFINITY_MASK",
        slurm_gpu_env="intel_gpu_env",
        torch_backend="xccl",  # built into torch >= 2.8 for XPU (older IPEX: oneCCL's `ccl`)
        torch_device="xpu",
        stack_label="oneapi",
    )
    memory_capture_hint = "xpu-smi discovery -d <id>"

    def commands(self) -> list[list[str]]:
        """The device table and the topology matrix; `probe` adds `discovery -d N` per device."""
        return [[TOOL, "discovery"], [TOOL, "topology", "-m"]]

    def probe(self) -> list[Device]:
        """The table, each listed device's detail (memory), then the matrix (failing: no cores or links)."""
        table_argv, topology_argv = self.commands()
        table = Capture(" ".join(table_argv), proc.run(table_argv))
        captures = [table]
        for record in self._discovery(table):
            argv = [TOOL, "discovery", "-d", str(record.device_id)]
            captures.append(Capture(" ".join(argv), proc.run(argv)))
        try:
            captures.append(Capture(" ".join(topology_argv), proc.run(topology_argv)))
        except ToolError as e:
            logger.warning("intel: no topology (cores, Xe Links) for this node: %s", e)
        return self.parse(captures)

    def parse(self, captures: Sequence[Capture]) -> list[Device]:
        if not captures:
            raise self.parse_error(Capture("<none>", ""), "no captures given")
        records: dict[int, tuple[Capture, _Record]] = {}
        topologies: list[tuple[Capture, _Topology]] = []
        for capture in captures:
            if self._kind(capture) == "topology":
                topologies.append((capture, guarded(self, capture, _parse_topology)))
            else:
                self._merge(records, capture)
        if not records:
            raise self.parse_error(
                topologies[0][0],
                "a topology matrix alone lists no devices; also give "
                "`xpu-smi discovery` (and `xpu-smi discovery -d N` for memory)",
            )
        devices = []
        for index in sorted(records):
            capture, record = records[index]
            try:
                devices.append(_device(record))
            except TableError as e:
                raise self.parse_error(capture, e.message, e.line_no) from None
        for capture, topo in topologies:
            if topo.cards != tuple(sorted(records)):
                raise self.parse_error(
                    capture,
                    f"the topology matrix shows cards {list(topo.cards)} but "
                    f"xpu-smi discovery lists devices {sorted(records)}",
                )
            devices = [_with_topology(d, topo) for d in devices]
        return devices

    # helpers ---------------------------------------------------------------------------
    def _kind(self, capture: Capture) -> str:
        """'discovery' or 'topology', judged from the first non-blank line; ParseError otherwise."""
        lines = nonblank_lines(capture.text)
        if not lines:
            raise self.parse_error(capture, "empty capture")
        first = lines[0]
        if _BORDER.match(first.text):
            return "discovery"
        if first.text.lstrip().startswith("GPU ") or "CPU Affinity" in first.text:
            return "topology"
        raise self.parse_error(
            capture,
            "not xpu-smi output (expected the `xpu-smi discovery` table or the `xpu-smi topology -m` matrix)",
            first.no,
            first.text,
        )

    def _discovery(self, capture: Capture) -> list[_Record]:
        if self._kind(capture) != "discovery":
            raise self.parse_error(capture, "expected the `xpu-smi discovery` table")
        return guarded(self, capture, _parse_discovery)

    def _merge(self, records: dict[int, tuple[Capture, _Record]], capture: Capture) -> None:
        """Fold one discovery capture into `records`; a property shown twice must agree."""
        for record in self._discovery(capture):
            _, merged = records.setdefault(record.device_id, (capture, record))
            for key, value in record.props.items():
                if merged.props.setdefault(key, value) != value:
                    raise self.parse_error(
                        capture,
                        f"device {record.device_id}: {key} is {value!r} here but "
                        f"{merged.props[key]!r} in another capture",
                        record.line_no,
                    )
