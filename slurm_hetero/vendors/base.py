"""The narrow vendor interface: argv to run, a pure parser of captured text, cheap availability."""

from __future__ import annotations

import glob
import importlib.util
import shutil
import sys
from abc import ABC
from collections.abc import Callable, Sequence
from typing import ClassVar

from slurm_hetero.core import proc
from slurm_hetero.core.errors import HeteroError, ParseError
from slurm_hetero.core.model import Capture, Device, VendorTraits
from slurm_hetero.vendors._table import guarded


def importable(module: str) -> bool:
    """Whether `import module` would find it, without importing it (a None in sys.modules: no)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


class Vendor(ABC):
    """One accelerator vendor, registered with `@register_vendor("name")`. Live discovery and
    `--from-file` hand their captures to the same `parse`, which recognises each by its content (any
    order and combination); vendors backed by a library (NVIDIA/pynvml) override `probe()`."""

    name: ClassVar[str] = ""
    #: Vendor tools whose presence makes live discovery possible.
    tools: ClassVar[tuple[str, ...]] = ()
    #: What the rest of the suite needs to know of this vendor (`name` is set at registration).
    traits: ClassVar[VendorTraits] = VendorTraits()
    #: The default `parse`: the parser (TableError on bad text) of a tool's one output.
    parse_text: ClassVar[Callable[[str], list[Device]]]
    #: How to capture what a default table lacks (memory, model), named in parse errors.
    memory_capture_hint: ClassVar[str] = ""
    #: Device nodes whose presence shows the driver is loaded (then a missing tool is reported).
    device_glob: ClassVar[str] = ""

    #: Set at registration when an optional dependency is missing.
    unavailable_reason: str | None = None

    def affinity(self) -> int:
        """Cheap availability check, no device I/O: >0 means live discovery should be tried."""
        if self.unavailable_reason:
            return -1
        if any(shutil.which(t) for t in self.tools):
            return 1
        return 1 if self.device_glob and glob.glob(self.device_glob) else 0

    def commands(self) -> list[list[str]]:
        """The argv lists whose outputs `parse` needs (default: the first tool's default table)."""
        return [[tool] for tool in self.tools[:1]]

    def parse(self, captures: Sequence[Capture]) -> list[Device]:
        """Normalize captured outputs into devices (index order). Raises ParseError, never KeyError."""
        if len(captures) != 1:
            where = captures[1] if captures else Capture("<no capture>", "")
            raise self.parse_error(
                where, f"expected one `{self.tools[0]}` output, got {len(captures)} captures"
            )
        return guarded(self, captures[0], type(self).parse_text)

    def parse_with_model(self, captures: Sequence[Capture], model: str) -> list[Device]:
        """`parse` with the admin's model (`discover --model`), for captures that name none."""
        raise HeteroError(
            f"--model is for captures that name no model (hygon's hy-smi table); {self.name} captures "
            "name their model: leave --model out"
        )

    def probe(self) -> list[Device]:
        """Live discovery: run the vendor tools and parse what they print."""
        captures = [Capture(" ".join(argv), proc.run(argv)) for argv in self.commands()]
        return self.parse(captures)

    # helpers for parsers -------------------------------------------------------------
    def parse_error(
        self,
        capture: Capture,
        message: str,
        line_no: int | None = None,
        line: str | None = None,
        tool: str | None = None,
    ) -> ParseError:
        """A ParseError naming this vendor and the tool (default: its first)."""
        return ParseError(
            self.name, tool or (self.tools[0] if self.tools else self.name), message, capture, line_no, line
        )
