"""`nvidia-smi topo -m` / `-mp` matrices (`parse_topology`) laid onto a listing of the same node,
GPU<k> being the k-th device (`apply_topology`); NIC rows and the NIC legend are ignored.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from slurm_hetero.core.errors import ParseError
from slurm_hetero.core.model import Capture, Device, Link
from slurm_hetero.vendors._nvidia_smi import TOPO_TOOL, VENDOR, normalize_cpu_list, parse_error
from slurm_hetero.vendors._table import TableError, numbered_lines, read_legend

logger = logging.getLogger("slurm_hetero.vendors.nvidia")  # the vendor's channel, as before the split


@dataclass(frozen=True)
class TopoGpu:
    """One GPU row of a topology matrix: position k of `GPUk`, NVLinks (peer position, count)."""

    position: int
    nvlinks: tuple[tuple[int, int], ...] = ()
    cores: str | None = None
    numa_node: int | None = None


@dataclass(frozen=True)
class Topology:
    """A parsed `nvidia-smi topo -m`; `shows_nvlink` is False for `topo -mp` (PCIe only)."""

    source: str
    gpus: tuple[TopoGpu, ...]
    shows_nvlink: bool


_CELL = re.compile(r"^(X|NV\d+|[A-Z]{2,5})$")
_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def split_topo_fields(line: str) -> list[str]:
    """Fields of a topo line: tab-separated as printed, or rebuilt from a copy with tabs expanded to
    8-column stops (a blank field is 8 more spaces; words one space apart are one field)."""
    if "\t" in line:
        return [f.strip() for f in line.split("\t")]
    fields: list[str] = []
    expected = 0
    for match in re.finditer(r"\S+", line):
        stop = match.start() // 8 * 8
        if fields and stop < expected:
            fields[-1] += " " + match.group()
        else:
            fields.extend([""] * max(0, (stop - expected) // 8))
            fields.append(match.group())
        expected = (match.end() // 8 + 1) * 8
    return fields


def _topo_columns(capture: Capture, header: list[str], no: int) -> tuple[list[str], dict[str, int]]:
    """Matrix column names and where the affinity columns sit (field index, as in rows)."""
    names = header[1:] if header and header[0] == "" else header
    columns = [n for n in names if n not in _AFFINITY_COLUMNS]
    gpus = [c for c in columns if re.fullmatch(r"GPU\d+", c)]
    if not gpus or gpus != [f"GPU{k}" for k in range(len(gpus))] or len(set(columns)) != len(columns):
        raise parse_error(TOPO_TOOL, "header is not GPU0 GPU1 ... (NICs) CPU Affinity", capture, no)
    extra = {n: 1 + i for i, n in enumerate(names) if n in _AFFINITY_COLUMNS}  # rows: name, then cells
    return columns, extra


def _topo_row(
    capture: Capture, fields: list[str], columns: list[str], extra: dict[str, int], no: int, line: str
) -> tuple[str, TopoGpu | None]:
    name, cells = fields[0], fields[1 : 1 + len(columns)]
    if name not in columns or len(cells) < len(columns) or not all(_CELL.match(c) for c in cells):
        raise parse_error(TOPO_TOOL, "not a matrix row of the header's columns", capture, no, line)
    if cells[columns.index(name)] != "X":
        raise parse_error(TOPO_TOOL, f"row {name} has no X on its own column", capture, no, line)
    if not name.startswith("GPU"):
        return name, None
    nvlinks = tuple(
        (int(col[3:]), int(cell[2:]))
        for col, cell in zip(columns, cells)
        if col.startswith("GPU") and cell.startswith("NV")
    )

    def column(title: str) -> str:
        at = extra.get(title)
        return fields[at] if at is not None and at < len(fields) else ""

    try:
        cores = normalize_cpu_list(column("CPU Affinity"))
    except ValueError as e:
        raise parse_error(TOPO_TOOL, str(e), capture, no, line) from None
    numa = column("NUMA Affinity")
    return name, TopoGpu(int(name[3:]), nvlinks, cores, int(numa) if numa.strip().isdigit() else None)


def _untrusted_cores(capture: Capture, gpus: list[TopoGpu], extra: dict[str, int]) -> list[TopoGpu]:
    """nvidia-smi prints a blank (or bogus) CPU Affinity for interleaved CPU numbering: drop them all."""
    blank = [f"GPU{g.position}" for g in gpus if g.cores is None]
    if "CPU Affinity" not in extra or not blank or len(blank) == len(gpus):
        return gpus
    logger.warning(
        "%s: CPU Affinity blank for %s; nvidia-smi could not print these CPU sets "
        "(interleaved CPU numbering?), so no GPU gets Cores= from this capture",
        capture.source,
        ",".join(blank),
    )
    return [replace(g, cores=None) for g in gpus]


def parse_topology(capture: Capture) -> Topology:
    """`nvidia-smi topo -m` (or `-mp`) -> GPU rows with NVLinks, CPU and NUMA affinity; NIC rows ignored."""
    lines = capture.text.splitlines()
    start = topo_start(lines)
    if start is None:
        raise parse_error(TOPO_TOOL, "no GPU0 GPU1 ... header line", capture, 1)
    columns, extra = _topo_columns(capture, split_topo_fields(lines[start]), start + 1)
    rows: dict[str, TopoGpu | None] = {}
    end = start + 1
    while end < len(lines) and lines[end].strip():
        name, gpu = _topo_row(capture, split_topo_fields(lines[end]), columns, extra, end + 1, lines[end])
        rows[name] = gpu
        end += 1
    if missing := [c for c in columns if c not in rows]:
        raise parse_error(TOPO_TOOL, f"matrix ends before the row of {missing[0]} (truncated?)", capture, end)
    try:  # a missing Legend is reported below, as a cut
        legend, _ = read_legend(numbered_lines(capture.text), end, "Legend:")
    except TableError:
        legend = set()
    if not {"X", "PIX"} <= legend:
        raise parse_error(TOPO_TOOL, "no complete Legend after the matrix (truncated?)", capture, len(lines))
    gpus = sorted((g for g in rows.values() if g is not None), key=lambda g: g.position)
    shows_nvlink = "NV#" in legend or any(g.nvlinks for g in gpus)
    return Topology(capture.source, tuple(_untrusted_cores(capture, gpus, extra)), shows_nvlink)


def topo_start(lines: Sequence[str]) -> int | None:
    """Index of the matrix header (`<tab>GPU0<tab>GPU1 ...`) among the first non-blank lines."""
    nonblank = [i for i, line in enumerate(lines) if line.strip()][:3]
    for i in nonblank:
        names = [f for f in split_topo_fields(lines[i]) if f]
        if names and names[0] == "GPU0" and (not lines[i][:1].strip() or "CPU Affinity" in names):
            return i
    return None


def apply_topology(devices: Sequence[Device], topo: Topology, listing: str) -> list[Device]:
    """Devices (nvidia-smi order) with links, cores and NUMA node from `topo` (GPU<k> = k-th device)."""
    if len(topo.gpus) != len(devices):
        raise ParseError(
            VENDOR,
            TOPO_TOOL,
            f"the matrix has {len(topo.gpus)} GPUs but {listing} lists "
            f"{len(devices)}; capture both on the same node",
            topo.source,
        )
    out = []
    for gpu, device in zip(topo.gpus, devices):
        links = device.links
        if topo.shows_nvlink:
            links = tuple(
                sorted(
                    (Link(devices[p].index, "nvlink", n) for p, n in gpu.nvlinks), key=lambda link: link.peer
                )
            )
        numa = gpu.numa_node if gpu.numa_node is not None else device.numa_node
        out.append(replace(device, links=links, cores=gpu.cores or device.cores, numa_node=numa))
    return out
