"""Iluvatar-specific behaviour beyond the shared contract: banner versions, table endings, the live path."""

from __future__ import annotations

import pytest

from slurm_hetero.core.errors import ParseError
from slurm_hetero.core.model import Capture, Device
from slurm_hetero.vendors import get_vendor
from tests.conftest import FIXTURES

HERE = FIXTURES / "iluvatar"
PADDLE = "ixsmi_2x-bi-v150_drv4.3.0_paddle-docs.txt"
PLUGIN = "ixsmi_1x-bi-v150s_drv4.1.0_ix-device-plugin.txt"
RESET = "ixsmi_7x-bi-v100_drv3.0.1_reset-script.txt"


def _text(name: str) -> str:
    return (HERE / name).read_text(encoding="utf-8")


def _parse(text: str) -> list[Device]:
    return get_vendor("iluvatar").parse([Capture("ixsmi.txt", text)])


def test_banner_versions() -> None:
    assert {(d.driver_version, d.runtime_version) for d in _parse(_text(PADDLE))} == {("4.3.0", "10.2")}
    [plugin] = _parse(_text(PLUGIN))
    assert (plugin.model, plugin.driver_version, plugin.runtime_version) == (
        "Iluvatar BI-V150S",
        "4.1.0",
        None,
    )


def test_renumbered_gpus_after_a_lost_one() -> None:
    devices = _parse(_text(RESET))
    assert len(devices) == 7  # the GPU at 0000:21:00.0 vanished; the index after it shifted
    assert devices[5].pci_bus_id == "0000:25:00.0"


def test_capture_up_to_the_first_blank_line_is_accepted_but_not_one_cut_on_the_border() -> None:
    text = _text(PADDLE)
    up_to_blank = text[: text.index("\n\n") + 2]
    assert len(_parse(up_to_blank)) == 2
    with pytest.raises(ParseError, match="not followed by a blank line"):
        _parse(up_to_blank[:-1])


def test_cut_processes_box_is_rejected() -> None:
    text = _text(PLUGIN)
    with pytest.raises(ParseError, match="processes table"):
        _parse(text[: text.index("|  No running")])


def test_separator_cut_after_a_column_is_rejected() -> None:
    text = _text(PADDLE)
    end = text.index("+---", text.index("| 0    Iluvatar"))
    with pytest.raises(ParseError, match="separator of the wrong width"):
        _parse(text[: end + 33] + "\n")  # `+----+` up to the first column


def test_nvidia_smi_table_is_not_ixsmi() -> None:
    text = _text(PADDLE).replace(
        "IX-ML: 4.3.0       Driver Version: 4.3.0", "NVIDIA-SMI 4.3.0  Driver Version: 4.3.0 "
    )
    with pytest.raises(ParseError, match="not an ixsmi table"):
        _parse(text)
