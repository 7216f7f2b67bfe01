"""Intel (xpu-smi) behaviour beyond the shared contract: merging, topology, variants, the live path."""

from __future__ import annotations

import pytest

from slurm_hetero.core import proc
from slurm_hetero.core.errors import ParseError, ToolError
from slurm_hetero.core.model import Capture, Device, Link
from slurm_hetero.vendors import get_vendor
from tests.conftest import FIXTURES, fake_tool_run

HERE = FIXTURES / "intel"
TABLE = "xpu-smi-discovery_intel-0x020a.txt"
DETAIL = "xpu-smi-discovery-d_intel-0x020a-detail.txt"
MATRIX = "xpu-smi-topology-m_2card-2tile_xelink.txt"
KUNLUN = FIXTURES / "kunlunxin" / "xpu_smi_2x-kunlunxin-r300_paddle-docs.txt"
WIDTH = 100


def _text(name: str) -> str:
    return (HERE / name).read_text(encoding="utf-8")


def _parse(*texts: str) -> list[Device]:
    return get_vendor("intel").parse([Capture(f"capture{i}", text) for i, text in enumerate(texts)])


def _row(id_cell: str, info: str) -> str:
    return f"| {id_cell:<10}| {info:<{WIDTH - 16}} |"


def _box(devices: dict[int, list[str]]) -> str:
    """A discovery table in xpu-smi's layout, for variants no public capture shows."""
    border = "+" + "-" * 11 + "+" + "-" * (WIDTH - 14) + "+"
    lines = [border, _row("Device ID", "Device Information"), border]
    for device_id, infos in devices.items():
        lines += [_row(str(device_id) if i == 0 else "", info) for i, info in enumerate(infos)] + [border]
    return "\n".join(lines) + "\n"


def _two_card_table() -> str:
    """The fixture's table with a second card added, to pair with the real 2-card matrix."""
    card = ["Device Name: Intel(R) Data Center GPU Max 1550", "PCI BDF Address: 0000:{}:00.0"]
    return _box({0: [card[0], card[1].format("4d")], 1: [card[0], card[1].format("9a")]})


# the live path -------------------------------------------------------------------------------------
def test_commands_are_argv_lists_of_xpu_smi() -> None:
    assert get_vendor("intel").commands() == [["xpu-smi", "discovery"], ["xpu-smi", "topology", "-m"]]


def test_probe_runs_table_then_detail_per_device_then_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    outputs: dict[tuple[str, ...], str | Exception] = {
        ("xpu-smi", "discovery"): _text(TABLE),
        ("xpu-smi", "discovery", "-d", "0"): _text(DETAIL),
        ("xpu-smi", "topology", "-m"): ToolError(["xpu-smi", "topology", "-m"], 1, "not supported"),
    }
    monkeypatch.setattr(proc, "run", fake_tool_run(outputs))
    devices = get_vendor("intel").probe()
    assert devices == _parse(_text(TABLE), _text(DETAIL))
    assert devices[0].memory_mib == 32768 and devices[0].driver_version == "16929133"


def test_probe_with_a_matrix_of_other_cards_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    outputs: dict[tuple[str, ...], str | Exception] = {
        ("xpu-smi", "discovery"): _text(TABLE),
        ("xpu-smi", "discovery", "-d", "0"): _text(DETAIL),
        ("xpu-smi", "topology", "-m"): _text(MATRIX),
    }
    monkeypatch.setattr(proc, "run", fake_tool_run(outputs))
    with pytest.raises(ParseError, match=r"xpu-smi topology -m: the topology matrix shows cards \[0, 1\]"):
        get_vendor("intel").probe()


# captures and how they combine ---------------------------------------------------------------------
def test_table_alone_has_no_memory_and_keeps_the_model_as_reported() -> None:
    (device,) = _parse(_text(TABLE))
    assert device.model == "Intel(R) Graphics [0x020a]" and device.memory_mib is None
    assert device.file == "/dev/dri/renderD128" and device.type == ""


def test_detail_alone_is_a_complete_device() -> None:
    assert _parse(_text(DETAIL)) == _parse(_text(TABLE), _text(DETAIL))


def test_captures_may_come_in_any_order() -> None:
    assert _parse(_text(DETAIL), _text(TABLE)) == _parse(_text(TABLE), _text(DETAIL))


def test_two_cards_with_the_real_matrix_get_cores_and_xe_links() -> None:
    devices = _parse(_two_card_table(), _text(MATRIX))
    assert [d.cores for d in devices] == ["0-23,48-71", "24-47,72-95"]
    # XL16 between 0/0-1/1 and 0/1-1/0 (direct, 16 lanes each); XL* (via MDF) adds nothing
    assert [d.links for d in devices] == [(Link(1, "xelink", 32),), (Link(0, "xelink", 32),)]
    assert [d.file for d in devices] == ["/dev/dri/renderD128", "/dev/dri/renderD129"]


def test_matrix_alone_names_the_missing_discovery() -> None:
    with pytest.raises(ParseError, match="alone lists no devices; also give `xpu-smi discovery`"):
        _parse(_text(MATRIX))


def test_conflicting_values_across_captures_fail() -> None:
    other = _text(DETAIL).replace("0000:4d:00.0", "0000:4e:00.0")
    with pytest.raises(ParseError, match="PCI BDF Address is '0000:4e:00.0' here but '0000:4d:00.0'"):
        _parse(_text(TABLE), other)


# variants ------------------------------------------------------------------------------------------
def test_newer_keys_soc_uuid_and_virtual_functions() -> None:
    name = "Device Name: Intel(R) Data Center GPU Flex 170"
    text = _box(
        {
            0: [
                name,
                "SOC UUID: 00000000-0000-0000-abcd-345634563456",
                "PCI BDF Address: 0000:90:00.0",
                "DRM Device: /dev/dri/card1",
                "Function Type: physical",
            ],
            1: [name, "PCI BDF Address: 0000:90:00.1", "Function Type: virtual"],
        }
    )
    devices = _parse(text)
    assert devices[0].uuid == "00000000-0000-0000-abcd-345634563456" and devices[0].partition_mode is None
    assert devices[1].partition_mode == "sriov-vf"


def test_wrapped_value_rows_are_joined() -> None:
    text = _box({0: ["Device Name: Intel(R) Data Center GPU Max 1550", "PCI Slot: Riser 1,", "  slot 1"]})
    assert _parse(text)[0].model == "Intel(R) Data Center GPU Max 1550"


def test_memory_in_gib_and_bad_memory() -> None:
    name = "Device Name: Intel(R) Data Center GPU Max 1100"
    assert _parse(_box({0: [name, "Memory Physical Size: 48.00 GiB"]}))[0].memory_mib == 49152
    with pytest.raises(ParseError, match="Memory Physical Size 'lots' is not"):
        _parse(_box({0: [name, "Memory Physical Size: lots"]}))


def test_device_without_name_fails() -> None:
    with pytest.raises(ParseError, match="device 0 has no 'Device Name'"):
        _parse(_box({0: ["PCI BDF Address: 0000:90:00.0"]}))


def test_matrix_without_tiles_and_unknown_relationship() -> None:
    table = _box({0: ["Device Name: Flex"], 1: ["Device Name: Flex"]})
    matrix = "      GPU 0|GPU 1|CPU Affinity\nGPU 0 |S    |SYS  |0-7\nGPU 1 |SYS  |S    |8-15\n"
    assert [d.cores for d in _parse(table, matrix)] == ["0-7", "8-15"]
    assert all(d.links == () for d in _parse(table, matrix))
    with pytest.raises(ParseError, match="unknown relationship 'XYZ'") as err:
        _parse(table, matrix.replace("SYS  |0-7", "XYZ  |0-7"))
    assert "capture1:2" in str(err.value)


def test_matrix_with_self_off_the_diagonal_fails() -> None:
    table = _box({0: ["Device Name: Flex"], 1: ["Device Name: Flex"]})
    with pytest.raises(ParseError, match="belongs on the diagonal"):
        _parse(table, "      GPU 0|GPU 1\nGPU 0 |S    |S\nGPU 1 |SYS  |S\n")


# rejection and robustness --------------------------------------------------------------------------
def test_kunlunxin_xpu_smi_output_is_rejected() -> None:
    with pytest.raises(ParseError, match="not xpu-smi output"):
        _parse(KUNLUN.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", [TABLE, DETAIL])
def test_every_prefix_and_every_dropped_line_is_a_parse_error_or_a_result(name: str) -> None:
    text = _text(name)
    lines = text.splitlines(keepends=True)
    dropped = ["".join(lines[:i] + lines[i + 1 :]) for i in range(len(lines))]
    variants = [text[:i] for i in range(len(text))] + dropped
    for variant in variants:
        try:
            _parse(variant)
        except ParseError as e:
            assert "\n" not in str(e)


def test_every_prefix_of_the_matrix_fails_or_is_the_whole_matrix() -> None:
    text, table = _text(MATRIX), _two_card_table()
    whole = _parse(table, text)
    for i in range(len(text)):
        try:
            devices = _parse(table, text[:i])
        except ParseError as e:
            assert "\n" not in str(e)
        else:  # only the final newline (and the last row's) may be missing
            assert devices == whole, f"cut at {i} parsed as {devices}"
