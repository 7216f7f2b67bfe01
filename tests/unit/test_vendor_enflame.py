"""Enflame (efsmi) behaviour beyond the shared contract: memory column, bus ids, blocks, live path."""

from __future__ import annotations

import pytest

from slurm_hetero.core.errors import ParseError
from slurm_hetero.core.model import Capture, Device
from slurm_hetero.vendors import get_vendor
from tests.conftest import FIXTURES

HERE = FIXTURES / "enflame"
S60 = "efsmi_2x-enflame-s60_paddle-docs.txt"
DEVICE_1 = """|--------------------------------------------------------------------------|
| 1      S60                 | 33.6.5          | 00:09:00.0  Enable        |
| 46 C   Active   128W  300W | 42976MiB Disable|   0.0%      C807J40510285 |
+--------------------------------------------------------------------------+
"""


def _text() -> str:
    return (HERE / S60).read_text(encoding="utf-8")


def _parse(*texts: str) -> list[Device]:
    return get_vendor("enflame").parse([Capture(f"capture{i}", text) for i, text in enumerate(texts)])


def test_mem_column_is_capacity_after_ecc() -> None:
    ecc_off, ecc_on = _parse(_text())
    assert (ecc_off.memory_mib, ecc_on.memory_mib) == (49120, 42976)
    assert abs(ecc_off.memory_mib * 7 / 8 - ecc_on.memory_mib) <= 8  # ECC keeps 7/8


def test_bus_ids_are_widened_to_the_sysfs_form() -> None:
    assert [d.pci_bus_id for d in _parse(_text())] == ["0000:01:00.0", "0000:09:00.0"]
    short = _text().replace("00:09:00.0  Enable ", "09:00.0  Enable    ")
    assert _parse(short)[1].pci_bus_id == "0000:09:00.0"


def test_driver_version_and_model() -> None:
    assert {(d.model, d.driver_version) for d in _parse(_text())} == {("S60", "1.2.0.301")}


def test_a_block_of_three_rows_fails() -> None:
    extra = "| 46 C   Active   128W  300W | 42976MiB Disable|   0.0%      C807J40510285 |\n"
    text = _text().replace(extra, extra * 2)
    with pytest.raises(ParseError, match="a device block of 3 rows, expected 2"):
        _parse(text)


def test_repeated_device_number_fails() -> None:
    text = _text() + DEVICE_1
    with pytest.raises(ParseError, match=r"DEV numbers \[0, 1, 1\] repeat"):
        _parse(text)


def test_one_capture_only() -> None:
    with pytest.raises(ParseError, match="expected one `efsmi` output, got 2"):
        _parse(_text(), _text())


@pytest.mark.parametrize(
    "other",
    ["kunlunxin/xpu_smi_2x-kunlunxin-r300_paddle-docs.txt", "intel/xpu-smi-discovery_intel-0x020a.txt"],
)
def test_other_tools_are_rejected(other: str) -> None:
    with pytest.raises(ParseError, match="not efsmi output"):
        _parse((FIXTURES / other).read_text(encoding="utf-8"))


def test_every_prefix_fails_or_is_a_whole_block_count() -> None:
    text = _text()
    whole = _parse(text)
    for i in range(len(text)):
        try:
            devices = _parse(text[:i])
        except ParseError as e:
            assert "\n" not in str(e)
        else:  # efsmi prints no device count: a cut right after a block reads as fewer cards (known gap)
            assert devices == whole[: len(devices)], f"cut at {i} parsed as {devices}"


def test_a_table_cut_before_its_closing_border_is_refused() -> None:
    """Issue 26 repro 7: cut after the `|---|` that opens device 1 (its rows and border never
    printed), the table parsed to 1 of 2 devices."""
    text = _text()
    cut = text[: text.index(DEVICE_1.splitlines()[1])]
    assert cut.endswith("|\n") and cut.rstrip("\n").splitlines()[-1].startswith("|---")
    with pytest.raises(ParseError, match=r"does not end on a '\+---\+' border"):
        _parse(cut)
    assert len(_parse(text)) == 2
