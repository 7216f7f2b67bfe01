"""AMD Instinct and Radeon GPUs: the amdsmi library live, `amd-smi` / `rocm-smi` captures otherwise.

Live: `amdsmi` (ROCm >= 6.0, imported only in `probe`): name, device id, VRAM (`vram_size`, older
`vram_size_mb`), BDF, UUID, NUMA, driver, partitions, render minor, one-hop XGMI links (the XGMI
code is looked up by name: AMD renumbered it). Without it: `amd-smi static|topology|list|version`,
else one `rocm-smi ... --showtopo --json`. `cores` comes from sysfs `local_cpulist`.

Captures (by content, any order, merged per GPU index; one node's must agree on GPUs, memory, BDF,
NUMA and partitions):
- rocm-smi `--json` (ROCm 6.0.2): cardN entries and `system` (driver, Hops, Link type).
- rocm-smi text up to the `End of ROCm SMI Log` footer: `GPU[N] : key: value` lines, `--showtopo`
  matrices (ARCHER2 MI210, ROCm 7.2) and the concise table in three layouts (`GPU Temp AvgPwr`,
  `Device [Model : Revision]`, ROCm 7.2 `Device Node IDs ... Partitions`). It has no memory size:
  alone it is a ParseError asking for `rocm-smi --showproductname --showmeminfo vram`.
- amd-smi 23.4 / ROCm 6.1 text (AMD's docs): `static`, `list`, `topology` (BDF-addressed) and
  `version` (-> `runtime_version`); topology, list or version alone is a ParseError.

Fields: `model` is the product name, else the concise table's name, else the PCI device id;
`memory_mib` is VRAM (amd-smi "MB" taken as MiB); `numa_node` the NUMA affinity when >= 0, else the
KFD node; `partition_mode` "<compute>/<memory>" ("SPX/NPS1"). `file` is /dev/dri/renderD<128+index>
(or the live render minor): right only when every DRM device of the node is one of these GPUs with
one render node each (another GPU driver, a display device or MI300 partitions break it), so check
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
        if (module := load_amdsmi()) is not None:
            return with_local_cpus(devices_from_amdsmi(module), self.pci_root)
        return super().probe()
