"""rocm-smi / hy-smi output -> `Parsed`: `--json` (`parse_smi_json`) and banner-framed text
(`parse_smi_text`: key-value lines, `--showtopo` matrices, the concise table).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from slurm_hetero.core.errors import ParseError
from slurm_hetero.core.model import Capture
from slurm_hetero.vendors._rocm_facts import Dialect, Facts, Parsed, apply_kv, clean, set_fact
from slurm_hetero.vendors._table import Line, TableError, read_matrix

BANNER = re.compile(r"^=+\s*(ROCm\s+)?System Management Interface\s*=+\s*$")
_FOOTER = re.compile(r"^=+\s*End of (ROCm )?SMI Log\s*=+\s*$")
_SECTION = re.compile(r"^=+\s*(.*?)\s*=+\s*$")
_RULE = re.compile(r"^=+\s*$")
_ROW = re.compile(r"^\d+(\s|$)")
_TOPO_PAIR = re.compile(r"^\(Topology\) (Weight|Hops|Link type) between DRM devices (\d+) and (\d+)$", re.I)


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

        if not isinstance(value, (str, int, float)):
            continue
        if index is not None:
            apply_kv(parsed.gpu(index), key, str(value), fail, dialect)
        elif key.lower() == "driver version":
            parsed.driver_version = clean(value)
        elif match := _TOPO_PAIR.match(key):
            a, b = int(match.group(2)), int(match.group(3))
            for pair in ((a, b), (b, a)):
                _store(parsed, match.group(1).lower(), pair, str(value), fail)


def _store(
    parsed: Parsed, kind: str, pair: tuple[int, int], value: str, fail: Callable[[str], ParseError]
) -> None:
    """One cell of a table whose title (`kind`, lower case) names link types or hops; others are not kept."""
    if "link type" in kind:
        parsed.link_kind[pair] = value.strip().upper()
    elif "hops" in kind:
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
        if _RULE.match(line) or BANNER.match(line) or _FOOTER.match(line):
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
    banners = [i for i, line in enumerate(lines) if BANNER.match(line)]
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
        rocm_banner = dialect.refuse_rocm_banner and bool(BANNER.match(line)) and "ROCm" in line
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
    numbered = [Line(no, text.rstrip()) for no, text in enumerate(lines, 1)]
    try:
        labels, rows, end = read_matrix(numbered, start, rf"(?:{_index_pattern(dialect)})\d+", diagonal=None)
    except TableError as e:
        message = f"{title or 'topology'} matrix: {e.message}"
        raise dialect.error(parsed.capture, message, e.line_no, e.text) from None
    indexes = [int(re.sub(r"\D", "", name)) for name in labels]
    for src, (_, cells) in zip(indexes, rows):
        parsed.gpu(src, start + 1)
        for dst, cell in zip(indexes, cells):
            if src != dst:
                _store(
                    parsed,
                    title.lower(),
                    (src, dst),
                    cell,
                    lambda m: dialect.error(parsed.capture, m, start + 1),
                )
    if parsed.what.endswith(" text"):
        parsed.what = f"{parsed.tool} --showtopo"
    return end


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
    if (ids := _cell(columns, line, "IDs", "[Model : Revision]")) is not None:
        found = re.search(r"0x[0-9a-fA-F]+", ids)
        if not found:
            raise fail("no device id in the IDs column")
        set_fact(facts, "device_id", found.group(0).lower(), fail)
    if (partitions := _cell(columns, line, "Partitions")) is not None:
        parts = [clean(p) for p in partitions.split(",")]
        set_fact(facts, "memory_partition", parts[0].upper() if parts[0] else None, fail)
        if len(parts) > 1 and parts[1]:
            set_fact(facts, "compute_partition", parts[1].upper(), fail)
    return index


def _concise_name_row(facts: Facts, columns: list[tuple[str, int, int]], line: str) -> None:
    name = _cell(columns, line, "[Model : Revision]")
    if name and facts.short_name is None:
        facts.short_name = name
