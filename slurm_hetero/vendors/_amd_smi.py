"""amd-smi text -> `Parsed`: `static` and `list` (`GPU: N` blocks of indented `KEY: value` lines),
`topology` (tables addressed by PCI address) and `version` (the ROCm version).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from slurm_hetero.core.errors import ParseError
from slurm_hetero.core.model import Capture
from slurm_hetero.vendors._rocm_facts import (
    BDF,
    UNIT_MIB,
    Dialect,
    Facts,
    Parsed,
    clean,
    convert_fact,
    memory_mib,
    set_fact,
)
from slurm_hetero.vendors._table import (
    CPULIST,
    Line,
    TableError,
    numbered_lines,
    read_matrix,
    read_tree,
    tree_value,
)

AMD_SMI_HINT = "amd-smi static"
AMDSMI_BLOCK = re.compile(r"^(GPU|CPU|CORE): (\d+)\s*$")
AMDSMI_TOPO_TABLE = re.compile(r"^(ACCESS|WEIGHT|HOPS|LINK TYPE|NUMA BW) TABLE:\s*$")
AMDSMI_VERSION = re.compile(r"^AMDSMI Tool: .*\bROCm version: (?P<rocm>\S+)")
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


def _amdsmi_tree(capture: Capture, dialect: Dialect) -> list[tuple[str, int, int, dict[str, Any]]]:
    """`GPU: N` / `CPU: N` blocks of indented `KEY: value` lines as (kind, id, line, tree)."""
    last = capture.text.rsplit("\n", 1)[-1]
    if last and not last.strip():  # an indent, cut
        no = capture.text.count("\n") + 1
        raise dialect.error(capture, "output ends inside an entry: truncated?", no, last, tool="amd-smi")
    lines = numbered_lines(capture.text)
    try:
        header, blocks = read_tree(lines, AMDSMI_BLOCK)
    except TableError as e:
        raise dialect.error(capture, e.message, e.line_no, e.text, tool="amd-smi") from None
    if header:
        first = next(line for line in lines if line.text.strip())
        raise dialect.error(
            capture, "a line before the first `GPU: N` block", first.no, first.text, tool="amd-smi"
        )
    return [(head.group(1), int(head.group(2)), line.no, tree) for head, line, tree in blocks]


def _shape(tree: Mapping[str, Any]) -> tuple[Any, ...]:
    """The key structure of a block (values dropped), to compare blocks printed alike."""
    return tuple((k, _shape(v) if isinstance(v, dict) else None) for k, v in sorted(tree.items()))


def _uneven_entry(tree: Mapping[str, Any], path: str = "") -> str | None:
    """The path of an entry whose numbered siblings (CACHE_0, CACHE_1, ...) have more keys than it
    (a cut inside the last one), or of a section with no entries (cut after its name), else None."""
    empty = next((k for k, v in tree.items() if v == {}), None)
    if empty is not None:
        return f"{path}{empty}"
    numbered = {k: v for k, v in tree.items() if isinstance(v, dict) and re.fullmatch(r"[A-Z]+_\d+", k)}
    if len(numbered) > 1:
        widest = max(len(v) for v in numbered.values())
        for key, child in numbered.items():
            if len(child) < widest:
                return f"{path}{key}"
    for key, child in tree.items():
        if isinstance(child, dict):
            if found := _uneven_entry(child, f"{path}{key}/"):
                return found
    return None


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
        uneven = _uneven_entry(tree)
        if _shape(tree) != _shape(gpus[0][3]) or uneven:
            raise dialect.error(
                capture,
                f"GPU {index} block is not printed like GPU {gpus[0][1]} ({uneven or 'other entries'}): "
                "output truncated?",
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
        return tree_value(tree, *path) or ""

    facts = parsed.gpu(index, no)
    set_fact(facts, "name", clean(get("ASIC", "MARKET_NAME")) or clean(get("BOARD", "PRODUCT_NAME")), fail)
    for name, path in _AMDSMI_FIELDS:
        set_fact(facts, name, convert_fact(name, get(*path), fail), fail)
    _amdsmi_affinity(facts, get("NUMA", "AFFINITY"), fail)
    if size := get("VRAM", "SIZE").split():
        if len(size) != 2 or size[1].lower() not in UNIT_MIB:
            raise fail(f"VRAM SIZE {' '.join(size)!r} is not '<number> MB'")
        set_fact(facts, "memory_mib", memory_mib(size[0], size[1], fail), fail)


def _amdsmi_affinity(facts: Facts, raw: str, fail: Callable[[str], ParseError]) -> None:
    """NUMA AFFINITY: a NUMA node number, or (some releases) a CPU list."""
    value = clean(raw)
    if value is not None and re.fullmatch(r"-?\d+", value):
        set_fact(facts, "numa_affinity", convert_fact("numa_affinity", value, fail), fail)
    elif value is not None and CPULIST.match(value):
        set_fact(facts, "cores", value, fail)


def parse_amdsmi_topology(capture: Capture, dialect: Dialect) -> Parsed:
    """`amd-smi topology`: square tables addressed by BDF; LINK TYPE is required, HOPS optional."""
    lines = [Line(no, text.rstrip()) for no, text in enumerate(capture.text.splitlines(), 1)]
    parsed = Parsed(capture, "amd-smi", "amd-smi topology", by_bdf=True)
    tables = {}
    for i, line in enumerate(lines):
        if head := AMDSMI_TOPO_TABLE.match(line.text):
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
    capture: Capture, lines: list[Line], start: int, dialect: Dialect
) -> dict[tuple[str, str], str]:
    """One BDF x BDF table (its diagonal varies: SELF, 0, ENABLED) as cells by (row, column)."""
    if start >= len(lines):
        raise dialect.error(capture, "table without a header: output truncated?", len(lines), tool="amd-smi")
    try:
        labels, rows, _ = read_matrix(lines, start, rf"(?i:{BDF.pattern})", diagonal=None)
    except TableError as e:
        raise dialect.error(
            capture, f"topology table: {e.message}", e.line_no, e.text, tool="amd-smi"
        ) from None
    bdfs = [label.lower() for label in labels]
    return {(src, dst): cell for src, (_, cells) in zip(bdfs, rows) for dst, cell in zip(bdfs, cells)}


def parse_amdsmi_version(capture: Capture, dialect: Dialect) -> Parsed:
    parsed = Parsed(capture, "amd-smi", "amd-smi version")
    for line in capture.text.splitlines():
        if match := AMDSMI_VERSION.match(line):
            parsed.runtime_version = clean(match.group("rocm"))
    return parsed
