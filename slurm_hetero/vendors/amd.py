"""AMD Instinct and Radeon GPUs: the amdsmi library live, `amd-smi` / `rocm-smi` captures otherwise.

Live: the `amdsmi` package (ROCm >= 6.0, imported only in `probe`) per processor handle: market
name, device id, VRAM (`vram_size`, older `vram_size_mb`), BDF, UUID, NUMA, driver, partitions,
DRM render minor (newer releases) and one-hop XGMI links (`amdsmi_topo_get_link_type`; the XGMI
code is looked up by name, as AMD renumbered it). Without it: `amd-smi static|topology|list|version`
when amd-smi is on PATH, else one `rocm-smi ... --showtopo --json`. `cores` comes from sysfs
`local_cpulist`.

Captures (recognised by content, any order, merged per GPU index):
- rocm-smi `--json` (ROCm 6.0.2): cardN entries and the `system` entry (driver, Hops, Link type).
- rocm-smi text between the banner and the `End of ROCm SMI Log` footer (no footer: truncated):
  `GPU[N] : key: value` lines (also `GPU N :`), `--showtopo` matrices (ARCHER2 MI210 and ROCm 7.2
  layouts) and the concise table in three layouts (old `GPU Temp AvgPwr`, `Device [Model :
  Revision]` with name rows, ROCm 7.2 `Device Node IDs ... Partitions`), cut at the header's word
  positions. It has no memory size, so alone it is a ParseError asking for `rocm-smi
  --showproductname --showmeminfo vram`.
- amd-smi text (tool 23.4 / ROCm 6.1, from AMD's docs): `static` (CPU sections skipped; every GPU
  block must have the first one's sections), `list`, `topology` (BDF-addressed tables) and
  `version` (ROCm version -> `runtime_version`).
Topology, list or version alone is a ParseError naming what to add; captures of one node must
agree on the GPUs and on memory, BDF, NUMA and partitions.

Fields: `model` is the product name, else the concise table's short name, else the PCI device id
(the catalog fills `type`); `memory_mib` is VRAM (amd-smi "MB" taken as MiB); `numa_node` the NUMA
affinity when >= 0, else the KFD node; `partition_mode` "<compute>/<memory>" ("SPX/NPS1").
`file` is /dev/dri/renderD<128+index> (or the live render minor): right only when every DRM device
of the node is one of these GPUs with one render node each; another GPU driver, a display device,
or MI300 partitions (renderD128..184 in steps of 8 in one guide) break it, so check
/sys/bus/pci/devices/<pci_bus_id>/drm before trusting gres.conf.

Fixtures: tests/fixtures/amd/ (provenance in each .source).

Known gaps: other amd-smi / rocm-smi JSON layouts; CPX/DPX partitions are listed without their
parent; xGMI counts per pair (count=1); health is always ok (RAS counters are not read).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from typing import ClassVar

from slurm_hetero.core.model import Device
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors._amdsmi import devices_from_amdsmi, load_amdsmi
from slurm_hetero.vendors._rocm import PARSERS, RocmVendor, accelerator_pci_vendors, with_local_cpus
from slurm_hetero.vendors._rocm_facts import Dialect
from slurm_hetero.vendors.base import importable

AMD_PCI_VENDOR = "0x1002"
ROCM_SMI_ARGV = [
    "rocm-smi",
    "--showproductname",
    "--showmeminfo",
    "vram",
    "--showbus",
    "--showuniqueid",
    "--showdriverversion",
    "--showtopo",
    "--json",
]
AMD_SMI_ARGVS = [["amd-smi", "static"], ["amd-smi", "topology"], ["amd-smi", "list"], ["amd-smi", "version"]]
ROCM_HINT = "rocm-smi --showproductname --showmeminfo vram"

AMD = Dialect("amd", "rocm-smi", ("GPU",), ROCM_HINT, "hygon", foreign_prefixes=("DCU", "HCU"))


@register_vendor("amd")
class AmdVendor(RocmVendor):
    tools: ClassVar[tuple[str, ...]] = ("amd-smi", "rocm-smi")
    traits = replace(RocmVendor.traits, slurm_autodetect="rsmi", stack_label="rocm", ucc_memory=True)
    memory_capture_hint: ClassVar[str] = ROCM_HINT
    dialect: ClassVar[Dialect] = AMD
    formats: ClassVar[tuple[str, ...]] = tuple(PARSERS)

    def affinity(self) -> int:
        """2 with amdsmi, 1 with a tool; 0 when sysfs shows no AMD GPU (a Hygon node's DTK rocm-smi)."""
        if self.unavailable_reason:
            return -1
        has_library = importable("amdsmi")
        if not has_library and not any(shutil.which(t) for t in self.tools):
            return 0
        vendors = accelerator_pci_vendors(self.pci_root)
        if vendors is not None and AMD_PCI_VENDOR not in vendors:
            return 0
        return 2 if has_library else 1

    def commands(self) -> list[list[str]]:
        if shutil.which("amd-smi"):
            return [list(argv) for argv in AMD_SMI_ARGVS]
        return [list(ROCM_SMI_ARGV)]

    def probe(self) -> list[Device]:
        module = load_amdsmi()
        if module is not None:
            return with_local_cpus(devices_from_amdsmi(module), self.pci_root)
        return super().probe()
