"""Moore Threads-specific behaviour: the used > total FAQ case, device blocks, the live path.

The only public capture shows one GPU. Variants below are derived from it in the test (marked so):
a corrected memory cell, and a second GPU block appended after a `+---+` separator.
"""

from __future__ import annotations

import pytest

from slurm_hetero.core.errors import ParseError
from slurm_hetero.core.model import Capture, Device, Health
from slurm_hetero.vendors import get_vendor
from tests.conftest import FIXTURES

FAQ = "mthreads-gmi_mtt-s4000_drv1.2.0_wrong-mem-total_faq.txt"
RULE = "+-------------------------------------------------------------+\n"


def _text() -> str:
    return (FIXTURES / "mthreads" / FAQ).read_text(encoding="utf-8")


def _parse(text: str) -> list[Device]:
    return get_vendor("mthreads").parse([Capture("mthreads-gmi.txt", text)])


def _sane_memory(text: str) -> str:
    # derived: the FAQ's wrong `44302MiB(32768MiB)` replaced by a consistent reading of a 48 GiB S4000
    return text.replace("44302MiB(32768MiB)", "44302MiB(49152MiB)")


def _two_gpus() -> str:
    # derived: the fixture's GPU block repeated as GPU 1 on another bus, after a `+---+` separator
    head, block = _sane_memory(_text()).split(RULE)
    second = block.replace("0    MTT S4000      |00000000:08:00.0", "1    MTT S4000      |00000000:09:00.0")
    return head + RULE + block + RULE + second


def test_used_above_total_keeps_the_gpu_unhealthy_without_memory() -> None:
    [device] = _parse(_text())
    assert (device.model, device.index, device.file) == ("MTT S4000", 0, "/dev/mtgpu.0")
    assert device.memory_mib is None  # 32768 is known to be wrong; the catalog supplies 48 GiB
    assert device.health == Health.UNHEALTHY
    reason = device.health_reason or ""
    assert "44302 MiB used of a 32768 MiB total" in reason and "IOMMU" in reason and "question 5" in reason


def test_consistent_memory_is_healthy() -> None:
    [device] = _parse(_sane_memory(_text()))
    assert (device.memory_mib, device.health, device.health_reason) == (49152, Health.OK, None)
    assert (device.pci_bus_id, device.driver_version, device.partition_mode) == (
        "0000:08:00.0",
        "1.2.0",
        None,
    )


def test_gpus_separated_by_plus_rules() -> None:
    devices = _parse(_two_gpus())
    assert [(d.index, d.pci_bus_id) for d in devices] == [(0, "0000:08:00.0"), (1, "0000:09:00.0")]


def test_output_cut_after_a_separator_is_rejected() -> None:
    with pytest.raises(ParseError, match="device block of 0 lines"):
        _parse(_sane_memory(_text()) + RULE)


def test_half_device_block_is_rejected() -> None:
    text = _text()
    cut = text[: text.index("|      N/A")]  # the third line of the block starts, its ECC cell is gone
    cut = cut[: cut.rindex("\n") + 1]
    with pytest.raises(ParseError, match="device block of 2 lines"):
        _parse(cut)


def test_mpc_parent_goes_to_partition_mode() -> None:
    # derived: Device Type `Physical` replaced by `MPC Parent`, as mthreads-gmi -cf prints for MPC mode
    text = _sane_memory(_text()).replace("     Physical       |", "     MPC Parent     |")
    assert _parse(text)[0].partition_mode == "MPC Parent"


def test_columns_that_drift_from_the_header_are_rejected() -> None:
    text = _text().replace("0    MTT S4000      |00000000:08:00.0", "0    MTT S4000 |00000000:08:00.0")
    with pytest.raises(ParseError, match="header's columns"):
        _parse(text)


def test_unclosed_processes_section_is_rejected() -> None:
    text = _sane_memory(_text()) + "-" * 63 + "\n\n" + "-" * 63 + "\nProcesses:\nID   PID\n" + RULE
    with pytest.raises(ParseError, match="Processes section not closed"):
        _parse(text)
    assert len(_parse(text + "   No running processes found\n" + "-" * 63 + "\n")) == 1


def test_other_tools_banner_is_rejected() -> None:
    with pytest.raises(ParseError, match="not mthreads-gmi output"):
        _parse(_text().replace("mthreads-gmi:1.12.2", "xpu-smi:1.12.2"))
