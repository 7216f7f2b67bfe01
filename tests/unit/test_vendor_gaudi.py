"""Gaudi-specific behaviour beyond the shared contract: module ids from `hl-smi -Q`, health, the live path.

No public `hl-smi -Q ... -f csv` capture could be found, so the CSV below is SYNTHETIC: built in this
file from the real table fixture's AIPs and bus ids, in the field order our command asks for, with
made-up module ids. It tests the parser's joining rules, not the tool's exact formatting.
"""

from __future__ import annotations

import glob
import os
import shutil

import pytest

from slurm_hetero.core import proc
from slurm_hetero.core.errors import ParseError
from slurm_hetero.core.model import Capture, Device, Health
from slurm_hetero.vendors import get_vendor
from tests.conftest import FIXTURES, fake_tool_run

TABLE = "hl-smi_8x-gaudi2-hl225_hl-1.16.0_denvr.txt"
QUERY_ARGV = (
    "hl-smi",
    "-Q",
    "index,module_id,bus_id,name,uuid,memory.total,driver_version",
    "-f",
    "csv,noheader",
)
MODULE_IDS = [3, 1, 2, 0, 7, 5, 6, 4]  # synthetic: module id of AIP 0..7


def _table() -> str:
    return (FIXTURES / "gaudi" / TABLE).read_text(encoding="utf-8")


def _synthetic_query(devices: list[Device], header: bool = False) -> str:
    rows = [
        f"{d.index}, {MODULE_IDS[d.index]}, {d.pci_bus_id}, {d.model}, N/A, "
        f"{d.memory_mib} MiB, {d.driver_version}"
        for d in devices
    ]
    if header:
        rows.insert(0, "index, module_id, bus_id, name, uuid, memory.total [MiB], driver_version")
    return "\n".join(rows) + "\n"


def _parse(*texts: str) -> list[Device]:
    return get_vendor("gaudi").parse([Capture(f"capture{i}", text) for i, text in enumerate(texts)])


def test_commands_ask_for_module_ids_and_env_takes_them() -> None:
    vendor = get_vendor("gaudi")
    assert vendor.commands() == [["hl-smi"], list(QUERY_ARGV)]
    assert vendor.traits.visible_devices_env == "HABANA_VISIBLE_MODULES"


def test_probe_joins_table_and_query(monkeypatch: pytest.MonkeyPatch) -> None:
    query = _synthetic_query(_parse(_table()))
    monkeypatch.setattr(proc, "run", fake_tool_run({("hl-smi",): _table(), QUERY_ARGV: query}))
    devices = get_vendor("gaudi").probe()
    assert [d.tool_id for d in devices] == [str(m) for m in MODULE_IDS]
    assert [d.file for d in devices] == [f"/dev/accel/accel{i}" for i in range(8)]
    assert all(d.uuid is None for d in devices)  # N/A uuid stays unset


def test_table_alone_has_no_module_ids() -> None:
    devices = _parse(_table())
    assert [d.index for d in devices] == list(range(8))
    assert all(d.tool_id is None for d in devices)


def test_query_with_header_line_in_any_capture_order() -> None:
    table = _parse(_table())
    devices = _parse(_synthetic_query(table, header=True), _table())
    assert [d.tool_id for d in devices] == [str(m) for m in MODULE_IDS]


def test_query_alone_yields_devices() -> None:
    devices = _parse(_synthetic_query(_parse(_table())))
    assert [(d.model, d.memory_mib, d.tool_id) for d in devices[:2]] == [
        ("HL-225", 98304, "3"),
        ("HL-225", 98304, "1"),
    ]


def test_query_with_fewer_aips_than_the_table_is_rejected() -> None:
    query = _synthetic_query(_parse(_table())[:7])
    with pytest.raises(ParseError, match=r"hl-smi -Q lists AIPs \[0, 1, 2, 3, 4, 5, 6\]"):
        _parse(_table(), query)


def test_query_disagreeing_on_bus_id_is_rejected() -> None:
    query = _synthetic_query(_parse(_table())).replace("0000:b3:00.0", "0000:b5:00.0")
    with pytest.raises(ParseError, match=r"at capture1:1: hl-smi -Q row disagrees with the table for AIP 0"):
        _parse(_table(), query)


def test_query_cut_inside_a_row_is_rejected() -> None:
    query = _synthetic_query(_parse(_table()))
    with pytest.raises(ParseError, match="CSV fields"):
        _parse(_table(), query[: query.index("98304", 200)])


def test_malformed_process_row_is_tolerated_but_must_name_a_known_aip() -> None:
    assert len(_parse(_table())) == 8  # the fixture's row for AIP 6 has no closing `|`
    text = _table().replace("|   6       618796", "|   9       618796")
    with pytest.raises(ParseError, match="process row names AIP 9"):
        _parse(text)


def test_uncorrectable_ecc_marks_unhealthy() -> None:
    # derived from the fixture: AIP 2's Volatile Uncorr. ECC cell set from 0 to 3
    text = _table().replace(
        "|   2  HL-225              N/A  | 0000:cc:00.0     N/A |                   0  |",
        "|   2  HL-225              N/A  | 0000:cc:00.0     N/A |                   3  |",
    )
    devices = _parse(text)
    assert [d.index for d in devices if d.health == Health.UNHEALTHY] == [2]
    assert devices[2].health_reason == "hl-smi reports 3 volatile uncorrectable ECC errors"


def test_unclosed_box_is_a_cut() -> None:
    text = _table().rstrip()
    without_border = text[: text.rindex("\n")]
    with pytest.raises(ParseError, match="Compute Processes table not closed"):
        _parse(without_border)


def test_two_tables_are_rejected() -> None:
    with pytest.raises(ParseError, match="one hl-smi table"):
        _parse(_table(), _table())


def test_affinity_from_tool_or_habanalabs_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    vendor = get_vendor("gaudi")
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    monkeypatch.setattr(glob, "glob", lambda pattern: [])
    assert vendor.affinity() == 0
    monkeypatch.setattr(
        glob, "glob", lambda pattern: ["/sys/class/accel/accel0/device/driver"] if "accel" in pattern else []
    )
    monkeypatch.setattr(os.path, "realpath", lambda path: "/sys/bus/pci/drivers/ivpu")
    assert vendor.affinity() == 0  # another accel driver (Intel NPU) is not Gaudi
    monkeypatch.setattr(os.path, "realpath", lambda path: "/sys/bus/pci/drivers/habanalabs")
    assert vendor.affinity() == 1
    monkeypatch.setattr(glob, "glob", lambda pattern: ["/dev/hl0"] if pattern.startswith("/dev/hl") else [])
    assert vendor.affinity() == 1
