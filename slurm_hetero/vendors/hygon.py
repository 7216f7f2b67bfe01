"""Hygon DCUs (HCUs in newer releases): `hy-smi` and the DTK's `rocm-smi`, forks of AMD's rocm-smi.

Live discovery
--------------
One `hy-smi --showproductname --showmeminfo vram --showbus --showdriverversion` (text: hy-smi's
`--json` has been reported to mix plain text into the JSON), or the same options of the DTK's
`rocm-smi` when hy-smi is not on PATH. `affinity()` is 1 with hy-smi, or with rocm-smi when sysfs
shows a Hygon (PCI vendor 0x1d94) display/accelerator device; the AMD vendor steps back there.

Captures parsed (recognised by content, any order, merged per DCU index)
------------------------------------------------------------------------
The formats are rocm-smi's and are parsed by the code shared with AMD (`slurm_hetero.vendors._rocm`),
with DCU branding: a `System Management Interface` banner (no "ROCm"), `End of SMI Log` footer,
`DCU[N]` / `HCU[N]` (or `GPU[N]`) key-value lines (Card Series -> model, `vram Total Memory (MiB)`
or `VRAM Total Memory (B)` -> memory, PCI Bus, Unique ID, (Topology) Numa Node/Affinity, Driver
version), `--showtopo` matrices (GPUn, DCUn or HCUn headers accepted), the `--json` cardN layout,
and the default table `DCU Temp AvgPwr [SCLK MCLK] [Fan] Perf PwrCap VRAM% DCU% [Mode]` (the DTK
23.10.1 fixture; the bracketed columns appear in other releases and only the index is read). That
table names neither the model nor the memory, so on its own it is a ParseError asking for
`hy-smi --showproductname --showmeminfo vram` (or the DTK rocm-smi with the same options), or for
the model from the admin (`discover --vendor hygon --from-file T --model K100_AI`: `parse_with_model`
names every device so, the catalog gives the memory; a capture naming another model is an error).
ROCm-branded output and amd-smi captures are refused with a pointer to `--vendor amd`.

Device fields: vendor "hygon", model as hy-smi reports it (e.g. "K100_AI"), file
/dev/dri/renderD<128+index> (the same convention and limits as AMD's, see the amd module; public
DTK notes show an 8-DCU node with renderD128..renderD135), memory_mib, numa_node, pci_bus_id, uuid,
driver_version. The runtime exports HIP_VISIBLE_DEVICES (Slurm does not), via the TaskProlog.

Fixtures (tests/fixtures/hygon/): the DTK 23.10.1 `rocm-smi` default table of 4 DCUs from
PaddlePaddle's docs (an error case: table alone). No public `hy-smi` capture with a traceable
source turned up, so the product/memory formats are tested in tests/unit/test_vendor_hygon.py
with constructed text in the layout that hy-smi users' scripts parse (`DCU[0] : Card Series:
K100_AI`, `vram Total Memory (MiB): 65520`); that is the main gap: real hy-smi output of
`--showproductname --showmeminfo vram --showbus` has not been seen. Hygon link types
(hy-smi `--showtopotype` reports e.g. "HSW") are not turned into links; only "XGMI" would be.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from typing import ClassVar

from slurm_hetero.core.model import Capture, Device
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors._rocm import RocmVendor, accelerator_pci_vendors, parse_captures
from slurm_hetero.vendors._rocm_facts import Dialect

HYGON_PCI_VENDOR = "0x1d94"
HY_SMI_OPTIONS = ["--showproductname", "--showmeminfo", "vram", "--showbus", "--showdriverversion"]
HYGON_HINT = "hy-smi --showproductname --showmeminfo vram"

HYGON = Dialect(
    vendor="hygon",
    tool="hy-smi/rocm-smi",
    prefixes=("DCU", "HCU", "GPU"),
    hint=HYGON_HINT,
    foreign_vendor="amd",
    refuse_rocm_banner=True,
    hint_note=" (or the DTK's rocm-smi with the same options)",
    unit="DCU",
    foreign_card_vendor=r"advanced micro devices",
    model_note=(
        ", or name the model with --model (`discover --vendor hygon --from-file hy-smi.txt --model K100_AI`)"
    ),
)


@register_vendor("hygon")
class HygonVendor(RocmVendor):
    tools: ClassVar[tuple[str, ...]] = ("hy-smi", "rocm-smi")
    stack_label: ClassVar[str] = "dtk"
    memory_capture_hint: ClassVar[str] = HYGON_HINT
    dialect: ClassVar[Dialect] = HYGON
    formats: ClassVar[tuple[str, ...]] = ("json", "smi-text")

    def affinity(self) -> int:
        """1 with hy-smi; with only rocm-smi, 1 when sysfs shows a Hygon accelerator, else 0."""
        if self.unavailable_reason:
            return -1
        if shutil.which("hy-smi"):
            return 1
        if shutil.which("rocm-smi"):
            vendors = accelerator_pci_vendors(self.pci_root)
            return 1 if vendors and HYGON_PCI_VENDOR in vendors else 0
        return 0

    def commands(self) -> list[list[str]]:
        tool = "hy-smi" if shutil.which("hy-smi") else "rocm-smi"
        return [[tool, *HY_SMI_OPTIONS]]

    def parse_with_model(self, captures: Sequence[Capture], model: str) -> list[Device]:
        """The default table alone with the admin's model; memory comes from the catalog."""
        return parse_captures(captures, self.dialect, self.formats, model=model)
