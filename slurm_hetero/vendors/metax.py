"""MetaX GPUs (C500, C550, MXC500/MXC550 in older tools, N260, ...) through `mx-smi`.

Tools and versions parsed:
- the default `mx-smi` output of 2.1.6, 2.2.4 and 2.2.9 (drivers 2.5.014, 2.15.9, 3.4.4): the
  `MetaX System Management Interface Log` header, `Attached GPUs : <N>`, a box table (`MX-SMI <v>
  Kernel Mode Driver Version` and `MACA Version` banner, two rows per GPU), an optional `Process:`
  box and `End of Log`. Header layouts differ by version, so columns are found by header words.
- `mx-smi topo -m` / `-n` (2.2.9): the `Device link type matrix` (GPU0.., NIC0.., `Node Affinity`,
  `CPU Affinity`), then `Legend:` (and `NIC Legend:`); only with a default table.

Fields: `index` is the GPU number (not the Board number); `runtime_version` the MACA Version (unset
when `unknown`, as in a container without the SDK). A GPU-State other than `Available` is unhealthy
(mxExporter points at `mx-smi --show-unavailable-reason`). `MX` cells give `Link(kind="metaxlink")`.
`Attached GPUs` is a device count: fewer GPUs, or a Legend without its final `NA`, is a cut capture.

`file` is /dev/dri/card<index> (containers get `--device=/dev/dri --device=/dev/mxcd`; `/dev/dri/card0`
alone shows only GPU 0); /dev/mxcd, the shared control node, is the `device_glob`. MetaX's torch reads
MACA_VISIBLE_DEVICES before CUDA_VISIBLE_DEVICES; Slurm exports only the latter.

Fixtures: tests/fixtures/metax/ (provenance in each .source).

Known gaps: the card minor is assumed equal to the GPU index (a BMC's VGA can take card0: check
/sys/bus/pci/devices/<pci_bus_id>/drm); render nodes and /dev/mxcd are not fenced by gres.conf; no
capture of a GPU that is not `Available`; the N260's 2.2.8 layout is unverified; sGPU-M, `mx-smi -L`
and `--show-memory` are not read; MetaXLink lane counts are unknown (count=1).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from slurm_hetero.core.model import Capture, Device, Health, Link, VendorTraits
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors._nvidia_smi import normalize_cpu_list
from slurm_hetero.vendors._table import (
    TOP_BORDER,
    BoxTable,
    Line,
    TableError,
    guarded,
    in_index_order,
    numbered_lines,
    read_box_table,
    read_closed_box,
    read_legend,
    read_matrix,
    skip_blank,
    sysfs_bus_id,
)
from slurm_hetero.vendors.base import Vendor

TOOL = "mx-smi"
TOPO_TOOL = "mx-smi topo"  # `-m` (what commands() runs) or `-n`, in ParseErrors
MATRIX_TITLE = "Device link type matrix"

_VERSION_LINE = re.compile(r"mx-smi\s+version:\s*\S+")
_LOG_HEADER = re.compile(r"=+ MetaX System Management Interface Log =+")
_TIMESTAMP = re.compile(r"Timestamp\s+:\s*\S.*")
_ATTACHED = re.compile(r"Attached GPUs\s+:\s*(\d+)")
_DRIVER = re.compile(r"MX-SMI\s+\S+\s+Kernel Mode Driver Version:\s*(\S+)")
_MACA = re.compile(r"MACA Version:\s*(\S+)\s+BIOS Version:\s*\S+")
_MEMORY = re.compile(r"(\d+)/(\d+) MiB")
_NIC_ENTRY = re.compile(r"\s+(NIC\d+): \S+")
_AFFINITY = ("Node Affinity", "CPU Affinity")
_UNKNOWN = ("unknown", "N/A")


# -- the log header every mx-smi command prints ------------------------------------------------------
def _preamble(lines: list[Line]) -> tuple[int, int]:
    """`Attached GPUs` and the index after it, past version line, log header (may be indented), Timestamp."""
    i = skip_blank(lines, 0)
    if i < len(lines) and _VERSION_LINE.fullmatch(lines[i].text):
        i = skip_blank(lines, i + 1)
    if i == len(lines) or not _LOG_HEADER.fullmatch(lines[i].text.strip()):
        where = lines[i] if i < len(lines) else None
        raise TableError("not mx-smi output (no `MetaX System Management Interface Log` header)", where)
    if i + 1 == len(lines) or not _TIMESTAMP.fullmatch(lines[i + 1].text):
        raise TableError("expected `Timestamp : ...` under the log header", lines[min(i + 1, len(lines) - 1)])
    i = skip_blank(lines, i + 2)
    attached = _ATTACHED.fullmatch(lines[i].text) if i < len(lines) else None
    if attached is None or int(attached.group(1)) == 0:
        raise TableError("expected `Attached GPUs : <n>` (output cut short?)", lines[min(i, len(lines) - 1)])
    return int(attached.group(1)), i + 1


# -- the default table ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Layout:
    """Where each field sits: (header row, column) pairs found by header words."""

    index: tuple[int, int]
    name: tuple[int, int]
    name_words: tuple[int, int]  # value words to drop before and after the name
    bus: tuple[int, int]
    memory: tuple[int, int]
    state: tuple[int, int] | None


def _find(table: BoxTable, word: str, *, leading: bool = False) -> tuple[int, int] | None:
    """(row, column) of the first header cell with `word` among its words (as the first if `leading`)."""
    for row, line in enumerate(table.header):
        for column, cell in enumerate(line.cells()):
            words = cell.split()
            if words and (words[0] == word if leading else word in words):
                return row, column
    return None


def _layout(table: BoxTable) -> _Layout:
    """2.1.x/2.2.4: `GPU NAME` is one cell, the GPU number its first word; 2.2.9: `Board Name` and
    `GPU Persist-M` are two cells, the board number leads the name. Extra words (`Persistence-M`)
    after NAME in a header cell are dropped from the value as well."""
    if len(table.header) != 2:
        raise TableError(f"expected two header rows, got {len(table.header)}", table.header[0])
    index, name = _find(table, "GPU", leading=True), _find(table, "NAME") or _find(table, "Name")
    bus, memory = _find(table, "Bus-id"), _find(table, "Memory-Usage")
    if index is None or name is None or bus is None or memory is None:
        raise TableError(
            "unknown mx-smi header (no GPU, NAME, Bus-id or Memory-Usage column)", table.header[0]
        )
    words = table.header[name[0]].cells()[name[1]].split()
    position = next(i for i, word in enumerate(words) if word.upper() == "NAME")
    return _Layout(index, name, (position, len(words) - position - 1), bus, memory, _find(table, "GPU-State"))


def _cell(block: tuple[Line, ...], where: tuple[int, int]) -> str:
    return block[where[0]].cells()[where[1]]


def _health(block: tuple[Line, ...], layout: _Layout) -> tuple[Health, str | None]:
    state = _cell(block, layout.state) if layout.state else "Available"
    if state == "Available":
        return Health.OK, None
    hint = "see `mx-smi -L` and `mx-smi --show-unavailable-reason`"
    return Health.UNHEALTHY, f"mx-smi reports GPU-State {state or 'empty'!r}; {hint}"


def _device(block: tuple[Line, ...], layout: _Layout, driver: str, maca: str | None) -> Device:
    ident = _cell(block, layout.index).split()
    before, after = layout.name_words
    name = " ".join(_cell(block, layout.name).split()[before : -after or None])
    bus = sysfs_bus_id(_cell(block, layout.bus))
    if not (ident and ident[0].isdigit() and name and bus):
        raise TableError("expected a GPU number, a name and a Bus-id in the first row", block[0])
    health, reason = _health(block, layout)
    memory = _MEMORY.fullmatch(_cell(block, layout.memory))
    if memory is None and health == Health.OK:
        raise TableError("expected Memory-Usage as `<used>/<total> MiB`", block[layout.memory[0]])
    index = int(ident[0])
    return Device(
        vendor="metax",
        model=name,
        index=index,
        file=f"/dev/dri/card{index}",
        memory_mib=int(memory.group(2)) if memory else None,
        pci_bus_id=bus,
        health=health,
        health_reason=reason,
        driver_version=driver,
        runtime_version=maca,
    )


def _read_trailer(lines: list[Line], i: int) -> None:
    """After the device table: nothing, or a blank line, a complete `Process:` box, `End of Log`."""
    i = skip_blank(lines, i)
    if i < len(lines) and TOP_BORDER.match(lines[i].text):
        if i + 1 == len(lines) or not lines[i + 1].text.startswith("| Process:"):
            raise TableError("expected the `Process:` table after the device table", lines[i])
        i = skip_blank(lines, read_closed_box(lines, i + 1, "`Process:` table"))
    if i < len(lines) and lines[i].text.strip() == "End of Log":
        i = skip_blank(lines, i + 1)
    if i < len(lines):
        raise TableError("unexpected line after the device table", lines[i])


def _banner(table: BoxTable) -> tuple[str, str | None]:
    texts = [line.cells()[0] for line in table.banner]
    driver = _DRIVER.search(texts[0]) if texts else None
    maca = _MACA.search(texts[1]) if len(texts) > 1 else None
    if driver is None or maca is None:
        where = table.banner[0] if table.banner else None
        raise TableError(
            "expected the `MX-SMI ... Kernel Mode Driver Version` and `MACA Version` banner", where
        )
    return driver.group(1), None if maca.group(1) in _UNKNOWN else maca.group(1)


def _parse_table(text: str) -> list[Device]:
    lines = numbered_lines(text)
    attached, i = _preamble(lines)
    if i == len(lines) or not TOP_BORDER.match(lines[i].text):
        raise TableError("expected the device table under `Attached GPUs`", lines[min(i, len(lines) - 1)])
    table = read_box_table(lines, i)
    driver, maca = _banner(table)
    layout = _layout(table)
    if len(table.blocks) != attached or not table.last_separator.text.startswith("+"):
        raise TableError(
            f"`Attached GPUs : {attached}` but the table lists {len(table.blocks)} (output cut short?)",
            table.last_separator,
        )
    _read_trailer(lines, table.end)
    devices = [_device(block, layout, driver, maca) for block in table.blocks]
    return in_index_order(devices, "GPU number")


# -- mx-smi topo -m / -n ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _TopoGpu:
    metaxlinks: tuple[int, ...]
    numa_node: int | None
    cores: str | None


def _affinity(words: list[str], line: Line) -> tuple[int | None, str | None]:
    node, cpus = words
    if not (node.isdigit() or node == "N/A"):
        raise TableError(f"Node Affinity {node!r} is not a NUMA node", line)
    try:
        return (int(node) if node.isdigit() else None), normalize_cpu_list(cpus)
    except ValueError as e:
        raise TableError(str(e), line) from None


def _parse_topology(text: str) -> list[_TopoGpu]:
    lines = numbered_lines(text)
    gpus, i = _preamble(lines)
    if i + 1 >= len(lines) or lines[i].text.strip() != MATRIX_TITLE:
        raise TableError(f"expected `{MATRIX_TITLE}` under `Attached GPUs`", lines[min(i, len(lines) - 1)])
    columns, rows, end = read_matrix(lines, i + 1, r"(GPU|NIC)\d+", _AFFINITY, "GPU")
    nics = len(columns) - gpus
    if nics < 0 or columns != [f"GPU{k}" for k in range(gpus)] + [f"NIC{k}" for k in range(nics)]:
        raise TableError(
            f"expected the columns GPU0..GPU{gpus - 1} (then NIC0..) of `Attached GPUs`", lines[i + 1]
        )
    codes, i = read_legend(lines, end, "Legend:")
    used = {code for _, cells in rows for code in cells[: len(columns)]}
    if "NA" not in codes or not used <= codes:
        missing = sorted(used - codes) or ["NA"]
        raise TableError(f"the Legend does not explain {missing} (output cut short?)", lines[i - 1])
    if nics:
        names, i = read_legend(lines, i, "NIC Legend:", _NIC_ENTRY)
        if names != set(columns[gpus:]):
            raise TableError("the NIC Legend does not name every NIC (output cut short?)", lines[i - 1])
    if skip_blank(lines, i) < len(lines):
        raise TableError("unexpected line after the topology legend", lines[skip_blank(lines, i)])
    topology = []
    for line, cells in rows[:gpus]:
        numa, cores = _affinity(cells[-2:], line) if len(cells) > len(columns) else (None, None)
        links = tuple(peer for peer in range(gpus) if cells[peer] == "MX")
        topology.append(_TopoGpu(links, numa, cores))
    return topology


def _apply_topology(devices: list[Device], topology: list[_TopoGpu]) -> list[Device]:
    by_index = {d.index: d for d in devices}
    if sorted(by_index) != list(range(len(topology))):
        raise TableError(
            f"the topology shows GPU0..GPU{len(topology) - 1} but the table GPUs {sorted(by_index)} "
            "(captures of different nodes?)"
        )
    return [
        replace(
            by_index[k],
            links=tuple(Link(peer=peer, kind="metaxlink") for peer in gpu.metaxlinks),
            numa_node=gpu.numa_node,
            cores=gpu.cores,
        )
        for k, gpu in enumerate(topology)
    ]


@register_vendor("metax")
class MetaxVendor(Vendor):
    tools = (TOOL,)
    device_glob = "/dev/mxcd"
    # MetaX's own torch wheel keeps device "cuda" and backend "nccl", served by MCCL (mcPytorch
    # README and DDP tests, vLLM-metax platform.py); MCCL reads MCCL_* network variables.
    traits = VendorTraits(
        visible_devices_env="MACA_VISIBLE_DEVICES",
        torch_backend="nccl",
        stack_label="maca",
        ccl_env_prefix="MCCL",
    )

    def commands(self) -> list[list[str]]:
        return [[TOOL], [TOOL, "topo", "-m"]]

    def parse(self, captures: Sequence[Capture]) -> list[Device]:
        topologies = [c for c in captures if MATRIX_TITLE in c.text]
        tables = [c for c in captures if MATRIX_TITLE not in c.text]
        if len(tables) != 1 or len(topologies) > 1:
            where = (tables[1:] or topologies[1:] or list(captures) or [Capture("<no capture>", "")])[0]
            counts = f"{len(tables)} tables and {len(topologies)} topologies"
            message = f"expected one `mx-smi` table and at most one topology, got {counts}"
            if not tables:
                message += "; a topology alone names no models, also capture `mx-smi`"
            raise self.parse_error(where, message)
        devices = guarded(self, tables[0], _parse_table)
        if not topologies:
            return devices
        return guarded(
            self, topologies[0], lambda text: _apply_topology(devices, _parse_topology(text)), TOPO_TOOL
        )
