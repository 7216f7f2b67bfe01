"""Cambricon-specific behaviour beyond the shared contract: both cnmon layouts, health, the live path.

Variants below are derived from the real fixtures by editing one cell in the test (marked so); no
capture is invented.
"""

from __future__ import annotations

import pytest

from slurm_hetero.core.errors import ParseError
from slurm_hetero.core.model import Capture, Device, Health
from slurm_hetero.vendors import get_vendor
from tests.conftest import FIXTURES

HERE = FIXTURES / "cambricon"
V5 = "cnmon_2x-mlu370-x8_v5.10.13_paddle-docs.txt"
V4 = "cnmon_3x-mlu370-x4_v4.20.11_paddle-docs.txt"


def _text(name: str) -> str:
    return (HERE / name).read_text(encoding="utf-8")


def _parse(text: str, source: str = "cnmon.txt") -> list[Device]:
    return get_vendor("cambricon").parse([Capture(source, text)])


def test_v5_layout_takes_driver_from_the_banner() -> None:
    devices = _parse(_text(V5))
    assert {d.driver_version for d in devices} == {"5.10.13"}
    assert {(d.model, d.memory_mib, d.type) for d in devices} == {("MLU370-X8", 23374, "")}
    assert all(d.health == Health.OK and d.partition_mode is None for d in devices)


def test_v4_layout_has_no_bus_id_and_a_driver_per_card() -> None:
    devices = _parse(_text(V4))
    assert [d.index for d in devices] == [0, 1, 2]
    assert {(d.pci_bus_id, d.driver_version, d.memory_mib) for d in devices} == {(None, "4.20.11", 23308)}


def test_card_not_initialised_is_kept_but_unhealthy() -> None:
    # derived from the v4.20.11 fixture: card 1's `Inited` cell turned from On to Off
    text = _text(V4).replace(
        "| 1     /   MLU370-X4    v1.1.6 | On  ", "| 1     /   MLU370-X4    v1.1.6 | Off "
    )
    devices = _parse(text)
    assert [d.health for d in devices] == [Health.OK, Health.UNHEALTHY, Health.OK]
    assert "Inited: Off" in (devices[1].health_reason or "")


def test_sriov_vf_column_goes_to_partition_mode() -> None:
    # derived from the v5.10.13 fixture: card 1's VF column `/` replaced by a VF number (format unverified)
    text = _text(V5).replace("| 1     /   MLU370-X8", "| 1     2   MLU370-X8")
    assert [d.partition_mode for d in _parse(text)] == [None, "vf2"]


def test_cut_processes_box_names_tool_source_and_line() -> None:
    text = _text(V5)
    cut = text[: text.index("No running processes")]
    with pytest.raises(ParseError) as excinfo:
        _parse(cut, source="node7-cnmon.txt")
    message = str(excinfo.value)
    assert "cnmon" in message and "node7-cnmon.txt:" in message and "processes table" in message
    assert "\n" not in message


def test_table_ending_on_its_last_border_is_a_cut() -> None:
    text = _text(V5)
    cut = text[: text.index("\n\n") + 1]  # the card table without the blank line and processes box
    with pytest.raises(ParseError, match="not followed by a blank line"):
        _parse(cut)
    assert len(_parse(cut + "\n")) == 2  # what `cnmon | grep -B99999 '^ *$'` would keep


def test_half_card_block_is_rejected() -> None:
    lines = _text(V5).splitlines(keepends=True)
    without_second_row = "".join(line for n, line in enumerate(lines) if n != 10)  # card 1's second row
    with pytest.raises(ParseError, match="device block of 1 rows"):
        _parse(without_second_row)


def test_other_box_tables_are_not_cnmon() -> None:
    text = _text(V5).replace("CNMON v5.10.13", "EFSMI V1.2.0 ")
    with pytest.raises(ParseError, match="not a cnmon table"):
        _parse(text)


def test_exactly_one_capture_is_expected() -> None:
    vendor = get_vendor("cambricon")
    with pytest.raises(ParseError, match="expected one"):
        vendor.parse([Capture("a", _text(V5)), Capture("b", _text(V4))])
    with pytest.raises(ParseError):
        vendor.parse([])
