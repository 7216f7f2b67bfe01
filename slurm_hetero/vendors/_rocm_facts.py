"""The vocabulary of the AMD and Hygon parsers: `Dialect` (what differs between AMD's tools and
Hygon's forks), `Facts` (one GPU), `Parsed` (one capture) and the value rules they all apply.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slurm_hetero.core.errors import ParseError
from slurm_hetero.core.model import Capture

_NA = {"", "n/a", "na", "none", "unknown", "not supported", "unsupported", "<redacted>"}
BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
HEX_ID = re.compile(r"^0x[0-9a-f]+$")
_VRAM_TOTAL = re.compile(r"^vram total memory \((b|mib|mb)\)$", re.I)
UNIT_MIB = {"b": 1 / 2**20, "mb": 1, "mib": 1, "gb": 1024, "gib": 1024}
_KV_FIELDS = {
    "card series": "name",
    "device id": "device_id",
    "pci bus": "bdf",
    "unique id": "uuid",
    "(topology) numa node": "numa_node",
    "(topology) numa affinity": "numa_affinity",
    "compute partition": "compute_partition",
    "memory partition": "memory_partition",
}
# Fields that captures of one node must agree on; the others keep the first value seen.
_STRICT = ("memory_mib", "bdf", "numa_node", "numa_affinity", "compute_partition", "memory_partition")


@dataclass(frozen=True)
class Dialect:
    """What differs between AMD's tools and Hygon's forks of them: names, index prefixes, hints."""

    vendor: str
    tool: str
    prefixes: tuple[str, ...]
    hint: str
    foreign_vendor: str
    foreign_prefixes: tuple[str, ...] = ()
    refuse_rocm_banner: bool = False
    hint_note: str = ""
    unit: str = "GPU"
    foreign_card_vendor: str = r"haiguang|hygon"
    model_note: str = ""  # appended to the advice when a table names no model or memory

    def advice(self, hint: str) -> str:
        """`also capture ...` for an error message (the dialect's note only with its own hint)."""
        return f"also capture `{hint}`{self.hint_note if hint == self.hint else ''} on the same node"

    def error(
        self,
        capture: Capture,
        message: str,
        line_no: int | None = None,
        line: str | None = None,
        tool: str | None = None,
    ) -> ParseError:
        return ParseError(self.vendor, tool or self.tool, message, capture, line_no, line)


@dataclass
class Facts:
    """What the captures say about one GPU. None: not reported."""

    name: str | None = None
    short_name: str | None = None
    device_id: str | None = None
    memory_mib: int | None = None
    bdf: str | None = None
    numa_node: int | None = None
    numa_affinity: int | None = None
    cores: str | None = None
    uuid: str | None = None
    compute_partition: str | None = None
    memory_partition: str | None = None
    driver_version: str | None = None
    render_minor: int | None = None


@dataclass
class Parsed:
    """One capture, normalized. Link keys are GPU indexes, or PCI addresses when `by_bdf`."""

    capture: Capture
    tool: str
    what: str
    gpus: dict[int, Facts] = field(default_factory=dict)
    link_kind: dict[tuple[Any, Any], str] = field(default_factory=dict)
    hops: dict[tuple[Any, Any], int] = field(default_factory=dict)
    by_bdf: bool = False
    driver_version: str | None = None
    runtime_version: str | None = None
    first_line: dict[int, int] = field(default_factory=dict)

    def gpu(self, index: int, line_no: int | None = None) -> Facts:
        """The facts of GPU `index`, created on first use (`line_no`: where it first appears)."""
        if line_no is not None:
            self.first_line.setdefault(index, line_no)
        return self.gpus.setdefault(index, Facts())

    def where(self, index: int) -> tuple[int | None, str | None]:
        """Line number and text where GPU `index` first appears in this capture, if known."""
        no = self.first_line.get(index)
        lines = self.capture.text.splitlines()
        return (no, lines[no - 1]) if no is not None and no <= len(lines) else (None, None)


# value helpers ---------------------------------------------------------------------------------
def clean(value: Any) -> str | None:
    """A reported string, or None for N/A-like placeholders."""
    if value is None:
        return None
    text = str(value).strip()
    return None if text.lower() in _NA else text


def set_fact(facts: Facts, name: str, value: Any, fail: Callable[[str], ParseError]) -> None:
    """Set one fact; a second, different value for a strict field is a ParseError."""
    if value is None:
        return
    old = getattr(facts, name)
    if old is None:
        setattr(facts, name, value)
    elif old != value and name in _STRICT:
        raise fail(f"conflicting {name.replace('_', ' ')}: {old!r} and {value!r}")


def convert_fact(name: str, raw: str, fail: Callable[[str], ParseError]) -> Any:
    """Check and normalize one reported value for the Facts field `name`."""
    value = clean(raw)
    if value is None:
        return None
    if name in ("numa_node", "numa_affinity"):
        if not re.fullmatch(r"-?\d+", value):
            raise fail(f"NUMA value {value!r} is not a number")
        return int(value) if int(value) >= 0 else None
    if name == "bdf":
        return _checked(value.lower(), BDF, "PCI address", fail)
    if name == "device_id":
        return _checked(value.lower(), HEX_ID, "device id", fail)
    return value.upper() if name.endswith("_partition") else value


def _checked(value: str, pattern: re.Pattern[str], what: str, fail: Callable[[str], ParseError]) -> str:
    if not pattern.match(value):
        raise fail(f"{what} {value!r} is malformed")
    return value


def memory_mib(amount: str, unit: str, fail: Callable[[str], ParseError]) -> int | None:
    """VRAM size in MiB from a number and its unit (B, MB, MiB, GB)."""
    if clean(amount) is None:
        return None
    if not re.fullmatch(r"\d+(\.\d+)?", amount.strip()):
        raise fail(f"memory size {amount!r} is not a number")
    factor = UNIT_MIB[unit.lower()]
    number = amount.strip()
    mib = int(number) // 2**20 if factor < 1 and number.isdigit() else int(float(number) * factor)
    if mib <= 0:
        raise fail(f"memory size {amount} {unit} is not positive")
    return mib


def apply_kv(facts: Facts, key: str, raw: str, fail: Callable[[str], ParseError], dialect: Dialect) -> None:
    """Apply one `key: value` pair of rocm-smi / hy-smi (text or JSON) to a GPU's facts."""
    key = key.strip()
    if key.lower() == "card vendor" and re.search(dialect.foreign_card_vendor, raw, re.I):
        raise fail(f"card vendor {raw.strip()!r}: use --vendor {dialect.foreign_vendor}")
    if match := _VRAM_TOTAL.match(key):
        set_fact(facts, "memory_mib", memory_mib(raw, match.group(1), fail), fail)
    elif (name := _KV_FIELDS.get(key.lower())) is not None:
        set_fact(facts, name, convert_fact(name, raw, fail), fail)
