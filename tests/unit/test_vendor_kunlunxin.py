"""Kunlunxin (xpu_smi) behaviour beyond the shared contract: column variants, health, SR-IOV, live path."""

from __future__ import annotations

import pytest

from slurm_hetero.core.errors import ParseError
from slurm_hetero.core.model import Capture, Device, Health
from slurm_hetero.vendors import get_vendor
from tests.conftest import FIXTURES

HERE = FIXTURES / "kunlunxin"
R300 = "xpu_smi_2x-kunlunxin-r300_paddle-docs.txt"
INTEL_TABLE = FIXTURES / "intel" / "xpu-smi-discovery_intel-0x020a.txt"

# The wide layout of XRE 4.0 (with State; Power, Temp, Freq, Firmware and CPLD columns left out), as
# Kunlunxin's XRE guide and FAQ print it for an R200 next to a K100; State E marks the K100 for the test.
WIDE = """Runtime Version: 4.0
Driver Version: 4.0
  DEVICES
-----------------------------------------------------------------------------------------------------------
| DevID |   PCI Addr   | Model |        SN        |    INODE   | State | UseRate |    L3     |    Memory    |
-----------------------------------------------------------------------------------------------------------
|     0 | 0000:01:00.0 | R200  | 02K00Y6217V00009 | /dev/xpu0  |     N |     0 % | 0 / 63 MB | 0 / 16384 MB |
|     1 | 0000:06:00.0 | K100  | 000000000000022f | /dev/xpu1  |     E |     0 % | 0 / 16 MB |  0 / 8064 MB |
-----------------------------------------------------------------------------------------------------------
  PROCESSES
-------------------------------------------------
| DevID | PID | Streams | L3 | Memory | Command |
-------------------------------------------------
|     0 | 123 |       1 |  0 | 512 MB | python  |
-------------------------------------------------
"""

SRIOV = """Runtime Version: 4.0
Driver Version: 4.0
  DEVICES
--------------------------------------------------------------------------------
| DevID |   PCI Addr   |    Model    |    INODE   |    L3     |    Memory     |
--------------------------------------------------------------------------------
|     0 | 0000:01:00.0 | R200-PF     | /dev/xpu0  | 0 / 63 MB | 0 / 13568 MB  |
|     1 | 0000:01:01.0 | R200-VF-5G  | /dev/xpu1  | 0 / 15 MB | 0 / 4006 MB   |
--------------------------------------------------------------------------------
  PROCESSES
-------------------------------------------------
| DevID | PID | Streams | L3 | Memory | Command |
-------------------------------------------------
-------------------------------------------------
"""


def _text(name: str = R300) -> str:
    return (HERE / name).read_text(encoding="utf-8")


def _parse(*texts: str) -> list[Device]:
    return get_vendor("kunlunxin").parse([Capture(f"capture{i}", text) for i, text in enumerate(texts)])


def test_versions_and_memory_total() -> None:
    devices = _parse(_text())
    facts = [(d.memory_mib, d.driver_version, d.runtime_version) for d in devices]
    assert facts == [(32768, "4.0", "4.31")] * 2
    assert [d.pci_bus_id for d in devices] == ["0000:53:00.0", "0000:56:00.0"]


def test_wide_layout_and_state_column() -> None:
    r200, k100 = _parse(WIDE)
    assert (r200.model, r200.memory_mib, r200.health) == ("R200", 16384, Health.OK)
    assert (k100.model, k100.memory_mib, k100.health) == ("K100", 8064, Health.UNHEALTHY)
    assert k100.health_reason is not None and "State E" in k100.health_reason


def test_sriov_physical_function_is_unhealthy_and_virtual_functions_are_marked() -> None:
    pf, vf = _parse(SRIOV)
    assert (pf.health, pf.partition_mode) == (Health.UNHEALTHY, "sriov-pf")
    assert (vf.health, vf.partition_mode, vf.memory_mib) == (Health.OK, "sriov-vf", 4006)


def test_missing_processes_section_is_a_cut() -> None:
    text = _text()
    with pytest.raises(ParseError, match="no PROCESSES section"):
        _parse(text[: text.index("  PROCESSES")])


def test_video_rows_must_match_devices() -> None:
    text = _text()
    video_row_1 = "|     1 |  R300 | 0 %, 0 fps, 800 MHz | 0 %, 0 fps, 800 MHz | 0 %, 0 fps, 800 MHz |\n"
    with pytest.raises(ParseError, match=r"VIDEO lists DevIDs \[0\] but DEVICES lists \[0, 1\]"):
        _parse(text.replace(video_row_1, ""))


def test_process_of_an_unknown_device_fails() -> None:
    with pytest.raises(ParseError, match="PROCESSES row names DevID '7'"):
        _parse(WIDE.replace("|     0 | 123 |", "|     7 | 123 |"))


def test_missing_required_column_fails() -> None:
    with pytest.raises(ParseError, match=r"lacks \['INODE'\]"):
        _parse(SRIOV.replace("|    INODE   |", "|    INOxE   |"))


def test_intel_xpu_smi_output_is_rejected() -> None:
    with pytest.raises(ParseError, match="not xpu_smi output"):
        _parse(INTEL_TABLE.read_text(encoding="utf-8"))


def test_error_names_tool_source_and_line() -> None:
    text = _text().replace("0 / 32768 MB |\n|     1", "0 / lots MB |\n|     1")
    with pytest.raises(ParseError) as err:
        _parse(text)
    message = str(err.value)
    assert message.startswith("cannot parse xpu_smi output (kunlunxin) at capture0:7:")
    assert "\n" not in message


@pytest.mark.parametrize("text", [_text(), WIDE, SRIOV], ids=["r300", "wide", "sriov"])
def test_every_prefix_fails_or_is_the_whole_output(text: str) -> None:
    whole = _parse(text)
    for i in range(len(text)):
        try:
            devices = _parse(text[:i])
        except ParseError as e:
            assert "\n" not in str(e)
        else:
            assert devices == whole, f"cut at {i} parsed as {devices}"


def test_every_dropped_line_fails_or_parses() -> None:
    lines = _text().splitlines(keepends=True)
    for i in range(len(lines)):
        try:
            _parse("".join(lines[:i] + lines[i + 1 :]))
        except ParseError as e:
            assert "\n" not in str(e)
