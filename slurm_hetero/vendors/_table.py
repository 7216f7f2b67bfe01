"""Text shapes several vendor tools share: the nvidia-smi-style box of `cnmon`, `hl-smi`, `ixsmi`
and `mx-smi`, the labelled link matrix of `topo -m` with its Legend, and indented `key: value`
blocks (nvidia-smi -q, amd-smi static). This module walks the shape, each vendor reads the cells.
Failures are `TableError`, which `guarded` turns into the vendor's ParseError.

The box: a `+---+` top border (after optional lines such as a date), banner rows, a separator,
header rows closed by a `|===+===|` rule, then per device as many rows as the header, each block
closed by a separator as wide as the rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from slurm_hetero.core.model import Capture, Device
    from slurm_hetero.vendors.base import Vendor

_T = TypeVar("_T")

TOP_BORDER = re.compile(r"^\+-+\+$")
CLOSING_BORDER = re.compile(r"^\+[-=]+\+$")
SEPARATOR = re.compile(r"^[+|][-=+]*[-=][-=+]*[+|]$")
_DEVICE_START = re.compile(r"^\|\s*\d")


class TableError(Exception):
    """A problem at one line (`line` None: at line `line_no`, or the capture as a whole)."""

    def __init__(self, message: str, line: Line | None = None, line_no: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line_no = line.no if line else line_no
        self.text = line.text if line else None


def guarded(vendor: Vendor, capture: Capture, step: Callable[[str], _T], tool: str | None = None) -> _T:
    """`step(capture.text)`, a TableError becoming the vendor's ParseError naming the capture and line."""
    try:
        return step(capture.text)
    except TableError as e:
        raise vendor.parse_error(capture, e.message, e.line_no, e.text, tool) from None


@dataclass(frozen=True)
class Line:
    """One line of a capture: 1-based number and text without trailing whitespace or CR."""

    no: int
    text: str

    def is_row(self) -> bool:
        return self.text.startswith("|") and not SEPARATOR.match(self.text)

    def cells(self) -> list[str]:
        """The stripped cells between the `|` of a row (an unclosed last cell is kept)."""
        body = self.text[1:-1] if self.text.endswith("|") else self.text[1:]
        return [cell.strip() for cell in body.split("|")]


@dataclass(frozen=True)
class BoxTable:
    """The parsed frame: banner and header rows, device blocks, and where the frame stopped."""

    banner: tuple[Line, ...]
    header: tuple[Line, ...]
    blocks: tuple[tuple[Line, ...], ...]
    last_separator: Line
    end: int  # index (into the lines list) of the first line after the device blocks


def numbered_lines(text: str) -> list[Line]:
    """Split a capture into numbered lines; CRLF and trailing blanks are dropped."""
    return [Line(n, raw.rstrip()) for n, raw in enumerate(text.split("\n"), 1)]


def nonblank_lines(text: str) -> list[Line]:
    """The lines of a capture that are not blank, numbered as an editor shows them."""
    return [Line(n, raw.rstrip()) for n, raw in enumerate(text.splitlines(), 1) if raw.strip()]


def check_width(lines: list[Line], what: str) -> None:
    """Every line as wide as the first: a line cut short shows as a narrower one."""
    width = len(lines[0].text)
    for line in lines:
        if len(line.text) != width:
            message = f"line is {len(line.text)} characters wide, the {what} {width} (output cut short?)"
            raise TableError(message, line)


def check_row(line: Line, columns: int) -> list[str]:
    """The cells of a closed row of `columns` cells; TableError for a cut or malformed row."""
    cells = line.cells()
    if not (line.is_row() and line.text.endswith("|")) or len(cells) != columns:
        raise TableError(f"expected a complete row of {columns} columns (output cut short?)", line)
    return cells


def _take_rows(lines: list[Line], i: int, what: str) -> tuple[list[Line], int]:
    """Rows from index i up to the next separator, which must exist."""
    rows: list[Line] = []
    while i < len(lines) and lines[i].is_row():
        rows.append(lines[i])
        i += 1
    if i == len(lines):
        raise TableError(f"table ends inside the {what} (output cut short?)", lines[-1])
    if not SEPARATOR.match(lines[i].text):
        raise TableError(f"unexpected line in the {what} (output cut short?)", lines[i])
    return rows, i


def read_box_table(lines: list[Line], start: int = 0) -> BoxTable:
    """Walk the frame from the first top border at or after `start`; see the module docstring."""
    top = next((i for i in range(start, len(lines)) if TOP_BORDER.match(lines[i].text)), None)
    if top is None:
        raise TableError("no table frame (+---+ border) found")
    banner, i = _take_rows(lines, top + 1, "banner")
    header, i = _take_rows(lines, i + 1, "header")
    rule = lines[i]
    if "=" not in rule.text or not header:
        raise TableError("expected header rows closed by a |===| rule", rule)
    columns = rule.text.count("+") + 1
    for row in header:
        check_row(row, columns)
    blocks: list[tuple[Line, ...]] = []
    i += 1
    separator = rule
    while i < len(lines) and _DEVICE_START.match(lines[i].text):
        rows, i = _take_rows(lines, i, "device rows")
        separator = lines[i]
        if len(separator.text) != len(rule.text):
            raise TableError("row separator of the wrong width (output cut short?)", separator)
        if len(rows) != len(header):
            raise TableError(f"device block of {len(rows)} rows, the header has {len(header)}", rows[0])
        for row in rows:
            check_row(row, columns)
        blocks.append(tuple(rows))
        i += 1
    return BoxTable(tuple(banner), tuple(header), tuple(blocks), separator, i)


def read_closed_box(lines: list[Line], i: int, what: str) -> int:
    """Index after the closing `+---+`/`+===+` border of the rows from index i (rows need only
    start with `|`: tools print ragged process rows); a missing border is how a cut shows."""
    while i < len(lines) and lines[i].text.startswith("|"):
        i += 1
    if i < len(lines) and CLOSING_BORDER.match(lines[i].text):
        return i + 1
    where = lines[min(i, len(lines) - 1)] if lines else None
    raise TableError(f"{what} not closed by a +---+ border (output cut short?)", where)


def skip_blank(lines: list[Line], i: int) -> int:
    while i < len(lines) and not lines[i].text.strip():
        i += 1
    return i


def read_trailing_processes(lines: list[Line], i: int) -> None:
    """After a closed device table: a blank line, then a complete `Processes:` box. A capture may
    stop after the blank line (what `tool | grep -B99999 '^ *$'` keeps), but not on the table's last
    border: without a device count, a cut after a whole device block shows no other way."""
    if i + 1 >= len(lines) or lines[i].text.strip():
        if i >= len(lines) or not TOP_BORDER.match(lines[i].text):
            raise TableError("device table not followed by a blank line (output cut short?)", lines[i - 1])
    i = skip_blank(lines, i)
    if i == len(lines):
        return
    if not TOP_BORDER.match(lines[i].text):
        raise TableError("unexpected line after the device table", lines[i])
    if i + 1 == len(lines) or "Processes" not in lines[i + 1].text:
        raise TableError("expected the processes table after the device table (output cut short?)", lines[i])
    read_closed_box(lines, i + 1, "processes table")


def read_matrix(
    lines: list[Line],
    i: int,
    label: str,
    affinity: tuple[str, ...] = (),
    affine: str = "",
    diagonal: str | None = "X",
    split: Callable[[str], list[str]] = str.split,
) -> tuple[list[str], list[tuple[Line, list[str]]], int]:
    """(labels, row cells, index after) of the matrix whose header is lines[i]: labels matching `label`,
    one row per label in order, `diagonal` (unless None) to itself, rows labelled `affine...` ending
    in the `affinity` columns when the header has them; `split` cuts a line."""
    words = split(lines[i].text)
    tail = [word for name in affinity for word in split(name)]
    has_affinity = bool(tail) and words[-len(tail) :] == tail
    labels = words[: -len(tail)] if has_affinity else words
    bad = next((name for name in labels if not re.fullmatch(label, name)), None)
    if bad is not None or not labels:
        raise TableError(
            f"matrix header: {bad!r} is not a column label" if bad is not None else "empty matrix header",
            lines[i],
        )
    rows = []
    for k, name in enumerate(labels, i + 1):
        row = split(lines[k].text) if k < len(lines) else []
        width = 1 + len(labels) + (len(affinity) if has_affinity and name.startswith(affine) else 0)
        if len(row) != width or row[0] != name:
            raise TableError(
                f"expected the complete {name} row (output cut short?)", lines[min(k, len(lines) - 1)]
            )
        if diagonal is not None and row[k - i] != diagonal:
            raise TableError(f"{name} is not `{diagonal}` to itself", lines[k])
        rows.append((lines[k], row[1:]))
    return labels, rows, i + 1 + len(labels)


LEGEND_ENTRY = re.compile(r"\s*(\S+)\s*=\s*\S.*")


def read_legend(
    lines: list[Line], i: int, title: str, entry: re.Pattern[str] = LEGEND_ENTRY
) -> tuple[set[str], int]:
    """The names a `title` block of `entry` lines defines (after blanks), and the index after it."""
    i = skip_blank(lines, i)
    if i == len(lines) or lines[i].text.strip() != title:
        raise TableError(f"expected `{title}` (output cut short?)", lines[min(i, len(lines) - 1)])
    i = skip_blank(lines, i + 1)
    names: set[str] = set()
    while i < len(lines) and (match := entry.fullmatch(lines[i].text)):
        names.add(match.group(1))
        i += 1
    return names, i


_TREE_ITEM = re.compile(r"(?P<key>[^: ][^:]*?)\s*(?::(?: (?P<value>.*))?)?")
Tree = dict[str, Any]


def read_tree(
    lines: list[Line], block: re.Pattern[str], loose: bool = False
) -> tuple[Tree, list[tuple[re.Match[str], Line, Tree]]]:
    """`nvidia-smi -q` and `amd-smi static` text: indented `key: value` lines, four spaces a level
    (a key without a value opens a section), in blocks opened by a `block` line; the lines before
    the first block are the header. `loose` (nvidia-smi): a section may lack its colon and a line
    may sit deeper than its section. Returns the header and (block match, its line, tree) each."""
    header: Tree = {}
    blocks: list[tuple[re.Match[str], Line, Tree]] = []
    stack = [header]
    for line in lines:
        body = line.text.lstrip(" ")
        if not body:
            continue
        if head := block.match(line.text):
            blocks.append((head, line, {}))
            stack = [blocks[-1][2]]
            continue
        item = _TREE_ITEM.fullmatch(body)
        indent = len(line.text) - len(body)
        depth = indent // 4 + (0 if blocks else 1)
        strict = not loose and (":" not in body or depth > len(stack))
        if item is None or indent % 4 or depth < 1 or strict:
            raise TableError("not a `key: value` line at its section's indent (output cut short?)", line)
        del stack[depth:]  # a line deeper than its section joins it (nvidia-smi nests some values)
        if item.group("value") is None:
            child: Tree = {}
            stack[-1][item.group("key")] = child
            stack.append(child)
        else:
            stack[-1][item.group("key")] = item.group("value")
    return header, blocks


def tree_value(tree: Mapping[str, Any], *path: str) -> str | None:
    """The value at `path` of a `read_tree` tree; None where there is none (or a section)."""
    node: Any = tree
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, str) else None


def mib_pair(text: str) -> tuple[int, int] | None:
    """`used / total` MiB as printed in a Memory-Usage cell (`0 MiB/ 23374 MiB`, `768MiB / 98304MiB`)."""
    m = re.fullmatch(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


CPULIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")  # a Cores=-style CPU list as printed
_PCI = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


def sysfs_bus_id(text: str) -> str | None:
    """A PCI address in the lowercase sysfs form (`00000000:8A:00.0` -> `0000:8a:00.0`); None if malformed."""
    m = _PCI.fullmatch(text.strip())
    if m is None or int(m.group(1), 16) > 0xFFFF:
        return None
    return f"{int(m.group(1), 16):04x}:{m.group(2)}:{m.group(3)}.{m.group(4)}".lower()


def in_index_order(devices: list[Device], number: str) -> list[Device]:
    """The devices sorted by index; TableError when two share one (`number`: what the tool calls it)."""
    if len({d.index for d in devices}) != len(devices):
        raise TableError(f"the same {number} appears twice")
    return sorted(devices, key=lambda d: d.index)
