"""NVIDIA GPUs: NVML through pynvml for live discovery, `nvidia-smi` captures for `--from-file`.

Live discovery (`probe`)
------------------------
pynvml (package nvidia-ml-py, imported only inside `probe`) reads, per GPU: name, minor number
(-> `index` and /dev/nvidia<minor>), memory total, UUID, PCI bus id, CPU affinity bitmask (-> `cores`),
MIG mode, retired-page and row-remap state (-> health), and every active NVLink's remote end: a GPU
of this node counts one link to it; links into NVSwitches connect every pair of switch-attached
GPUs with min(links of each) links, as `nvidia-smi topo -m` prints them (NV18 on HGX H100).
`numa_node` comes from /sys/bus/pci/devices/<bus>/numa_node (the CPU-side node, topo's "NUMA
Affinity"), else from nvmlDeviceGetMemoryAffinity. nvmlDeviceGetNumaNodeId is deliberately not
used: it is the GPU's *own* memory node on coherent platforms (GH200), topo's "GPU NUMA ID".
Driver and CUDA versions come from nvmlSystemGetDriverVersion / nvmlSystemGetCudaDriverVersion.
The conversion is pure (`NvmlGpu` -> `devices_from_nvml`) and tested with a fake pynvml.

Captures parsed (recognised by content, any order)
--------------------------------------------------
- `nvidia-smi -q -x` XML, DTD v12 (driver 535) and v13 (driver 595): product_name, minor_number,
  uuid, pci/pci_bus_id, fb_memory_usage/total, mig_mode/current_mig, the header's driver_version and
  cuda_version, and the health fields below. `attached_gpus` larger than the <gpu> blocks present
  (a trimmed capture) is accepted with a warning.
- `nvidia-smi -q` / `-a` text (driver 545): the same fields, by their printed names. Each GPU block
  must reach its `Processes` section, or the capture is taken as truncated.
- `nvidia-smi topo -m` and `topo -mp`, tab-separated as printed or as a terminal copy with tabs
  expanded (fields are rebuilt from 8-column tab stops, so blank cells survive). NV# cells become
  `Link(kind="nvlink", count=#)`; PCIe paths (PIX/PXB/PHB/NODE/SYS) give none; NIC rows and the NIC
  legend are ignored. `CPU Affinity` -> `cores`, `NUMA Affinity` -> `numa_node`. Matrix GPU<k> is
  the k-th GPU of the device listing (nvidia-smi's order), so both must come from one node.
  A topology (or `nvidia-smi mig -lgip` profile table) without a device listing is a ParseError
  asking for `nvidia-smi -q -x`; the profile table is otherwise ignored.
- health: identity fields reading "Unknown Error"/"GPU is lost", pending page retirement or
  blacklist, pending or failed row remapping, reset required, drain-and-reset recommended, a GPU
  recovery action other than None, and an NVLink fabric not ready or not successful.

Fixtures (tests/fixtures/nvidia/, provenance in each .source): `-q -x` of an A100-SXM4-80GB with
MIG on (v12, 1 of 4 blocks kept) and of an RTX 4000 SFF Ada (v13); `-a` text of an H100 80GB HBM3;
six topo matrices (DGX-1 `-mp`, DGX A100, 8x A100 NPS4, 8x H100 with blank CPU affinity, 4x and 2x
RTX 6000 Ada, tab- and space-separated); a `mig -lgip` table. No topology comes from the same node
as a device listing, so the topo captures are error cases there and are tested directly in
tests/unit/test_vendor_nvidia.py.

Known gaps: MIG instances are not separate devices (the GPU is marked partition_mode "mig"); a GPU
whose minor number is unreadable (fallen off the bus, "Unable to determine the device handle") cannot
be placed on /dev/nvidiaN and is skipped with a warning; nvidia-smi prints no usable CPU Affinity for
interleaved CPU numbering (blank or a single id), so a matrix with any blank CPU Affinity gives no
`cores` at all; the default `nvidia-smi` table and `-L` list are refused (no minor numbers). Not
checked against live hardware in this change.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slurm_hetero.errors import HeteroError, ParseError
from slurm_hetero.model import Capture, Device, Health, Link
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors.base import Vendor

logger = logging.getLogger(__name__)

VENDOR = "nvidia"
XML_TOOL = "nvidia-smi -q -x"
TEXT_TOOL = "nvidia-smi -q"
TOPO_TOOL = "nvidia-smi topo -m"
_ALSO = f"also capture `{XML_TOOL}`"
_LOST = ("Unknown Error", "GPU is lost", "GPU requires reset")
_NA = ("", "N/A", "None", "Not Supported", "[N/A]")

# canonical field -> XML path / text path (section/key) inside one GPU block
_XML_PATHS = {
    "model": "product_name",
    "uuid": "uuid",
    "minor": "minor_number",
    "bus_id": "pci/pci_bus_id",
    "memory": "fb_memory_usage/total",
    "mig": "mig_mode/current_mig",
    "pending_retirement": "retired_pages/pending_retirement",
    "pending_blacklist": "retired_pages/pending_blacklist",
    "remap_pending": "remapped_rows/remapped_row_pending",
    "remap_failure": "remapped_rows/remapped_row_failure",
    "reset_required": "gpu_reset_status/reset_required",
    "drain_reset": "gpu_reset_status/drain_and_reset_recommended",
    "recovery_action": "gpu_recovery_action",
    "fabric_state": "fabric/state",
    "fabric_status": "fabric/status",
}
_TEXT_PATHS = {
    "model": "Product Name",
    "uuid": "GPU UUID",
    "minor": "Minor Number",
    "bus_id": "PCI/Bus Id",
    "memory": "FB Memory Usage/Total",
    "mig": "MIG Mode/Current",
    "pending_retirement": "Retired Pages/Pending Retirement",
    "pending_blacklist": "Retired Pages/Pending Page Blacklist",
    "remap_pending": "Remapped Rows/Pending",
    "remap_failure": "Remapped Rows/Remapping Failure Occurred",
    "reset_required": "GPU Reset Status/Reset Required",
    "drain_reset": "GPU Reset Status/Drain and Reset Recommended",
    "recovery_action": "GPU Recovery Action",
    "fabric_state": "Fabric/State",
    "fabric_status": "Fabric/Status",
}
_IDENTITY = {
    "model": "product name",
    "minor": "minor number",
    "uuid": "UUID",
    "bus_id": "PCI bus id",
    "memory": "memory total",
}
_FLAGS = (
    ("pending_retirement", "retired pages pending"),
    ("pending_blacklist", "retired pages pending"),
    ("remap_pending", "row remapping pending"),
    ("remap_failure", "row remapping failed"),
    ("reset_required", "GPU reset required"),
    ("drain_reset", "drain and reset recommended"),
)


def _error(
    capture: Capture, tool: str, message: str, line_no: int | None = None, line: str | None = None
) -> ParseError:
    return ParseError(VENDOR, tool, message, capture.source, line_no, line)


def _opt(text: str | None) -> str | None:
    """A reported value, or None for blank / N/A."""
    value = (text or "").strip()
    return None if value in _NA else value


# -- small pure conversions ---------------------------------------------------------------------
def cpu_list(cpus: Iterable[int]) -> str | None:
    """CPU ids as a gres.conf Cores-style list: {0,1,2,3,8} -> "0-3,8"; none -> None."""
    ids = sorted(set(cpus))
    if not ids:
        return None
    ranges: list[tuple[int, int]] = []
    for cpu in ids:
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], cpu)
        else:
            ranges.append((cpu, cpu))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def normalize_cpu_list(text: str) -> str | None:
    """A printed CPU list ("48-63,176-191") normalized; blank or N/A -> None; ValueError if malformed."""
    value = text.strip()
    if value in _NA:
        return None
    cpus: set[int] = set()
    for part in value.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or (dash and int(high) < int(low)):
            raise ValueError(f"CPU list {value!r} is not like 0-15,32-47")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpu_list(cpus)


def cpu_list_from_mask(words: Iterable[int], word_bits: int = 64) -> str | None:
    """NVML's CPU affinity bitmask (CPU 0 = bit 0 of word 0) as "0-15,32-47"; empty mask -> None."""
    return cpu_list(
        w * word_bits + b for w, word in enumerate(words) for b in range(word_bits) if word >> b & 1
    )


def cuda_version_string(version: int) -> str:
    """nvmlSystemGetCudaDriverVersion's integer as CUDA prints it: 12040 -> "12.4"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def parse_mib(text: str | None) -> int | None:
    """ "81920 MiB" -> 81920; absent, N/A or an error text -> None; ValueError otherwise."""
    value = (text or "").strip()
    if value in _NA or value in _LOST:
        return None
    match = re.fullmatch(r"(\d+)\s*MiB", value)
    if not match:
        raise ValueError(f"memory total {value!r} is not like '81920 MiB'")
    return int(match.group(1))


def health_reasons(fields: Mapping[str, str]) -> list[str]:
    """Why a GPU is unhealthy, from its nvidia-smi fields (canonical keys); [] when healthy."""
    reasons = [
        f"{label} reads {fields[key]!r} (GPU lost or fallen off the bus?)"
        for key, label in _IDENTITY.items()
        if fields.get(key) in _LOST
    ]
    for key, reason in _FLAGS:
        if fields.get(key, "").lower() == "yes" and reason not in reasons:
            reasons.append(reason)
    action = _opt(fields.get("recovery_action"))
    if action:
        reasons.append(f"recovery action {action}")
    state, status = _opt(fields.get("fabric_state")), _opt(fields.get("fabric_status"))
    if state in ("Not Started", "In Progress"):
        reasons.append(f"NVLink fabric {state.lower()}")
    elif state == "Completed" and status not in (None, "Success"):
        reasons.append(f"NVLink fabric status {status}")
    return reasons


def device_from_fields(fields: Mapping[str, str], driver: str | None, cuda: str | None) -> Device | None:
    """One GPU block of nvidia-smi (canonical keys) -> Device; None if its minor number is unreadable.

    Raises ValueError with a one-line reason when a field is malformed."""
    model = (fields.get("model") or "").strip()
    if not model:
        raise ValueError("no product name")
    minor = (fields.get("minor") or "").strip()
    if minor in _LOST:
        return None
    if not minor.isdigit():
        raise ValueError(f"minor number {minor!r} is not a number")
    reasons = health_reasons(fields)
    return Device(
        vendor=VENDOR,
        model=model,
        index=int(minor),
        file=f"/dev/nvidia{minor}",
        memory_mib=parse_mib(fields.get("memory")),
        uuid=_opt(fields.get("uuid")) if fields.get("uuid") not in _LOST else None,
        pci_bus_id=_opt(fields.get("bus_id")) if fields.get("bus_id") not in _LOST else None,
        health=Health.UNHEALTHY if reasons else Health.OK,
        health_reason="; ".join(reasons) or None,
        driver_version=driver,
        runtime_version=cuda,
        partition_mode="mig" if fields.get("mig") == "Enabled" else None,
    )


def _devices(
    blocks: Sequence[tuple[str, Mapping[str, str], int | None]],
    driver: str | None,
    cuda: str | None,
    capture: Capture,
    tool: str,
) -> list[Device]:
    """GPU blocks (where, fields, line) -> devices in listing order; ParseError names the block."""
    devices: list[Device] = []
    for where, fields, line_no in blocks:
        try:
            device = device_from_fields(fields, driver, cuda)
        except ValueError as e:
            raise _error(capture, tool, f"{where}: {e}", line_no) from None
        if device is None:
            logger.warning("%s: %s has no readable minor number (lost GPU?); skipped", capture.source, where)
            continue
        if any(d.index == device.index for d in devices):
            raise _error(capture, tool, f"{where}: minor number {device.index} listed twice", line_no)
        devices.append(device)
    if not devices:
        raise _error(capture, tool, "no GPU with a readable minor number")
    return devices


def _check_attached(capture: Capture, attached: str | None, blocks: int, tool: str) -> None:
    count = _opt(attached)
    if count is not None and count.isdigit() and int(count) != blocks:
        logger.warning(
            "%s: %s says %s attached GPUs but lists %d; using the %d listed",
            capture.source,
            tool,
            count,
            blocks,
            blocks,
        )


# -- nvidia-smi -q -x ---------------------------------------------------------------------------
def parse_smi_xml(capture: Capture) -> list[Device]:
    """`nvidia-smi -q -x` output -> devices in nvidia-smi's order (DTD v12/v13)."""
    try:
        root = ET.fromstring(capture.text.lstrip("\ufeff \t\r\n"))
    except ET.ParseError as e:
        raise _error(
            capture, XML_TOOL, f"malformed XML, truncated? ({str(e).split(':')[0]})", e.position[0]
        ) from None
    if root.tag != "nvidia_smi_log":
        raise _error(capture, XML_TOOL, f"XML root is <{root.tag}>, not <nvidia_smi_log>")
    gpus = root.findall("gpu")
    if not gpus:
        raise _error(capture, XML_TOOL, "no <gpu> element")
    _check_attached(capture, root.findtext("attached_gpus"), len(gpus), XML_TOOL)
    blocks = []
    for gpu in gpus:
        fields = {
            k: (gpu.findtext(p) or "").strip() for k, p in _XML_PATHS.items() if gpu.find(p) is not None
        }
        fields.setdefault("bus_id", gpu.get("id", ""))
        blocks.append((f"<gpu id={gpu.get('id', '?')!r}>", fields, None))
    driver, cuda = _opt(root.findtext("driver_version")), _opt(root.findtext("cuda_version"))
    return _devices(blocks, driver, cuda, capture, XML_TOOL)


# -- nvidia-smi -q (text) -----------------------------------------------------------------------
_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$")
_KEY_VALUE = re.compile(r"^( *)([^:]*?\S)\s+:(?: (.*))?$")
_NO_HANDLE = re.compile(r"Unable to determine the device handle for (?:GPU\s*)?(\S+?):? (.*)$")


@dataclass
class _TextGpu:
    bus_id: str
    line_no: int
    fields: dict[str, tuple[str, int]] = field(default_factory=dict)
    complete: bool = False


def _text_line(
    line: str,
    no: int,
    stack: list[tuple[int, str]],
    header: dict[str, tuple[str, int]],
    gpus: list[_TextGpu],
    capture: Capture,
) -> None:
    """Fold one indented `Key : value` / section line into the header or the current GPU block."""
    indent = len(line) - len(line.lstrip(" "))
    while stack and stack[-1][0] >= indent:
        stack.pop()
    kv = _KEY_VALUE.match(line)
    name = kv.group(2) if kv else line.strip()
    if gpus and indent == 4 and name == "Processes":
        gpus[-1].complete = True
    if not kv:
        if indent == 0 or not gpus:
            raise _error(capture, TEXT_TOOL, "unexpected line outside a GPU block", no, line)
        stack.append((indent, name))
        return
    path = "/".join([s for _, s in stack] + [name])
    (gpus[-1].fields if gpus and indent > 0 else header)[path] = ((kv.group(3) or "").strip(), no)


def _text_blocks(capture: Capture) -> tuple[dict[str, tuple[str, int]], list[_TextGpu]]:
    header: dict[str, tuple[str, int]] = {}
    gpus: list[_TextGpu] = []
    stack: list[tuple[int, str]] = []
    for no, raw in enumerate(capture.text.splitlines(), 1):
        line = raw.rstrip()
        if not line.strip() or "NVSMI LOG" in line:
            continue
        lost = _NO_HANDLE.search(line)
        gpu = _GPU_HEADER.match(line)
        if lost:
            logger.warning("%s: GPU %s not listed: %s", capture.source, lost.group(1), lost.group(2))
        elif gpu:
            gpus.append(_TextGpu(gpu.group(1), no))
            stack = []
        else:
            _text_line(line, no, stack, header, gpus, capture)
    return header, gpus


def parse_smi_text(capture: Capture) -> list[Device]:
    """`nvidia-smi -q` / `nvidia-smi -a` text -> devices in nvidia-smi's order."""
    header, gpus = _text_blocks(capture)
    if not gpus:
        raise _error(capture, TEXT_TOOL, "no `GPU <bus id>` block (truncated?)")
    for gpu in gpus:
        if not gpu.complete:
            raise _error(
                capture,
                TEXT_TOOL,
                f"GPU {gpu.bus_id} block ends before its Processes section (truncated?)",
                gpu.line_no,
            )
    _check_attached(capture, header.get("Attached GPUs", ("", 0))[0], len(gpus), TEXT_TOOL)
    blocks = []
    for gpu in gpus:
        fields = {k: gpu.fields[p][0] for k, p in _TEXT_PATHS.items() if p in gpu.fields}
        fields.setdefault("bus_id", gpu.bus_id)
        blocks.append((f"GPU {gpu.bus_id}", fields, gpu.line_no))
    driver = _opt(header.get("Driver Version", ("", 0))[0])
    cuda = _opt(header.get("CUDA Version", ("", 0))[0])
    return _devices(blocks, driver, cuda, capture, TEXT_TOOL)


# -- nvidia-smi topo -m / -mp -------------------------------------------------------------------
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
        raise _error(capture, TOPO_TOOL, "header is not GPU0 GPU1 ... (NICs) CPU Affinity", no)
    extra = {n: 1 + i for i, n in enumerate(names) if n in _AFFINITY_COLUMNS}  # rows: name, then cells
    return columns, extra


def _numa(value: str) -> int | None:
    return int(value) if value.strip().isdigit() else None


def _topo_row(
    capture: Capture, fields: list[str], columns: list[str], extra: dict[str, int], no: int, line: str
) -> tuple[str, TopoGpu | None]:
    name, cells = fields[0], fields[1 : 1 + len(columns)]
    if name not in columns or len(cells) < len(columns) or not all(_CELL.match(c) for c in cells):
        raise _error(capture, TOPO_TOOL, "not a matrix row of the header's columns", no, line)
    if cells[columns.index(name)] != "X":
        raise _error(capture, TOPO_TOOL, f"row {name} has no X on its own column", no, line)
    if not name.startswith("GPU"):
        return name, None
    nvlinks = tuple(
        (int(col[3:]), int(cell[2:]))
        for col, cell in zip(columns, cells, strict=True)
        if col.startswith("GPU") and cell.startswith("NV")
    )

    def column(title: str) -> str:
        at = extra.get(title)
        return fields[at] if at is not None and at < len(fields) else ""

    try:
        cores = normalize_cpu_list(column("CPU Affinity"))
    except ValueError as e:
        raise _error(capture, TOPO_TOOL, str(e), no, line) from None
    return name, TopoGpu(int(name[3:]), nvlinks, cores, _numa(column("NUMA Affinity")))


def _legend(lines: Sequence[str]) -> set[str]:
    """Codes defined under `Legend:` (X, SYS, NODE, PHB, PXB, PIX, NV#)."""
    codes: set[str] = set()
    inside = False
    for line in lines:
        if line.strip() in ("Legend:", "NIC Legend:"):
            inside = line.strip() == "Legend:"
            continue
        match = re.match(r"^\s+(\S+)\s+= \S", line)
        if inside and match:
            codes.add(match.group(1))
    return codes


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
    start = _topo_start(lines)
    if start is None:
        raise _error(capture, TOPO_TOOL, "no GPU0 GPU1 ... header line", 1)
    columns, extra = _topo_columns(capture, split_topo_fields(lines[start]), start + 1)
    rows: dict[str, TopoGpu | None] = {}
    end = start + 1
    while end < len(lines) and lines[end].strip():
        name, gpu = _topo_row(capture, split_topo_fields(lines[end]), columns, extra, end + 1, lines[end])
        rows[name] = gpu
        end += 1
    missing = [c for c in columns if c not in rows]
    if missing:
        raise _error(capture, TOPO_TOOL, f"matrix ends before the row of {missing[0]} (truncated?)", end)
    legend = _legend(lines[end:])
    if not {"X", "PIX"} <= legend:
        raise _error(capture, TOPO_TOOL, "no complete Legend after the matrix (truncated?)", len(lines))
    gpus = sorted((g for g in rows.values() if g is not None), key=lambda g: g.position)
    shows_nvlink = "NV#" in legend or any(g.nvlinks for g in gpus)
    return Topology(capture.source, tuple(_untrusted_cores(capture, gpus, extra)), shows_nvlink)


def _topo_start(lines: Sequence[str]) -> int | None:
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
    for gpu, device in zip(topo.gpus, devices, strict=True):
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


# -- classification -----------------------------------------------------------------------------
def classify(capture: Capture) -> str | None:
    """Which nvidia-smi output a capture is: xml, text, topo, mig-profiles, table, gpu-list; None."""
    text = capture.text
    head = "\n".join(line for line in text.splitlines()[:8] if line.strip())
    if text.lstrip("\ufeff \t\r\n").startswith(("<?xml", "<!DOCTYPE nvidia_smi_log", "<nvidia_smi_log")):
        return "xml"
    if "=NVSMI LOG=" in head:
        return "text"
    if _topo_start(text.splitlines()) is not None:
        return "topo"
    if "GPU instance profiles:" in head:
        return "mig-profiles"
    if "NVIDIA-SMI" in head and "Driver Version" in head:
        return "table"
    if re.match(r"GPU \d+: .+\(UUID: GPU-", text.lstrip()):
        return "gpu-list"
    return None


_REFUSED = {
    "table": "the default `nvidia-smi` table has no minor numbers; capture `nvidia-smi -q -x` instead",
    "gpu-list": "`nvidia-smi -L` lists no minor numbers or memory; capture `nvidia-smi -q -x` instead",
}


def _refuse(capture: Capture, kind: str | None) -> ParseError:
    """The ParseError for a capture this parser cannot use, naming its first line."""
    if kind in _REFUSED:
        return _error(capture, "nvidia-smi", _REFUSED[kind], 1)
    lines = capture.text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return _error(capture, "nvidia-smi", "empty capture")
    return _error(
        capture,
        "nvidia-smi",
        f"not `{XML_TOOL}`, `{TEXT_TOOL}` or `{TOPO_TOOL}` output",
        first + 1,
        lines[first],
    )


_NOT_A_LISTING = {
    "topo": "topology alone has no device list",
    "mig-profiles": "a MIG profile table has no device list",
}


# -- NVML (live) --------------------------------------------------------------------------------
@dataclass(frozen=True)
class NvmlGpu:
    """Raw values NVML gave for one GPU (None or empty: the query failed or is unsupported)."""

    name: str | None
    minor: int | None
    memory_total_bytes: int | None = None
    uuid: str | None = None
    bus_id: str | None = None
    numa_node: int | None = None
    cpu_mask: tuple[int, ...] = ()
    mig_current: int | None = None
    nvlink_gpus: tuple[str, ...] = ()  # remote PCI bus id of each active NVLink to a GPU (or unknown)
    nvswitch_links: int = 0  # active NVLinks into an NVSwitch
    retired_pages_pending: bool = False
    remapped_rows: tuple[int, int, int, int] | None = None  # corrected, uncorrected, pending, failed
    errors: tuple[str, ...] = ()  # essential queries that failed ("nvmlDeviceGetName: GPU is lost")


def bus_key(bus_id: str) -> str:
    """A PCI bus id as sysfs spells it: "00000000:1A:00.0" -> "0000:1a:00.0"."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 2:
        parts.insert(0, "0000")
    if len(parts) != 3:
        return bus_id.strip().lower()
    return f"{parts[0][-4:].rjust(4, '0')}:{parts[1]}:{parts[2]}"


def nvlink_peers(gpus: Sequence[NvmlGpu]) -> list[Counter[int]]:
    """Links per peer minor number for each GPU: direct links by remote bus id, plus NVSwitch fabrics
    (every two switch-attached GPUs get min(their switch links), as `topo -m` shows)."""
    minor_of = {bus_key(g.bus_id): g.minor for g in gpus if g.bus_id and g.minor is not None}
    peers: list[Counter[int]] = []
    for i, gpu in enumerate(gpus):
        counts = Counter(minor_of[bus_key(r)] for r in gpu.nvlink_gpus if bus_key(r) in minor_of)
        for j, other in enumerate(gpus):
            if j != i and other.minor is not None and gpu.nvswitch_links and other.nvswitch_links:
                counts[other.minor] += min(gpu.nvswitch_links, other.nvswitch_links)
        if gpu.minor is not None:
            counts.pop(gpu.minor, None)
        peers.append(counts)
    return peers


def _nvml_health(gpu: NvmlGpu) -> list[str]:
    reasons = list(gpu.errors)
    if gpu.retired_pages_pending:
        reasons.append("retired pages pending")
    if gpu.remapped_rows and gpu.remapped_rows[2]:
        reasons.append("row remapping pending")
    if gpu.remapped_rows and gpu.remapped_rows[3]:
        reasons.append("row remapping failed")
    return reasons


def devices_from_nvml(gpus: Sequence[NvmlGpu], driver: str | None, cuda: str | None) -> list[Device]:
    """NVML's raw values -> devices in index order; a GPU without name or minor number is skipped."""
    devices = []
    for gpu, peers in zip(gpus, nvlink_peers(gpus), strict=True):
        if gpu.minor is None or not gpu.name:
            logger.warning("NVML GPU %s unreadable (%s); skipped", gpu.bus_id or "?", "; ".join(gpu.errors))
            continue
        reasons = _nvml_health(gpu)
        devices.append(
            Device(
                vendor=VENDOR,
                model=gpu.name,
                index=gpu.minor,
                file=f"/dev/nvidia{gpu.minor}",
                memory_mib=gpu.memory_total_bytes // 2**20 if gpu.memory_total_bytes else None,
                numa_node=gpu.numa_node,
                cores=cpu_list_from_mask(gpu.cpu_mask),
                uuid=gpu.uuid,
                pci_bus_id=gpu.bus_id,
                links=tuple(Link(p, "nvlink", n) for p, n in sorted(peers.items())),
                health=Health.UNHEALTHY if reasons else Health.OK,
                health_reason="; ".join(reasons) or None,
                driver_version=driver,
                runtime_version=cuda,
                partition_mode="mig" if gpu.mig_current == 1 else None,
            )
        )
    return sorted(devices, key=lambda d: d.index)


def _text(value: Any) -> str | None:
    """pynvml strings come as str, or bytes inside structures."""
    if value is None:
        return None
    return (value.decode(errors="replace") if isinstance(value, bytes) else str(value)).strip() or None


SYSFS_PCI = Path("/sys/bus/pci/devices")
DEV = Path("/dev")
PROC_DRIVER = Path("/proc/driver/nvidia/version")


def sysfs_numa_node(bus_id: str, root: Path | None = None) -> int | None:
    """The CPU-side NUMA node of a PCI device from sysfs; None when unknown (-1) or unreadable."""
    try:
        node = int(((root or SYSFS_PCI) / bus_key(bus_id) / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _single_bit(words: Iterable[int]) -> int | None:
    bits = [w * 64 + b for w, word in enumerate(words) for b in range(64) if word >> b & 1]
    return bits[0] if len(bits) == 1 else None


_CPU_WORDS = max(16, -(-(os.cpu_count() or 1) // 64))  # 64-bit words of the CPU affinity mask


class _NvmlReader:
    """Calls pynvml for one GPU, turning NVMLError into None and recording failures of essential queries."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.errors: list[str] = []

    def call(self, name: str, *args: Any, essential: bool = False) -> Any:
        fn = getattr(self.nvml, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as e:
            if essential:
                self.errors.append(f"{name}: {e}")
            return None

    def nvlinks(self, handle: Any) -> tuple[tuple[str, ...], int]:
        """Remote bus ids of active NVLinks to GPUs, and the number of links into NVSwitches."""
        remotes: list[str] = []
        switch = 0
        for link in range(int(getattr(self.nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            state = self.call("nvmlDeviceGetNvLinkState", handle, link)
            if state is None:
                break  # no NVLink, or past this GPU's last link
            if state != 1:
                continue
            kind = self.call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            if kind == getattr(self.nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2):
                switch += 1
            elif kind in (None, getattr(self.nvml, "NVML_NVLINK_DEVICE_TYPE_GPU", 0)):
                pci = self.call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
                bus = _text(getattr(pci, "busId", None))
                remotes.extend([bus] if bus else [])
        return tuple(remotes), switch

    def numa_node(self, handle: Any, bus_id: str | None) -> int | None:
        node = sysfs_numa_node(bus_id) if bus_id else None
        if node is None:
            words = self.call(
                "nvmlDeviceGetMemoryAffinity", handle, 4, getattr(self.nvml, "NVML_AFFINITY_SCOPE_NODE", 0)
            )
            node = _single_bit(words) if words is not None else None
        return node

    def gpu(self, index: int) -> NvmlGpu:
        """Everything `devices_from_nvml` needs about the GPU NVML numbers `index`."""
        self.errors = []
        handle = self.call("nvmlDeviceGetHandleByIndex", index, essential=True)
        if handle is None:
            return NvmlGpu(name=None, minor=None, errors=tuple(self.errors))
        memory = self.call("nvmlDeviceGetMemoryInfo", handle, essential=True)
        bus = _text(getattr(self.call("nvmlDeviceGetPciInfo", handle, essential=True), "busId", None))
        mig = self.call("nvmlDeviceGetMigMode", handle)
        nvlink_gpus, nvswitch_links = self.nvlinks(handle)
        remapped = self.call("nvmlDeviceGetRemappedRows", handle)
        return NvmlGpu(
            name=_text(self.call("nvmlDeviceGetName", handle, essential=True)),
            minor=self.call("nvmlDeviceGetMinorNumber", handle, essential=True),
            memory_total_bytes=getattr(memory, "total", None),
            uuid=_text(self.call("nvmlDeviceGetUUID", handle)),
            bus_id=bus,
            numa_node=self.numa_node(handle, bus),
            cpu_mask=tuple(int(w) for w in self.call("nvmlDeviceGetCpuAffinity", handle, _CPU_WORDS) or ()),
            mig_current=mig[0] if mig else None,
            nvlink_gpus=nvlink_gpus,
            nvswitch_links=nvswitch_links,
            retired_pages_pending=bool(self.call("nvmlDeviceGetRetiredPagesPendingStatus", handle)),
            remapped_rows=tuple(remapped) if remapped else None,
            errors=tuple(self.errors),
        )


def read_nvml(nvml: Any) -> tuple[list[NvmlGpu], str | None, str | None]:
    """All GPUs NVML sees, with the driver and CUDA versions (nvmlInit/nvmlShutdown around it)."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        raise HeteroError(
            f"nvidia: NVML cannot start ({e}); is the NVIDIA driver loaded? Or capture "
            f"`{XML_TOOL}` and use --from-file"
        ) from e
    try:
        reader = _NvmlReader(nvml)
        driver = _text(reader.call("nvmlSystemGetDriverVersion"))
        cuda_int = reader.call("nvmlSystemGetCudaDriverVersion")
        count = reader.call("nvmlDeviceGetCount", essential=True) or 0
        gpus = [reader.gpu(i) for i in range(count)]
    finally:
        nvml.nvmlShutdown()
    return gpus, driver, cuda_version_string(cuda_int) if cuda_int else None


def driver_present() -> bool:
    """NVIDIA kernel driver signs, with no device I/O: device nodes, or the loaded module's version file."""
    return (DEV / "nvidiactl").exists() or any(DEV.glob("nvidia[0-9]*")) or PROC_DRIVER.exists()


def pynvml_importable() -> bool:
    """Whether `import pynvml` would find a module, without importing it."""
    if "pynvml" in sys.modules:
        return sys.modules["pynvml"] is not None
    try:
        return importlib.util.find_spec("pynvml") is not None
    except (ImportError, ValueError):
        return False


@register_vendor("nvidia")
class NvidiaVendor(Vendor):
    """NVIDIA GPUs: NVML live, `nvidia-smi -q -x` (+ `topo -m`) captures from files."""

    tools = ("nvidia-smi",)
    memory_capture_hint = XML_TOOL

    def affinity(self) -> int:
        """2 with pynvml importable and the NVIDIA driver present (nvmlInit can work), else 0."""
        return 2 if pynvml_importable() and driver_present() else 0

    def commands(self) -> list[list[str]]:
        """What admins capture for --from-file."""
        return [["nvidia-smi", "-q", "-x"], ["nvidia-smi", "topo", "-m"]]

    def probe(self) -> list[Device]:
        """Live discovery through NVML (pynvml)."""
        try:
            import pynvml
        except ImportError as e:
            raise HeteroError(
                f"nvidia: pynvml is not importable ({e}); pip install nvidia-ml-py, or "
                f"capture `{XML_TOOL}` and use --from-file"
            ) from e
        gpus, driver, cuda = read_nvml(pynvml)
        devices = devices_from_nvml(gpus, driver, cuda)
        if not devices and gpus:
            raise HeteroError("nvidia: NVML lists GPUs but none could be read; see the warnings above")
        return devices

    def parse(self, captures: Sequence[Capture]) -> list[Device]:
        """Device listing (`-q -x` XML or `-q` text) plus optional topology matrices -> devices."""
        if not captures:
            raise ParseError(VENDOR, XML_TOOL, "no captures given", "<none>")
        listings: list[tuple[Capture, list[Device]]] = []
        topologies: list[Topology] = []
        for capture in captures:
            kind = classify(capture)
            if kind == "xml":
                listings.append((capture, parse_smi_xml(capture)))
            elif kind == "text":
                listings.append((capture, parse_smi_text(capture)))
            elif kind == "topo":
                topologies.append(parse_topology(capture))
            elif kind == "mig-profiles":
                logger.info("%s: MIG profile table ignored (it lists no devices)", capture.source)
            else:
                raise _refuse(capture, kind)
        return self._combine(captures, listings, topologies)

    def _combine(
        self,
        captures: Sequence[Capture],
        listings: list[tuple[Capture, list[Device]]],
        topologies: list[Topology],
    ) -> list[Device]:
        if not listings:
            kind = classify(captures[0]) or "topo"
            raise _error(
                captures[0],
                TOPO_TOOL if kind == "topo" else "nvidia-smi mig -lgip",
                f"{_NOT_A_LISTING.get(kind, 'no device list')}; {_ALSO}",
            )
        if len(listings) > 1:
            names = " and ".join(c.source for c, _ in listings)
            raise _error(listings[1][0], XML_TOOL, f"two device listings ({names}); pass one per node")
        source, devices = listings[0][0].source, listings[0][1]
        for topo in topologies:
            devices = apply_topology(devices, topo, source)
        return sorted(devices, key=lambda d: d.index)
