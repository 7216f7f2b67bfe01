"""AMD Instinct and Radeon GPUs: the amdsmi library live, `amd-smi` / `rocm-smi` captures otherwise.

Live discovery (`probe`)
------------------------
When the `amdsmi` Python package (ROCm >= 6.0; imported lazily, only inside `probe`) imports, it is
asked per processor handle for the ASIC market name and device id, VRAM size (`vram_size`, MB;
`vram_size_mb` in older releases), PCI BDF, UUID, NUMA node and affinity, driver version, compute
and memory partition, the DRM render minor (`amdsmi_get_gpu_enumeration_info`, newer releases), and
for every pair `amdsmi_topo_get_link_type` (XGMI at one hop -> `Link(kind="xgmi")`; the XGMI code
is looked up by name, `AmdSmiLinkType` or the older `AmdSmiIoLinkType`, as AMD renumbered it). The
conversion is pure (`devices_from_amdsmi(module)`) and tested with a fake module. Without amdsmi
the tools run: `amd-smi static`, `amd-smi topology`, `amd-smi list` and `amd-smi version` when
amd-smi is on PATH, else one `rocm-smi --showproductname --showmeminfo vram --showbus
--showuniqueid --showdriverversion --showtopo --json`. Either way `cores` is then read from
/sys/bus/pci/devices/<bdf>/local_cpulist.

Captures parsed (recognised by content, any order, merged per GPU index)
------------------------------------------------------------------------
- rocm-smi `--json` (ROCm 6.0.2): cardN entries (Card series, Device ID, PCI Bus, VRAM Total
  Memory (B), Unique ID, (Topology) Numa Node/Affinity) and the `system` entry (Driver version,
  pairwise Hops / Link type between DRM devices).
- rocm-smi text, any mix of sections between the `System Management Interface` banner and the
  `End of ROCm SMI Log` footer (a missing footer is a truncated capture): `GPU[N] : key: value`
  lines (also the older `GPU N : ...` spelling) for the keys above plus Compute/Memory Partition
  and `Driver version`; the `--showtopo` matrices (Weight, Hops, Link Type) in the older (ARCHER2
  MI210, `GPU 0 :` lines) and the ROCm 7.2 (MI300, `GPU[0] :` lines) layouts; the default concise
  table in three layouts: the old `GPU Temp AvgPwr ...` one (the shape of the DTK's DCU table),
  `Device [Model : Revision]` with a name row per device (MI300X, driver 6.7.0), and
  `Device Node IDs (DID, GUID) ... Partitions (Mem, Compute, ID)` (ROCm 7.2). Columns are cut at
  the header's word positions. The concise table has no memory size and at best a device id, so on
  its own it is a ParseError asking for `rocm-smi --showproductname --showmeminfo vram`.
- amd-smi text, as in AMD's docs and CHANGELOG (amd-smi tool 23.4 / ROCm 6.1 era): `static` (CPU
  sections skipped; GPU blocks: ASIC MARKET_NAME and DEVICE_ID, BUS BDF, DRIVER VERSION, PARTITION,
  NUMA NODE/AFFINITY, VRAM SIZE; every GPU block must have the sections of the first one, or the
  capture is truncated), `list` (BDF, UUID), `topology` (BDF-addressed HOPS and LINK TYPE tables,
  mapped to indexes through another capture's BDFs) and `version` (ROCm version ->
  `runtime_version`).
Captures that only carry topology, list or version data are a ParseError naming what to add.
Captures of one node must agree on the set of GPUs and on memory, BDF, NUMA and partitions.

Device fields
-------------
`model` is the product name as reported (amd-smi MARKET_NAME, rocm-smi Card series), else the
concise table's 20-character name, else the PCI device id (e.g. "0x74a2"); the catalog fills `type`.
`memory_mib` is VRAM: rocm-smi bytes // 2**20, amd-smi "MB" taken as MiB (amdsmi divides by 2**20).
`numa_node` is the NUMA affinity when >= 0, else the KFD NUMA node. `partition_mode` is
"<compute>/<memory>", e.g. "SPX/NPS1". `uuid` is amd-smi's UUID or rocm-smi's Unique ID.
`file` is /dev/dri/renderD<128+index>: the amdgpu driver numbers render nodes from 128 in probe
order, which matches the tools' GPU index only when every DRM device on the node is one of these
GPUs, each with one render node. It breaks with another GPU driver or display device that owns a
render node, and on MI300-class nodes that reserve render minors per partition (a public MI300X
guide shows renderD128..renderD184 in steps of 8). Live amdsmi with enumeration info uses the
real minor; otherwise check /sys/bus/pci/devices/<pci_bus_id>/drm before trusting gres.conf.

Fixtures (tests/fixtures/amd/, provenance in each .source): rocm-smi JSON of 4x MI100 (ROCm 6.0.2);
an 8x MI300-series concise table + `-u --showmeminfo vram` + `--showtopo` of one node (the merged
golden case); `--showtopo` of a 4x MI210 ARCHER2 node; a 4x MI300X concise table with name rows and
`rocm-smi -a` of the same node; AMD's documented `amd-smi static` (4x MI300A with CPU sections),
`amd-smi list`, `amd-smi topology` and `amd-smi version`. Captures without memory are error cases
there and are also parsed directly in tests/unit/test_vendor_amd.py.

Known gaps: amd-smi and rocm-smi `--json` layouts other than the ones above are not parsed (amd-smi
text is used); partitioned GPUs (CPX/DPX) appear as the tools list them, without parent grouping;
xGMI link counts per pair are unknown (count=1); health is always ok (RAS counters are not read);
the concise table's truncated names are used only when nothing better is captured. Not checked
against live hardware in this change.

Code: `_rocm` (format detection, capture merging and sysfs reads, shared with Hygon), `_rocm_facts`
(Dialect, Facts and value rules), `_rocm_smi` (rocm-smi / hy-smi parsers), `_amd_smi` (amd-smi text
parsers), `_amdsmi` (the library probe); this module holds the vendor, its commands and affinity.
"""

from __future__ import annotations

import importlib.util
import shutil
from typing import ClassVar

from slurm_hetero.core.model import Device
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors._amdsmi import devices_from_amdsmi, load_amdsmi
from slurm_hetero.vendors._rocm import PARSERS, RocmVendor, accelerator_pci_vendors, with_local_cpus
from slurm_hetero.vendors._rocm_facts import Dialect

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
    slurm_autodetect: ClassVar[str | None] = "rsmi"
    stack_label: ClassVar[str] = "rocm"
    ucc_memory: ClassVar[bool] = True
    memory_capture_hint: ClassVar[str] = ROCM_HINT
    dialect: ClassVar[Dialect] = AMD
    formats: ClassVar[tuple[str, ...]] = tuple(PARSERS)

    def affinity(self) -> int:
        """2 with amdsmi, 1 with a tool; 0 when sysfs shows no AMD GPU (a Hygon node's DTK rocm-smi)."""
        if self.unavailable_reason:
            return -1
        try:
            has_library = importlib.util.find_spec("amdsmi") is not None
        except (ImportError, ValueError):
            has_library = False
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
