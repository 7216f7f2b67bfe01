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
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import logging
import re
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from slurm_hetero import proc
from slurm_hetero.errors import HeteroError, ParseError
from slurm_hetero.model import Capture, Device, Link
from slurm_hetero.vendors import register_vendor
from slurm_hetero.vendors.base import Vendor

logger = logging.getLogger(__name__)

RENDER_MINOR_BASE = 128
PCI_ROOT = Path("/sys/bus/pci/devices")
AMD_PCI_VENDOR = "0x1002"
HYGON_PCI_VENDOR = "0x1d94"
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
AMD_SMI_HINT = "amd-smi static"

_NA = {"", "n/a", "na", "none", "unknown", "not supported", "unsupported", "<redacted>"}
_BANNER = re.compile(r"^=+\s*(ROCm\s+)?System Management Interface\s*=+\s*$")
_FOOTER = re.compile(r"^=+\s*End of (ROCm )?SMI Log\s*=+\s*$")
_SECTION = re.compile(r"^=+\s*(.*?)\s*=+\s*$")
_RULE = re.compile(r"^=+\s*$")
_ROW = re.compile(r"^\d+(\s|$)")
_BLOCK = re.compile(r"^(GPU|CPU|CORE): (\d+)\s*$")
_TREE_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_][^:]*?):(?: (?P<value>.*))?$")
_TOPO_TABLE = re.compile(r"^(ACCESS|WEIGHT|HOPS|LINK TYPE|NUMA BW) TABLE:\s*$")
_AMDSMI_VERSION = re.compile(r"^AMDSMI Tool: .*\bROCm version: (?P<rocm>\S+)")
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HEX_ID = re.compile(r"^0x[0-9a-f]+$")
_CPULIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_TOPO_PAIR = re.compile(r"^\(Topology\) (Weight|Hops|Link type) between DRM devices (\d+) and (\d+)$", re.I)
_VRAM_TOTAL = re.compile(r"^vram total memory \((b|mib|mb)\)$", re.I)
_MIB = {"b": 1 / 2**20, "mb": 1, "mib": 1, "gb": 1024, "gib": 1024}
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
# amd-smi static / list: Facts field <- path in a `GPU: N` block
_AMDSMI_FIELDS = (
    ("device_id", ("ASIC", "DEVICE_ID")),
    ("bdf", ("BUS", "BDF")),
    ("bdf", ("BDF",)),
    ("uuid", ("UUID",)),
    ("driver_version", ("DRIVER", "VERSION")),
    ("compute_partition", ("PARTITION", "COMPUTE_PARTITION")),
    ("memory_partition", ("PARTITION", "MEMORY_PARTITION")),
    ("numa_node", ("NUMA", "NODE")),
)
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
        return ParseError(self.vendor, tool or self.tool, message, capture.source, line_no, line)


AMD = Dialect("amd", "rocm-smi", ("GPU",), ROCM_HINT, "hygon", foreign_prefixes=("DCU", "HCU"))


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


def _set(facts: Facts, name: str, value: Any, fail: Callable[[str], ParseError]) -> None:
    """Set one fact; a second, different value for a strict field is a ParseError."""
    if value is None:
        return
    old = getattr(facts, name)
    if old is None:
        setattr(facts, name, value)
    elif old != value and name in _STRICT:
        raise fail(f"conflicting {name.replace('_', ' ')}: {old!r} and {value!r}")


def _convert(name: str, raw: str, fail: Callable[[str], ParseError]) -> Any:
    """Check and normalize one reported value for the Facts field `name`."""
    value = clean(raw)
    if value is None:
        return None
    if name in ("numa_node", "numa_affinity"):
        if not re.fullmatch(r"-?\d+", value):
            raise fail(f"NUMA value {value!r} is not a number")
        return int(value) if int(value) >= 0 else None
    if name == "bdf":
        return _checked(value.lower(), _BDF, "PCI address", fail)
    if name == "device_id":
        return _checked(value.lower(), _HEX_ID, "device id", fail)
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
    factor = _MIB[unit.lower()]
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
        _set(facts, "memory_mib", memory_mib(raw, match.group(1), fail), fail)
    elif (name := _KV_FIELDS.get(key.lower())) is not None:
        _set(facts, name, _convert(name, raw, fail), fail)


# format detection ------------------------------------------------------------------------------
def detect(capture: Capture, dialect: Dialect) -> str:
    """Which output a capture is: json, smi-text, amd-smi-blocks, amd-smi-topology, amd-smi-version."""
    lines = capture.text.splitlines()
    if not capture.text.strip():
        raise dialect.error(capture, "empty capture")
    if capture.text.lstrip().startswith("{"):
        return "json"
    checks = (
        ("smi-text", _BANNER),
        ("amd-smi-blocks", _BLOCK),
        ("amd-smi-topology", _TOPO_TABLE),
        ("amd-smi-version", _AMDSMI_VERSION),
    )
    for kind, pattern in checks:
        if any(pattern.match(line) for line in lines):
            return kind
    first = next(line for line in lines if line.strip())
    raise dialect.error(capture, f"not a {dialect.tool} or amd-smi capture this parser knows", 1, first)


# rocm-smi / hy-smi JSON ------------------------------------------------------------------------
def parse_smi_json(capture: Capture, dialect: Dialect) -> Parsed:
    """`rocm-smi ... --json` (and hy-smi's): cardN objects plus an optional `system` object."""
    try:
        data = json.loads(capture.text)
    except json.JSONDecodeError as e:
        raise dialect.error(capture, f"malformed JSON: {e.msg}", e.lineno) from None
    except RecursionError:
        raise dialect.error(capture, "malformed JSON: nested too deeply", 1) from None
    if not isinstance(data, dict):
        raise dialect.error(capture, "JSON top level is not an object", 1)
    parsed = Parsed(capture, dialect.tool, f"{dialect.tool} --json")
    for key, value in data.items():
        card = re.fullmatch(r"card(\d+)", str(key))
        if card or key == "system":
            if not isinstance(value, dict):
                raise dialect.error(capture, f"JSON entry {key!r} is not an object", None, str(key))
            _json_entry(parsed, int(card.group(1)) if card else None, value, dialect)
    if not parsed.gpus:
        raise dialect.error(capture, "no cardN entries in the JSON", 1)
    return parsed


def _json_entry(parsed: Parsed, index: int | None, entry: Mapping[str, Any], dialect: Dialect) -> None:
    for key, value in entry.items():

        def fail(message: str, key: str = key) -> ParseError:
            return dialect.error(parsed.capture, message, None, key)

        if not isinstance(value, str | int | float):
            continue
        if index is not None:
            apply_kv(parsed.gpu(index), key, str(value), fail, dialect)
        elif key.lower() == "driver version":
            parsed.driver_version = clean(value)
        elif match := _TOPO_PAIR.match(key):
            _topology_pair(parsed, match, str(value), fail)


def _topology_pair(
    parsed: Parsed, match: re.Match[str], value: str, fail: Callable[[str], ParseError]
) -> None:
    kind, a, b = match.group(1).lower(), int(match.group(2)), int(match.group(3))
    for pair in ((a, b), (b, a)):
        if kind == "link type":
            parsed.link_kind[pair] = value.strip().upper()
        elif kind == "hops":
            if not value.strip().isdigit():
                raise fail(f"hop count {value!r} is not a number")
            parsed.hops[pair] = int(value)


# rocm-smi / hy-smi text ------------------------------------------------------------------------
def parse_smi_text(capture: Capture, dialect: Dialect) -> Parsed:
    """Banner-framed rocm-smi / hy-smi text: key-value lines, topology matrices, concise tables."""
    lines = capture.text.splitlines()
    _check_footer(capture, lines, dialect)
    _check_foreign(capture, lines, dialect)
    parsed = Parsed(capture, dialect.tool, f"{dialect.tool} text")
    title, i = "", 0
    while i < len(lines):
        line = lines[i]
        if _RULE.match(line) or _BANNER.match(line) or _FOOTER.match(line):
            i += 1
        elif section := _SECTION.match(line):
            title, i = section.group(1), i + 1
        elif _is_concise_header(line, dialect):
            i = _parse_concise(parsed, lines, i, dialect)
        elif _is_matrix_header(line, dialect):
            i = _parse_matrix(parsed, lines, i, title, dialect)
        else:
            _parse_text_line(parsed, line, i + 1, dialect)
            i += 1
    if not parsed.gpus:
        raise dialect.error(capture, "no per-GPU lines between the banner and the footer", 1, lines[0])
    return parsed


def _check_footer(capture: Capture, lines: list[str], dialect: Dialect) -> None:
    banners = [i for i, line in enumerate(lines) if _BANNER.match(line)]
    footers = [i for i, line in enumerate(lines) if _FOOTER.match(line)]
    if not banners or len(footers) < len(banners) or banners[-1] > footers[-1]:
        raise dialect.error(
            capture,
            "no 'End of SMI Log' footer after the last banner: output truncated?",
            len(lines),
            lines[-1],
        )


def _check_foreign(capture: Capture, lines: list[str], dialect: Dialect) -> None:
    """Refuse the other vendor's branding (Hygon DCU/HCU lines for AMD, ROCm banners for Hygon)."""
    for no, line in enumerate(lines, 1):
        words = line.split()
        rocm_banner = dialect.refuse_rocm_banner and bool(_BANNER.match(line)) and "ROCm" in line
        if rocm_banner or (words and any(re.match(rf"^{p}\b", words[0]) for p in dialect.foreign_prefixes)):
            raise dialect.error(
                capture,
                f"this looks like {dialect.foreign_vendor} output; use --vendor {dialect.foreign_vendor}",
                no,
                line,
            )


def _index_pattern(dialect: Dialect) -> str:
    return "|".join(dialect.prefixes)


def _parse_text_line(parsed: Parsed, line: str, no: int, dialect: Dialect) -> None:
    def fail(message: str) -> ParseError:
        return dialect.error(parsed.capture, message, no, line)

    gpu = re.match(rf"^(?:{_index_pattern(dialect)})\[?\s*(\d+)\]?\s*:\s?(.*)$", line)
    if gpu:
        key, sep, value = gpu.group(2).partition(":")
        if sep:
            apply_kv(parsed.gpu(int(gpu.group(1)), no), key, value, fail, dialect)
    elif line.lower().startswith("driver version:"):
        parsed.driver_version = clean(line.split(":", 1)[1])


def _is_matrix_header(line: str, dialect: Dialect) -> bool:
    cells = line.split()
    pattern = rf"(?:{_index_pattern(dialect)})\d+"
    return bool(cells) and line[:1].isspace() and all(re.fullmatch(pattern, c) for c in cells)


def _parse_matrix(parsed: Parsed, lines: list[str], start: int, title: str, dialect: Dialect) -> int:
    """A `--showtopo` GPU x GPU matrix; returns the index of the first line after it."""
    header = [int(re.sub(r"\D", "", c)) for c in lines[start].split()]
    rows: dict[int, list[str]] = {}
    i = start + 1
    while i < len(lines) and re.match(rf"^(?:{_index_pattern(dialect)})\d+\s", lines[i]):
        cells = lines[i].split()
        if len(cells) != len(header) + 1:
            raise dialect.error(
                parsed.capture,
                f"matrix row has {len(cells) - 1} cells for {len(header)} {dialect.unit}s",
                i + 1,
                lines[i],
            )
        rows[int(re.sub(r"\D", "", cells[0]))] = cells[1:]
        i += 1
    if sorted(rows) != sorted(header):
        raise dialect.error(
            parsed.capture,
            f"{title or 'topology'} matrix is incomplete: output truncated?",
            i + 1 if i < len(lines) else len(lines),
            lines[min(i, len(lines) - 1)],
        )
    for src in rows:
        parsed.gpu(src, start + 1)
    _store_matrix(parsed, header, rows, title, lambda m: dialect.error(parsed.capture, m, start + 1))
    if parsed.what.endswith(" text"):
        parsed.what = f"{parsed.tool} --showtopo"
    return i


def _store_matrix(
    parsed: Parsed,
    header: list[int],
    rows: dict[int, list[str]],
    title: str,
    fail: Callable[[str], ParseError],
) -> None:
    kind = "link" if "link type" in title.lower() else "hops" if "hops" in title.lower() else ""
    for src, cells in rows.items():
        parsed.gpu(src)
        for dst, cell in zip(header, cells, strict=True):
            if src == dst:
                continue
            if kind == "link":
                parsed.link_kind[(src, dst)] = cell.upper()
            elif kind == "hops":
                if not cell.isdigit():
                    raise fail(f"hop count {cell!r} is not a number")
                parsed.hops[(src, dst)] = int(cell)


# concise (default) table -----------------------------------------------------------------------
def _is_concise_header(line: str, dialect: Dialect) -> bool:
    cells = line.split()
    return bool(cells) and cells[0] in ("Device", *dialect.prefixes) and "PwrCap" in cells


def _columns(header: str) -> list[tuple[str, int, int]]:
    """(name, start, end) of each column; names are separated by two or more spaces."""
    spans = [(m.group(0), m.start()) for m in re.finditer(r"\S+(?: \S+)*", header)]
    return [
        (name, start, spans[k + 1][1] if k + 1 < len(spans) else 10**6)
        for k, (name, start) in enumerate(spans)
    ]


def _parse_concise(parsed: Parsed, lines: list[str], start: int, dialect: Dialect) -> int:
    """The default table; rows come before the next rule, or after a subheader and a rule."""
    columns = _columns(lines[start])
    body, i = _until_rule(parsed, lines, start + 1, dialect)
    if not any(_ROW.match(line) for _, line in body):
        body, i = _until_rule(parsed, lines, i + 1, dialect)
    index: int | None = None
    for no, line in body:
        if _ROW.match(line):
            index = _concise_row(parsed, columns, line, no, dialect)
        elif line[:1].isspace() and line.strip() and index is not None:
            _concise_name_row(parsed.gpu(index), columns, line)
        elif line.strip():
            raise dialect.error(parsed.capture, "unexpected line in the device table", no, line)
    if index is None:
        raise dialect.error(parsed.capture, "device table without rows", start + 1, lines[start])
    return i


def _until_rule(
    parsed: Parsed, lines: list[str], start: int, dialect: Dialect
) -> tuple[list[tuple[int, str]], int]:
    for i in range(start, len(lines)):
        if lines[i].startswith("="):
            return [(no + 1, lines[no]) for no in range(start, i)], i
    raise dialect.error(parsed.capture, "device table not closed by a rule: output truncated?", len(lines))


def _cell(columns: list[tuple[str, int, int]], line: str, *names: str) -> str | None:
    for name, start, end in columns:
        if name in names:
            return line[start:end].strip()
    return None


def _concise_row(
    parsed: Parsed, columns: list[tuple[str, int, int]], line: str, no: int, dialect: Dialect
) -> int:
    def fail(message: str) -> ParseError:
        return dialect.error(parsed.capture, message, no, line)

    index = int(line.split()[0])
    facts = parsed.gpu(index, no)
    parsed.what = f"{parsed.tool} default table"
    ids = _cell(columns, line, "IDs", "[Model : Revision]")
    if ids is not None:
        found = re.search(r"0x[0-9a-fA-F]+", ids)
        if not found:
            raise fail("no device id in the IDs column")
        _set(facts, "device_id", found.group(0).lower(), fail)
    partitions = _cell(columns, line, "Partitions")
    if partitions is not None:
        parts = [clean(p) for p in partitions.split(",")]
        _set(facts, "memory_partition", parts[0].upper() if parts[0] else None, fail)
        if len(parts) > 1 and parts[1]:
            _set(facts, "compute_partition", parts[1].upper(), fail)
    return index


def _concise_name_row(facts: Facts, columns: list[tuple[str, int, int]], line: str) -> None:
    name = _cell(columns, line, "[Model : Revision]")
    if name and facts.short_name is None:
        facts.short_name = name


# amd-smi text ----------------------------------------------------------------------------------
def _amdsmi_tree(capture: Capture, dialect: Dialect) -> list[tuple[str, int, int, dict[str, Any]]]:
    """`GPU: N` / `CPU: N` blocks of indented `KEY: value` lines as (kind, id, line, tree)."""
    blocks: list[tuple[str, int, int, dict[str, Any]]] = []
    stack: list[dict[str, Any]] = []
    for no, line in enumerate(capture.text.splitlines(), 1):
        if not line.strip():
            continue
        if head := _BLOCK.match(line):
            blocks.append((head.group(1), int(head.group(2)), no, {}))
            stack = [blocks[-1][3]]
            continue
        item = _TREE_LINE.match(line)
        depth = len(item.group("indent")) // 4 if item else 0
        if not item or not stack or len(item.group("indent")) % 4 or not 1 <= depth <= len(stack):
            raise dialect.error(
                capture, "not an amd-smi `KEY: value` line: output truncated?", no, line, tool="amd-smi"
            )
        del stack[depth:]
        if item.group("value") is None:
            child: dict[str, Any] = {}
            stack[-1][item.group("key")] = child
            stack.append(child)
        else:
            stack[-1][item.group("key")] = item.group("value")
    return blocks


def parse_amdsmi_blocks(capture: Capture, dialect: Dialect) -> Parsed:
    """`amd-smi static` (GPU blocks with sections) or `amd-smi list` (flat GPU blocks)."""
    gpus = [b for b in _amdsmi_tree(capture, dialect) if b[0] == "GPU"]
    if not gpus:
        raise dialect.error(capture, "no `GPU: N` blocks", 1, tool="amd-smi")
    static = any(isinstance(v, dict) for _, _, _, tree in gpus for v in tree.values())
    parsed = Parsed(capture, "amd-smi", "amd-smi static" if static else "amd-smi list")
    reference = set(gpus[0][3])
    for _, index, no, tree in gpus:
        if set(tree) != reference:
            missing = ", ".join(sorted(reference - set(tree))) or "none"
            raise dialect.error(
                capture,
                f"GPU {index} block differs from GPU {gpus[0][1]} (missing: {missing}): output truncated?",
                no,
                f"GPU: {index}",
                tool="amd-smi",
            )
        _amdsmi_gpu(parsed, index, no, tree, dialect)
    return parsed


def _amdsmi_gpu(parsed: Parsed, index: int, no: int, tree: Mapping[str, Any], dialect: Dialect) -> None:
    def fail(message: str) -> ParseError:
        return dialect.error(parsed.capture, f"GPU {index}: {message}", no, f"GPU: {index}", tool="amd-smi")

    def get(*path: str) -> str:
        node: Any = tree
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        return node if isinstance(node, str) else ""

    facts = parsed.gpu(index, no)
    _set(facts, "name", clean(get("ASIC", "MARKET_NAME")) or clean(get("BOARD", "PRODUCT_NAME")), fail)
    for name, path in _AMDSMI_FIELDS:
        _set(facts, name, _convert(name, get(*path), fail), fail)
    _amdsmi_affinity(facts, get("NUMA", "AFFINITY"), fail)
    size = get("VRAM", "SIZE").split()
    if size:
        if len(size) != 2 or size[1].lower() not in _MIB:
            raise fail(f"VRAM SIZE {' '.join(size)!r} is not '<number> MB'")
        _set(facts, "memory_mib", memory_mib(size[0], size[1], fail), fail)


def _amdsmi_affinity(facts: Facts, raw: str, fail: Callable[[str], ParseError]) -> None:
    """NUMA AFFINITY: a NUMA node number, or (some releases) a CPU list."""
    value = clean(raw)
    if value is not None and re.fullmatch(r"-?\d+", value):
        _set(facts, "numa_affinity", _convert("numa_affinity", value, fail), fail)
    elif value is not None and _CPULIST.match(value):
        _set(facts, "cores", value, fail)


def parse_amdsmi_topology(capture: Capture, dialect: Dialect) -> Parsed:
    """`amd-smi topology`: square tables addressed by BDF; LINK TYPE is required, HOPS optional."""
    lines = capture.text.splitlines()
    parsed = Parsed(capture, "amd-smi", "amd-smi topology", by_bdf=True)
    tables = {}
    for i, line in enumerate(lines):
        if head := _TOPO_TABLE.match(line):
            tables[head.group(1)] = _amdsmi_table(capture, lines, i + 1, dialect)
    if "LINK TYPE" not in tables:
        raise dialect.error(capture, "no LINK TYPE TABLE", len(lines), tool="amd-smi")
    for (src, dst), cell in tables["LINK TYPE"].items():
        parsed.link_kind[(src, dst)] = cell.upper()
    for (src, dst), cell in tables.get("HOPS", {}).items():
        if cell.isdigit():
            parsed.hops[(src, dst)] = int(cell)
    return parsed


def _amdsmi_table(
    capture: Capture, lines: list[str], start: int, dialect: Dialect
) -> dict[tuple[str, str], str]:
    def fail(message: str, no: int) -> ParseError:
        return dialect.error(
            capture, message, no, lines[no - 1] if no <= len(lines) else None, tool="amd-smi"
        )

    if start >= len(lines):
        raise fail("table without a header: output truncated?", len(lines))
    header = [c.lower() for c in lines[start].split()]
    if not header or not all(_BDF.match(c) for c in header):
        raise fail("table header is not a row of PCI addresses", start + 1)
    cells: dict[tuple[str, str], str] = {}
    i = start + 1
    while i < len(lines) and lines[i].split() and _BDF.match(lines[i].split()[0].lower()):
        row = lines[i].split()
        if len(row) != len(header) + 1:
            raise fail(f"table row has {len(row) - 1} cells for {len(header)} GPUs", i + 1)
        cells.update({(row[0].lower(), dst): cell for dst, cell in zip(header, row[1:], strict=True)})
        i += 1
    if len(cells) != len(header) ** 2:
        raise fail("table is incomplete: output truncated?", min(i + 1, len(lines)))
    return cells


def parse_amdsmi_version(capture: Capture, dialect: Dialect) -> Parsed:
    parsed = Parsed(capture, "amd-smi", "amd-smi version")
    for line in capture.text.splitlines():
        if match := _AMDSMI_VERSION.match(line):
            parsed.runtime_version = clean(match.group("rocm"))
    return parsed


PARSERS: dict[str, Callable[[Capture, Dialect], Parsed]] = {
    "json": parse_smi_json,
    "smi-text": parse_smi_text,
    "amd-smi-blocks": parse_amdsmi_blocks,
    "amd-smi-topology": parse_amdsmi_topology,
    "amd-smi-version": parse_amdsmi_version,
}


# merging ---------------------------------------------------------------------------------------
def merge(parsed: Sequence[Parsed], dialect: Dialect) -> list[Device]:
    """Combine the captures of one node into devices, in index order."""
    indexed = [p for p in parsed if p.gpus]
    hint = AMD_SMI_HINT if any(p.tool == "amd-smi" for p in parsed) else dialect.hint
    if not indexed:
        raise dialect.error(
            parsed[0].capture,
            f"{parsed[0].what} carries no per-GPU device data; {dialect.advice(hint)}",
            tool=parsed[0].tool,
        )
    _check_same_gpus(indexed, dialect)
    facts = {index: Facts() for index in indexed[0].gpus}
    for p in indexed:
        for index, gpu in p.gpus.items():
            _merge_facts(facts[index], gpu, _conflict(p, index, dialect))
    links = _collect_links(parsed, facts, dialect)
    _require(facts, indexed[0], hint, dialect)
    driver = next((p.driver_version for p in parsed if p.driver_version), None)
    runtime = next((p.runtime_version for p in parsed if p.runtime_version), None)
    return [
        build_device(dialect.vendor, i, facts[i], links.get(i, {}), driver, runtime) for i in sorted(facts)
    ]


def _check_same_gpus(indexed: Sequence[Parsed], dialect: Dialect) -> None:
    first = indexed[0]
    for p in indexed[1:]:
        if set(p.gpus) != set(first.gpus):
            raise dialect.error(
                p.capture,
                f"{p.what} lists {dialect.unit}s {sorted(p.gpus)} but {first.capture.source} "
                f"lists {sorted(first.gpus)}; captures must come from one node",
                tool=p.tool,
            )


def _conflict(p: Parsed, index: int, dialect: Dialect) -> Callable[[str], ParseError]:
    """The error for facts of GPU `index` in capture `p` that contradict an earlier capture."""
    no, line = p.where(index)

    def fail(message: str) -> ParseError:
        text = f"{dialect.unit} {index}: {message} (captures from different nodes?)"
        return dialect.error(p.capture, text, no, line, tool=p.tool)

    return fail


def _merge_facts(into: Facts, other: Facts, fail: Callable[[str], ParseError]) -> None:
    for f in dataclasses.fields(Facts):
        _set(into, f.name, getattr(other, f.name), fail)


def _collect_links(
    parsed: Sequence[Parsed], facts: Mapping[int, Facts], dialect: Dialect
) -> dict[int, dict[int, str]]:
    by_bdf = {f.bdf: i for i, f in facts.items() if f.bdf}
    links: dict[int, dict[int, str]] = {}
    for p in parsed:
        for (src, dst), kind in p.link_kind.items():
            a, b = (_bdf_index(p, key, by_bdf, dialect) for key in (src, dst)) if p.by_bdf else (src, dst)
            if a not in facts or b not in facts:
                raise dialect.error(
                    p.capture,
                    f"link between {dialect.unit}s {a} and {b} that the device captures do not list",
                    tool=p.tool,
                )
            if kind == "XGMI" and p.hops.get((src, dst), 1) <= 1 and a != b:
                links.setdefault(a, {})[b] = "xgmi"
    return links


def _bdf_index(p: Parsed, bdf: str, by_bdf: Mapping[str, int], dialect: Dialect) -> int:
    if bdf not in by_bdf:
        raise dialect.error(
            p.capture,
            f"{p.what} names GPU {bdf}, which no other capture maps to a GPU index; "
            f"also capture `{AMD_SMI_HINT}` on the same node",
            tool=p.tool,
        )
    return by_bdf[bdf]


def missing_facts(facts: Facts) -> list[str]:
    """What a device record cannot do without: a model name (or device id) and the memory size."""
    missing = [] if (facts.name or facts.short_name or facts.device_id) else ["model"]
    return missing + ([] if facts.memory_mib else ["memory size"])


def _require(facts: Mapping[int, Facts], first: Parsed, hint: str, dialect: Dialect) -> None:
    for index in sorted(facts):
        missing = missing_facts(facts[index])
        if missing:
            no, line = first.where(index)
            message = f"no {' or '.join(missing)} for {dialect.unit} {index} in {first.what}; "
            raise dialect.error(first.capture, message + dialect.advice(hint), no, line, tool=first.tool)


def build_device(
    vendor: str, index: int, facts: Facts, links: Mapping[int, str], driver: str | None, runtime: str | None
) -> Device:
    """The Device record of one merged GPU (see the module docstring for each field's source)."""
    minor = facts.render_minor if facts.render_minor is not None else RENDER_MINOR_BASE + index
    partition = "/".join(p for p in (facts.compute_partition, facts.memory_partition) if p) or None
    numa = facts.numa_affinity if facts.numa_affinity is not None else facts.numa_node
    return Device(
        vendor=vendor,
        model=facts.name or facts.short_name or facts.device_id or "",
        index=index,
        file=f"/dev/dri/renderD{minor}",
        memory_mib=facts.memory_mib,
        numa_node=numa,
        cores=facts.cores,
        uuid=facts.uuid,
        pci_bus_id=facts.bdf,
        links=tuple(Link(peer=peer, kind=kind) for peer, kind in sorted(links.items())),
        driver_version=facts.driver_version or driver,
        runtime_version=runtime,
        partition_mode=partition,
    )


def parse_captures(captures: Sequence[Capture], dialect: Dialect, formats: Iterable[str]) -> list[Device]:
    """Detect, parse and merge; a format outside `formats` is refused with its owner's name."""
    if not captures:
        raise ParseError(dialect.vendor, dialect.tool, "no captures given", "<none>")
    allowed = set(formats)
    parsed = []
    for capture in captures:
        kind = detect(capture, dialect)
        if kind not in allowed:
            owner = "amd-smi" if kind.startswith("amd-smi") else kind
            raise dialect.error(
                capture,
                f"this is {owner} output, which is AMD's; use --vendor amd",
                1,
                tool="amd-smi",
            )
        parsed.append(PARSERS[kind](capture, dialect))
    return merge(parsed, dialect)


# live: sysfs and the amdsmi library ------------------------------------------------------------
def accelerator_pci_vendors(root: Path = PCI_ROOT) -> set[str] | None:
    """PCI vendor ids of display/accelerator devices (class 0x03, 0x12); None if sysfs is unreadable."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return None
    vendors = set()
    for entry in entries:
        try:
            pci_class = (entry / "class").read_text().strip().lower()
            vendor = (entry / "vendor").read_text().strip().lower()
        except OSError:
            continue
        if pci_class.startswith(("0x03", "0x12")):
            vendors.add(vendor)
    return vendors


def with_local_cpus(devices: Sequence[Device], root: Path = PCI_ROOT) -> list[Device]:
    """Fill `cores` from /sys/bus/pci/devices/<bdf>/local_cpulist where the kernel reports it."""
    out = []
    for device in devices:
        cpus = None
        if device.pci_bus_id and device.cores is None:
            try:
                cpus = (root / device.pci_bus_id / "local_cpulist").read_text().strip()
            except OSError:
                cpus = None
        out.append(dataclasses.replace(device, cores=cpus) if cpus and _CPULIST.match(cpus) else device)
    return out


def load_amdsmi() -> Any | None:
    """The amdsmi module, or None when it is not installed or its library does not load."""
    try:
        return importlib.import_module("amdsmi")
    except Exception as e:  # a broken vendor library must fall back to the tools, not stop discovery
        logger.debug("amdsmi unavailable (%s); using the amd-smi / rocm-smi tools", e)
        return None


def _library_call(module: Any, name: str, *args: Any) -> Any:
    try:
        return getattr(module, name)(*args)
    except Exception as e:  # AmdSmiException and friends: report them as one line
        raise HeteroError(
            f"amdsmi.{name}() failed: {e}; check the amdgpu driver with `amd-smi static`"
        ) from e


def _optional(module: Any, name: str, *args: Any) -> Any:
    """A library query whose failure (unsupported on this GPU or release) means "not reported"."""
    try:
        return getattr(module, name)(*args)
    except Exception as e:  # the field is simply unknown
        logger.debug("amdsmi.%s: %s", name, e)
        return None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = clean(value)
    return int(text) if text is not None and re.fullmatch(r"-?\d+", text) else None


def _hex_id(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"0x{value:04x}"
    text = clean(value)
    return text.lower() if text and _HEX_ID.match(text.lower()) else None


def amdsmi_facts(module: Any, handle: Any) -> Facts:
    """One GPU's facts from the amdsmi library (every query optional)."""

    def mapping(name: str) -> Mapping[str, Any]:
        value = _optional(module, name, handle)
        return value if isinstance(value, Mapping) else {}

    asic, vram = mapping("amdsmi_get_gpu_asic_info"), mapping("amdsmi_get_gpu_vram_info")
    numa, affinity = (
        _as_int(_optional(module, n, handle))
        for n in ("amdsmi_topo_get_numa_node_number", "amdsmi_get_gpu_topo_numa_affinity")
    )
    bdf = clean(_optional(module, "amdsmi_get_gpu_device_bdf", handle))
    memory = _as_int(vram.get("vram_size", vram.get("vram_size_mb")))
    return Facts(
        name=clean(asic.get("market_name")),
        device_id=_hex_id(asic.get("device_id")),
        memory_mib=memory if memory and memory > 0 else None,
        bdf=bdf.lower() if bdf and _BDF.match(bdf.lower()) else None,
        numa_node=numa if numa is not None and numa >= 0 else None,
        numa_affinity=affinity if affinity is not None and affinity >= 0 else None,
        uuid=clean(_optional(module, "amdsmi_get_gpu_device_uuid", handle)),
        compute_partition=clean(_optional(module, "amdsmi_get_gpu_compute_partition", handle)),
        memory_partition=clean(_optional(module, "amdsmi_get_gpu_memory_partition", handle)),
        driver_version=clean(mapping("amdsmi_get_gpu_driver_info").get("driver_version")),
        render_minor=_as_int(mapping("amdsmi_get_gpu_enumeration_info").get("drm_render")),
    )


def xgmi_code(module: Any) -> int | None:
    """The library's numeric XGMI link type (renumbered between releases, so found by name)."""
    for enum_name, member in (("AmdSmiLinkType", "AMDSMI_LINK_TYPE_XGMI"), ("AmdSmiIoLinkType", "XGMI")):
        value = getattr(getattr(module, enum_name, None), member, None)
        if value is not None:
            return int(value)
    return None


def _is_direct_xgmi(info: Mapping[str, Any], code: int) -> bool:
    hops = _as_int(info.get("hops"))
    return _as_int(info.get("type")) == code and (hops is None or hops <= 1)


def amdsmi_links(module: Any, handles: Sequence[Any]) -> dict[int, dict[int, str]]:
    """Direct (one-hop) XGMI links between every pair of GPUs."""
    code = xgmi_code(module)
    if code is None:
        logger.debug("amdsmi has no XGMI link type constant; links left out")
        return {}
    links: dict[int, dict[int, str]] = {}
    for i, src in enumerate(handles):
        for j, dst in enumerate(handles):
            info = _optional(module, "amdsmi_topo_get_link_type", src, dst) if i != j else None
            if isinstance(info, Mapping) and _is_direct_xgmi(info, code):
                links.setdefault(i, {})[j] = "xgmi"
    return links


def devices_from_amdsmi(module: Any) -> list[Device]:
    """Live discovery through the amdsmi library; `module` is amdsmi itself or a test fake."""
    _library_call(module, "amdsmi_init")
    try:
        handles = list(_library_call(module, "amdsmi_get_processor_handles"))
        facts = {i: amdsmi_facts(module, h) for i, h in enumerate(handles)}
        links = amdsmi_links(module, handles)
    finally:
        _optional(module, "amdsmi_shut_down")
    for index, gpu in facts.items():
        if missing := missing_facts(gpu):
            raise HeteroError(
                f"amdsmi reports no {' or '.join(missing)} for GPU {index}; compare `amd-smi static`"
            )
    return [build_device("amd", i, facts[i], links.get(i, {}), None, None) for i in sorted(facts)]


# the vendor ------------------------------------------------------------------------------------
@register_vendor("amd")
class AmdVendor(Vendor):
    """AMD GPUs through amdsmi, amd-smi or rocm-smi (see the module docstring)."""

    tools: ClassVar[tuple[str, ...]] = ("amd-smi", "rocm-smi")
    visible_devices_env: ClassVar[str | None] = None  # Slurm exports ROCR_VISIBLE_DEVICES itself
    memory_capture_hint: ClassVar[str] = ROCM_HINT
    dialect: ClassVar[Dialect] = AMD
    formats: ClassVar[tuple[str, ...]] = tuple(PARSERS)
    pci_root: ClassVar[Path] = PCI_ROOT

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

    def parse(self, captures: Sequence[Capture]) -> list[Device]:
        return parse_captures(captures, self.dialect, self.formats)

    def probe(self) -> list[Device]:
        module = load_amdsmi()
        if module is not None:
            return with_local_cpus(devices_from_amdsmi(module), self.pci_root)
        captures = [Capture(" ".join(argv), proc.run(argv)) for argv in self.commands()]
        return with_local_cpus(self.parse(captures), self.pci_root)
