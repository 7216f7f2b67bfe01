"""Hygon DCUs (HCUs in newer releases): `hy-smi` and the DTK's `rocm-smi`, forks of AMD's rocm-smi.

Live: one `hy-smi --showproductname --showmeminfo vram --showbus --showdriverversion` (text: its
`--json` has been reported to mix in plain text), or the DTK's `rocm-smi` with the same options
where sysfs shows a Hygon (0x1d94) accelerator.

Captures are rocm-smi's formats (parsed by `_rocm`, shared with AMD) with DCU branding: `DCU[N]` /
`HCU[N]` lines, DCUn/HCUn matrix headers, and the default table `DCU Temp AvgPwr ... VRAM% DCU%`
(DTK 23.10.1), which names no model or memory: alone it is a ParseError unless the admin names the
model (`--model K100_AI`, memory from the catalog). ROCm-branded and amd-smi output is refused with
a pointer to `--vendor amd`. `file` follows AMD's /dev/dri/renderD<128+index> rule (public DTK
notes show renderD128..135).

Fixtures (tests/fixtures/hygon/): the DTK 23.10.1 default table of 4 DCUs.

Known gaps: no public `hy-smi` capture with a traceable source, so the product/memory lines are
tested on constructed text (`DCU[0] : Card Series: K100_AI`); Hygon link types (`--showtopotype`
"HSW") give no links, only "XGMI" would.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import replace
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
    traits = replace(RocmVendor.traits, stack_label="dtk")
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
