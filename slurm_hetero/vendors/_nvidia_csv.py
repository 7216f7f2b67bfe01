"""`nvidia-smi --query-gpu=... --format=csv` output (`nounits` too), columns in any order or subset.

`name` is needed; the device file is /dev/nvidia<minor_number>, else nvidia-smi's `index` (the
minor unless GPUs were renumbered), else the row's position. `noheader` is refused. A cut at a
row's end cannot be told (prefer `-q -x` there).
"""

from __future__ import annotations

import csv
import logging
import re
from collections.abc import Mapping

from slurm_hetero.core.model import Capture, Device
from slurm_hetero.vendors._nvidia_smi import device_from_fields, parse_error

logger = logging.getLogger(__name__)

CSV_TOOL = "nvidia-smi --query-gpu --format=csv"
_COLUMN = re.compile(r"[a-z_]+(\.[a-z_]+)*( \[[^\]]*\])?")
# --query-gpu column -> the canonical field of _nvidia_smi
_FIELDS = {
    "name": "model",
    "minor_number": "minor",
    "uuid": "uuid",
    "pci.bus_id": "bus_id",
    "memory.total": "memory",
    "mig.mode.current": "mig",
    "retired_pages.pending": "pending_retirement",
    "remapped_rows.pending": "remap_pending",
    "remapped_rows.failure": "remap_failure",
}


def header_columns(line: str) -> list[str] | None:
    """The column names of a --query-gpu CSV header (units dropped), None if it is not one."""
    cells = [c.strip() for c in line.split(",")]
    if len(cells) < 2 or not all(_COLUMN.fullmatch(c) for c in cells):
        return None
    names = [c.split(" [")[0] for c in cells]
    return names if {"name", "index", "minor_number", "uuid"} & set(names) else None


def is_query_csv(text: str) -> bool:
    first = next((line for line in text.splitlines() if line.strip()), "")
    return header_columns(first) is not None


def _canonical(row: Mapping[str, str]) -> dict[str, str]:
    fields = {_FIELDS[k]: v for k, v in row.items() if k in _FIELDS}
    if "minor" not in fields and "index" in row:
        fields["minor"] = row["index"]
    memory = fields.get("memory", "").strip()
    if memory.isdigit():  # nounits
        fields["memory"] = f"{memory} MiB"
    for flag in ("pending_retirement", "remap_pending", "remap_failure"):
        if flag in fields:  # the CSV says Yes/No, or 0/1 for remapped rows
            fields[flag] = {"1": "Yes", "0": "No"}.get(fields[flag].strip(), fields[flag].strip())
    return fields


def parse_query_csv(capture: Capture) -> list[Device]:
    """The GPUs of one `nvidia-smi --query-gpu ... --format=csv` capture."""
    lines = capture.text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip())
    columns = header_columns(lines[start]) or []
    if "name" not in columns:
        raise parse_error(CSV_TOOL, "needs the name column", capture, start + 1, lines[start])
    numbered = bool({"index", "minor_number"} & set(columns))
    if not numbered:
        logger.warning(
            "%s: no index or minor_number column: the rows are taken as GPUs 0, 1, ... in order, as "
            "nvidia-smi prints them (add index to --query-gpu to be sure)",
            capture.source,
        )
    devices: list[Device] = []
    rows = 0
    for offset, cells in enumerate(csv.reader(lines[start + 1 :], skipinitialspace=True)):
        line_no = start + 2 + offset
        if not cells:
            continue
        if len(cells) != len(columns):
            raise parse_error(
                CSV_TOOL,
                f"{len(cells)} fields where the header has {len(columns)} (truncated?)",
                capture,
                line_no,
                lines[line_no - 1],
            )
        row = dict(zip(columns, (c.strip() for c in cells)))
        if not numbered:
            row["index"] = str(rows)
        rows += 1
        try:
            device = device_from_fields(_canonical(row), row.get("driver_version"), None)
        except ValueError as e:
            raise parse_error(CSV_TOOL, str(e), capture, line_no, lines[line_no - 1]) from None
        if device is not None:
            devices.append(device)
    if not devices:
        raise parse_error(CSV_TOOL, "a header but no GPU rows (truncated?)", capture, start + 1)
    return devices
