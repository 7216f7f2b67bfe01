"""NVIDIA GPUs: NVML through pynvml for live discovery, `nvidia-smi` captures for `--from-file`.

Live (`_nvml`): name, minor number (-> `index`, /dev/nvidia<minor>), memory, UUID, bus id, CPU
affinity, MIG mode, retired pages and row remapping (-> health), and active NVLinks (NVSwitch pairs
get min(links of each), as `topo -m` prints it). `numa_node` is sysfs `numa_node`, else
nvmlDeviceGetMemoryAffinity; never nvmlDeviceGetNumaNodeId, the GPU's own memory node on GH200.

Captures (by content, any order):
- `nvidia-smi -q -x` XML, DTD v12 (driver 535) and v13 (595); fewer <gpu> blocks than
  `attached_gpus` (a trimmed capture) only warns.
- `nvidia-smi -q` / `-a` text (driver 545): each GPU block must reach `Processes`.
- `nvidia-smi --query-gpu=... --format=csv` with a header (`_nvidia_csv`).
- `nvidia-smi topo -m` / `-mp` (`_nvidia_topo`): NV# -> nvlink count; GPU<k> is the k-th GPU of the
  listing, so both must come from one node. Topology or `mig -lgip` without a listing is a
  ParseError, except with `discover --model` (GPU<k> becomes /dev/nvidia<k> of that model).
- health: lost identity fields, retired pages or row remapping pending or failed, reset required
  or recommended, a recovery action, an NVLink fabric not ready or failed.

Fixtures: tests/fixtures/nvidia/ (provenance in each .source); the topo captures come from no
listing's node, so tests/unit/test_vendor_nvidia.py tests them directly.

Known gaps: MIG instances are not devices (the GPU gets partition_mode "mig"); a GPU without a
readable minor number is skipped with a warning; a matrix with any blank CPU Affinity (interleaved
CPU numbering) gives no `cores`; the default table and `-L` are refused (no minor numbers).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

from slurm_hetero.core.errors import HeteroError, ParseError
from slurm_hetero.core.model import Capture, Device, VendorTraits
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors._nvidia_csv import is_query_csv, parse_query_csv
from slurm_hetero.vendors._nvidia_smi import (
    TEXT_TOOL,
    TOPO_TOOL,
    VENDOR,
    XML_TOOL,
    parse_error,
    parse_smi_text,
    parse_smi_xml,
)
from slurm_hetero.vendors._nvidia_topo import Topology, apply_topology, parse_topology, topo_start
from slurm_hetero.vendors._nvml import devices_from_nvml, read_nvml
from slurm_hetero.vendors.base import Vendor, importable

logger = logging.getLogger(__name__)


def classify(capture: Capture) -> str | None:
    """Which nvidia-smi output a capture is: xml, text, topo, mig-profiles, table, gpu-list; None."""
    text = capture.text
    head = "\n".join(line for line in text.splitlines()[:8] if line.strip())
    if text.lstrip("\ufeff \t\r\n").startswith(("<?xml", "<!DOCTYPE nvidia_smi_log", "<nvidia_smi_log")):
        return "xml"
    if "=NVSMI LOG=" in head:
        return "text"
    if topo_start(text.splitlines()) is not None:
        return "topo"
    if "GPU instance profiles:" in head:
        return "mig-profiles"
    if is_query_csv(text):
        return "csv"
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
        return parse_error("nvidia-smi", _REFUSED[kind], capture, 1)
    lines = capture.text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return parse_error("nvidia-smi", "empty capture", capture)
    return parse_error(
        "nvidia-smi",
        f"not `{XML_TOOL}`, `{TEXT_TOOL}` or `{TOPO_TOOL}` output",
        capture,
        first + 1,
        lines[first],
    )


_LISTINGS = {"xml": parse_smi_xml, "text": parse_smi_text, "csv": parse_query_csv}  # kind -> its parser
_NOT_A_LISTING = {
    "topo": (TOPO_TOOL, "topology alone"),
    "mig-profiles": ("nvidia-smi mig -lgip", "a MIG profile table"),
}
DEV = Path("/dev")
PROC_DRIVER = Path("/proc/driver/nvidia/version")


@register_vendor("nvidia")
class NvidiaVendor(Vendor):
    tools = ("nvidia-smi",)
    memory_capture_hint = XML_TOOL
    traits = VendorTraits(
        torch_backend="nccl",
        stack_label="cuda",
        ucc_memory=True,
        ccl_env_prefix="NCCL",
        slurm_gpu_env="nvidia_gpu_env",  # CUDA_VISIBLE_DEVICES only
        slurm_autodetect="nvml",
    )

    def affinity(self) -> int:
        """2 with pynvml importable and the NVIDIA driver present (nvmlInit can work), else 0; the
        driver's signs need no device I/O: device nodes, or the loaded module's version file."""
        driver = (DEV / "nvidiactl").exists() or any(DEV.glob("nvidia[0-9]*")) or PROC_DRIVER.exists()
        return 2 if importable("pynvml") and driver else 0

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
            if kind in _LISTINGS:
                listings.append((capture, _LISTINGS[kind](capture)))
            elif kind == "topo":
                topologies.append(parse_topology(capture))
            elif kind == "mig-profiles":
                logger.info("%s: MIG profile table ignored (it lists no devices)", capture.source)
            else:
                raise _refuse(capture, kind)
        if not listings:
            tool, what = _NOT_A_LISTING[classify(captures[0]) or "topo"]
            raise parse_error(tool, f"{what} has no device list; also capture `{XML_TOOL}`", captures[0])
        if len(listings) > 1:
            names = " and ".join(c.source for c, _ in listings)
            raise parse_error(XML_TOOL, f"two device listings ({names}); pass one per node", listings[1][0])
        listing, devices = listings[0]
        for topo in topologies:
            devices = apply_topology(devices, topo, listing.source)
        return sorted(devices, key=lambda d: d.index)

    def parse_with_model(self, captures: Sequence[Capture], model: str) -> list[Device]:
        """Topology matrices alone with the admin's model: GPU<k> is /dev/nvidia<k> (nvidia-smi's order
        is the minor number's on a node without MIG), memory from the catalog."""
        topologies: list[Topology] = []
        for capture in captures:
            if classify(capture) != "topo":
                raise parse_error(
                    TOPO_TOOL,
                    "--model is for `nvidia-smi topo -m` captures alone (a device listing names its model: "
                    "leave --model out)",
                    capture,
                )
            topologies.append(parse_topology(capture))
        source = topologies[0].source
        devices = [
            Device(VENDOR, model, gpu.position, f"/dev/nvidia{gpu.position}") for gpu in topologies[0].gpus
        ]
        for topo in topologies:
            devices = apply_topology(devices, topo, source)
        return devices
