"""nvidia-smi device listings (`-q -x` XML, `-q` / `-a` text) -> Device records, plus what every
NVIDIA parser shares: tool names, canonical field names, health rules and small conversions.
"""

from __future__ import annotations

import functools
import logging
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from xml.parsers import expat

from slurm_hetero.core.errors import ParseError
from slurm_hetero.core.model import Capture, Device, Health
from slurm_hetero.slurm.syntax import ranges
from slurm_hetero.vendors._table import TableError, numbered_lines, read_tree, tree_value

logger = logging.getLogger("slurm_hetero.vendors.nvidia")  # the vendor's channel, as before the split

VENDOR = "nvidia"
XML_TOOL = "nvidia-smi -q -x"
TEXT_TOOL = "nvidia-smi -q"
TOPO_TOOL = "nvidia-smi topo -m"
_LOST = ("Unknown Error", "GPU is lost", "GPU requires reset")
_NA = ("", "N/A", "None", "Not Supported", "[N/A]")

# canonical field -> (XML path, text path as section/key) inside one GPU block
_PATHS = {
    "model": ("product_name", "Product Name"),
    "uuid": ("uuid", "GPU UUID"),
    "minor": ("minor_number", "Minor Number"),
    "bus_id": ("pci/pci_bus_id", "PCI/Bus Id"),
    "memory": ("fb_memory_usage/total", "FB Memory Usage/Total"),
    "mig": ("mig_mode/current_mig", "MIG Mode/Current"),
    "pending_retirement": ("retired_pages/pending_retirement", "Retired Pages/Pending Retirement"),
    "pending_blacklist": ("retired_pages/pending_blacklist", "Retired Pages/Pending Page Blacklist"),
    "remap_pending": ("remapped_rows/remapped_row_pending", "Remapped Rows/Pending"),
    "remap_failure": ("remapped_rows/remapped_row_failure", "Remapped Rows/Remapping Failure Occurred"),
    "reset_required": ("gpu_reset_status/reset_required", "GPU Reset Status/Reset Required"),
    "drain_reset": (
        "gpu_reset_status/drain_and_reset_recommended",
        "GPU Reset Status/Drain and Reset Recommended",
    ),
    "recovery_action": ("gpu_recovery_action", "GPU Recovery Action"),
    "fabric_state": ("fabric/state", "Fabric/State"),
    "fabric_status": ("fabric/status", "Fabric/Status"),
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


parse_error = functools.partial(ParseError, VENDOR)  # (tool, message, capture, line_no, line)


def _opt(text: str | None) -> str | None:
    """A reported value, or None for blank / N/A."""
    value = (text or "").strip()
    return None if value in _NA else value


# -- small pure conversions ---------------------------------------------------------------------
def cpu_list(cpus: Iterable[int]) -> str | None:
    """CPU ids as a gres.conf Cores-style list: {0,1,2,3,8} -> "0-3,8"; none -> None."""
    return ranges(sorted(set(cpus))) or None


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
    if action := _opt(fields.get("recovery_action")):
        reasons.append(f"recovery action {action}")
    state, status = _opt(fields.get("fabric_state")), _opt(fields.get("fabric_status"))
    if state in ("Not Started", "In Progress"):
        reasons.append(f"NVLink fabric {state.lower()}")
    elif state == "Completed" and status not in (None, "Success"):
        reasons.append(f"NVLink fabric status {status}")
    return reasons


def device_from_fields(fields: Mapping[str, str], driver: str | None, cuda: str | None) -> Device | None:
    """One GPU block (canonical keys) -> Device; None: minor number unreadable; ValueError: malformed."""
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
            raise parse_error(tool, f"{where}: {e}", capture, line_no) from None
        if device is None:
            logger.warning("%s: %s has no readable minor number (lost GPU?); skipped", capture.source, where)
            continue
        if any(d.index == device.index for d in devices):
            raise parse_error(tool, f"{where}: minor number {device.index} listed twice", capture, line_no)
        devices.append(device)
    if not devices:
        raise parse_error(tool, "no GPU with a readable minor number", capture)
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
class _EntityDeclared(Exception):
    """An `<!ENTITY>` declaration: nvidia-smi writes none (its DOCTYPE names an external DTD that
    is never read), and expanding them is how 1 KB of XML takes hundreds of MB (billion laughs)."""


def _refuse_entity(*_: object) -> None:
    raise _EntityDeclared


def _xml_root(text: str) -> ET.Element:
    """The parsed document; expat refuses entity declarations before any is used (ElementTree cannot)."""
    builder = ET.TreeBuilder()
    parser = expat.ParserCreate()
    parser.buffer_text = True
    parser.StartElementHandler = builder.start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    parser.EntityDeclHandler = _refuse_entity
    parser.UnparsedEntityDeclHandler = _refuse_entity
    parser.Parse(text, True)
    return builder.close()


def parse_smi_xml(capture: Capture) -> list[Device]:
    """`nvidia-smi -q -x` output -> devices in nvidia-smi's order (DTD v12/v13)."""
    try:
        root = _xml_root(capture.text.lstrip("\ufeff \t\r\n"))
    except expat.ExpatError as e:
        raise parse_error(
            XML_TOOL, f"malformed XML, truncated? ({str(e).split(':')[0]})", capture, e.lineno
        ) from None
    except _EntityDeclared:
        raise parse_error(
            XML_TOOL, "declares XML entities (<!ENTITY>), which nvidia-smi never writes", capture
        ) from None
    if root.tag != "nvidia_smi_log":
        raise parse_error(XML_TOOL, f"XML root is <{root.tag}>, not <nvidia_smi_log>", capture)
    gpus = root.findall("gpu")
    if not gpus:
        raise parse_error(XML_TOOL, "no <gpu> element", capture)
    _check_attached(capture, root.findtext("attached_gpus"), len(gpus), XML_TOOL)
    blocks = []
    for gpu in gpus:
        fields = {
            k: (gpu.findtext(p) or "").strip() for k, (p, _) in _PATHS.items() if gpu.find(p) is not None
        }
        fields.setdefault("bus_id", gpu.get("id", ""))
        blocks.append((f"<gpu id={gpu.get('id', '?')!r}>", fields, None))
    driver, cuda = _opt(root.findtext("driver_version")), _opt(root.findtext("cuda_version"))
    return _devices(blocks, driver, cuda, capture, XML_TOOL)


# -- nvidia-smi -q (text) -----------------------------------------------------------------------
_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$")
_NO_HANDLE = re.compile(r"Unable to determine the device handle for (?:GPU\s*)?(\S+?):? (.*)$")


def parse_smi_text(capture: Capture) -> list[Device]:
    """`nvidia-smi -q` / `nvidia-smi -a` text -> devices in nvidia-smi's order."""
    lines = []
    for line in numbered_lines(capture.text):
        if lost := _NO_HANDLE.search(line.text):
            logger.warning("%s: GPU %s not listed: %s", capture.source, lost.group(1), lost.group(2))
        elif "NVSMI LOG" not in line.text:
            lines.append(line)
    try:
        header, gpus = read_tree(lines, _GPU_HEADER, loose=True)
    except TableError as e:
        raise parse_error(TEXT_TOOL, e.message, capture, e.line_no, e.text) from None
    if not gpus:
        raise parse_error(TEXT_TOOL, "no `GPU <bus id>` block (truncated?)", capture)
    if section := next((key for key, value in header.items() if not isinstance(value, str)), None):
        line = next(line for line in lines if line.text.strip().rstrip(" :") == section)
        raise parse_error(TEXT_TOOL, "unexpected line outside a GPU block", capture, line.no, line.text)
    blocks = []
    for head, line, tree in gpus:
        if "Processes" not in tree:
            message = f"GPU {head.group(1)} block ends before its Processes section (truncated?)"
            raise parse_error(TEXT_TOOL, message, capture, line.no)
        paths = {k: tree_value(tree, *path.split("/")) for k, (_, path) in _PATHS.items()}
        fields = {k: value.strip() for k, value in paths.items() if value is not None}
        fields.setdefault("bus_id", head.group(1))
        blocks.append((f"GPU {head.group(1)}", fields, line.no))
    _check_attached(capture, header.get("Attached GPUs"), len(gpus), TEXT_TOOL)
    driver = _opt(header.get("Driver Version"))
    cuda = _opt(header.get("CUDA Version"))
    return _devices(blocks, driver, cuda, capture, TEXT_TOOL)
