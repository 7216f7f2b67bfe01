"""Ascend-specific behaviour beyond the shared contract: numbering, health, topology, the live path."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_hetero.core import proc
from slurm_hetero.core.errors import ParseError, ToolError
from slurm_hetero.core.model import Capture, Device, Health, Link
from slurm_hetero.vendors import get_vendor
from tests.conftest import FIXTURES, fake_tool_run

HERE = FIXTURES / "ascend"
INFO_8X = "npu-smi-info_8x-910b3_drv24.1.rc1.txt"
TOPO_8X = "npu-smi-info-t-topo_8x-910b3_hccs_cpu-affinity.txt"
TWO_CHIPS = "npu-smi-info_ascend910-2chips-per-npu_phy-id_drv25.2.0.txt"
NPU_64 = "npu-smi-info_2x-310p3_npu-id-0-and-64_drv23.0.rc3.txt"
ALARM_310B = "npu-smi-info_310b4_nohbm_alarm_drv23.0.0.txt"


def _text(name: str) -> str:
    return (HERE / name).read_text(encoding="utf-8")


def _parse(*texts: tuple[str, str]) -> list[Device]:
    return get_vendor("ascend").parse([Capture(source, text) for source, text in texts])


def _parse_files(*names: str) -> list[Device]:
    return _parse(*((name, _text(name)) for name in names))


def _table(name: str, text: str | None = None) -> list[Device]:
    """The device table of a published excerpt that drops npu-smi's process table (a whole capture
    without it is refused as cut, see test_info_without_its_process_table_is_a_cut): read with a topo
    capture of a device that has no topology, which npu-smi prints alone."""
    info = Capture(name, _text(name) if text is None else text)
    unsupported = Capture("topo.txt", "This device does not support querying topo.\n")
    return get_vendor("ascend").parse([info, unsupported])


# the live path ---------------------------------------------------------------------------------------


def test_commands_are_info_and_topo() -> None:
    assert get_vendor("ascend").commands() == [["npu-smi", "info"], ["npu-smi", "info", "-t", "topo"]]


def test_probe_runs_npu_smi_and_parses_both_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    outputs = {("npu-smi", "info"): _text(INFO_8X), ("npu-smi", "info", "-t", "topo"): _text(TOPO_8X)}
    monkeypatch.setattr(proc, "run", fake_tool_run(outputs))
    devices = get_vendor("ascend").probe()
    assert devices == _parse_files(INFO_8X, TOPO_8X)
    assert [d.file for d in devices] == [f"/dev/davinci{i}" for i in range(8)]
    assert all(d.links and d.cores for d in devices)


def test_probe_survives_a_failing_topology_query(monkeypatch: pytest.MonkeyPatch) -> None:
    topo_argv = ("npu-smi", "info", "-t", "topo")
    info = _text(TWO_CHIPS)
    outputs = {("npu-smi", "info"): info, topo_argv: ToolError(list(topo_argv), 1, "not supported")}
    monkeypatch.setattr(proc, "run", fake_tool_run(outputs))
    devices = get_vendor("ascend").probe()
    assert len(devices) == len(_table(TWO_CHIPS))
    assert all(not d.links and d.cores is None for d in devices)


def test_device_without_topology_support_gives_no_links(monkeypatch: pytest.MonkeyPatch) -> None:
    unsupported = "This device does not support querying topo.\n"
    outputs = {("npu-smi", "info"): _text(TWO_CHIPS), ("npu-smi", "info", "-t", "topo"): unsupported}
    monkeypatch.setattr(proc, "run", fake_tool_run(outputs))
    devices = get_vendor("ascend").probe()
    assert devices and all(d.links == () and d.cores is None for d in devices)


# numbering ----------------------------------------------------------------------------------------------


def test_two_chips_per_npu_are_two_devices_numbered_by_phy_id() -> None:
    devices = _parse_files(TWO_CHIPS)
    assert [(d.index, d.file, d.tool_id) for d in devices] == [
        (0, "/dev/davinci0", "npu0-chip0"),
        (1, "/dev/davinci1", "npu0-chip1"),
        (2, "/dev/davinci2", "npu1-chip0"),
        (3, "/dev/davinci3", "npu1-chip1"),
    ]
    assert [d.pci_bus_id for d in devices] == ["0000:9C:00.0", "0000:9E:00.0", "0000:37:00.0", "0000:39:00.0"]
    assert {d.model for d in devices} == {"Ascend910"}


def test_phy_id_column_gives_the_device_file_and_table_order_the_index() -> None:
    # derived from the real capture: the second NPU's dies sit on /dev/davinci6 and 7
    text = _text(TWO_CHIPS).replace("| 0     2     ", "| 0     6     ")
    text = text.replace("| 1     3     ", "| 1     7     ")
    devices = _parse((TWO_CHIPS, text))
    assert [(d.index, d.file) for d in devices] == [
        (0, "/dev/davinci0"),
        (1, "/dev/davinci1"),
        (2, "/dev/davinci6"),
        (3, "/dev/davinci7"),
    ]


def test_non_contiguous_npu_ids_use_the_device_column() -> None:
    devices = _table(NPU_64)
    assert [(d.index, d.file, d.tool_id) for d in devices] == [
        (0, "/dev/davinci0", "npu0-chip0"),
        (1, "/dev/davinci1", "npu64-chip0"),
    ]
    assert [d.memory_mib for d in devices] == [21527, 21527]  # LPDDR total: 310P3 has no HBM


def test_hbm_total_is_the_memory_of_910b() -> None:
    devices = _table(INFO_8X)
    assert {d.memory_mib for d in devices} == {65536}
    assert {d.driver_version for d in devices} == {"24.1.rc1.b030"}


def test_multi_chip_npu_without_an_id_column_is_refused() -> None:
    text = _text(TWO_CHIPS).replace("Chip  Phy-ID  ", "Chip          ")
    for old, new in (("| 0     0     ", "| 0           "), ("| 1     1     ", "| 1           ")):
        text = text.replace(old, new)
    text = text.replace("| 0     2     ", "| 0           ").replace("| 1     3     ", "| 1           ")
    with pytest.raises(ParseError, match="several chips"):
        _parse((TWO_CHIPS, text))


# health ---------------------------------------------------------------------------------------------------


def test_alarm_is_unhealthy_with_the_reported_value() -> None:
    [device] = _table(ALARM_310B)
    assert device.health == Health.UNHEALTHY
    assert device.health_reason == "npu-smi Health=Alarm"
    assert device.pci_bus_id is None  # Bus-Id NA
    assert device.memory_mib == 15609


@pytest.mark.parametrize("value", ["Warning", "Critical", "UNKNOWN"])
def test_any_health_but_ok_is_unhealthy(value: str) -> None:
    text = _text(ALARM_310B).replace("| Alarm          ", f"| {value:<15}")
    [device] = _table(ALARM_310B, text)
    assert (device.health, device.health_reason) == (Health.UNHEALTHY, f"npu-smi Health={value}")


def test_ok_is_healthy() -> None:
    assert {(d.health, d.health_reason) for d in _table(INFO_8X)} == {(Health.OK, None)}


# topology -----------------------------------------------------------------------------------------------


def test_hccs_links_every_pair_and_cpu_affinity_becomes_cores() -> None:
    devices = _parse_files(INFO_8X, TOPO_8X)
    for device in devices:
        peers = [p for p in range(8) if p != device.index]
        assert device.links == tuple(Link(peer=p, kind="hccs", count=1) for p in peers)
    assert [d.cores for d in devices] == ["144-167"] * 2 + ["96-119"] * 2 + ["0-23"] * 2 + ["48-71"] * 2


def test_capture_order_does_not_matter() -> None:
    assert _parse_files(TOPO_8X, INFO_8X) == _parse_files(INFO_8X, TOPO_8X)


def test_pcie_paths_are_not_links() -> None:
    topo = _text(TOPO_8X).replace("NPU0       X          HCCS", "NPU0       X          PIX ", 1)
    devices = _parse((INFO_8X, _text(INFO_8X)), (TOPO_8X, topo))
    assert [link.peer for link in devices[0].links] == [2, 3, 4, 5, 6, 7]
    assert 0 in [link.peer for link in devices[1].links]  # the matrix is taken row by row, as printed


def test_topology_labels_may_be_npu_ids() -> None:
    # derived: the same host seen with NPU ids 8..15 (logical ids stay 0..7), topo labelled by NPU id
    info = _text(INFO_8X)
    for npu in range(7, -1, -1):
        info = info.replace(f"| {npu}     910B3", f"| {npu + 8:<2}    910B3")
    topo = _text(TOPO_8X)
    for npu in range(7, -1, -1):
        topo = topo.replace(f"NPU{npu} ", f"NPU{npu + 8}")
    devices = _parse((INFO_8X, info), (TOPO_8X, topo))
    assert [(d.index, d.tool_id, d.file) for d in devices][:2] == [
        (0, "npu8-chip0", "/dev/davinci8"),
        (1, "npu9-chip0", "/dev/davinci9"),
    ]
    assert [link.peer for link in devices[0].links] == [1, 2, 3, 4, 5, 6, 7]
    assert devices[7].cores == "48-71"


def test_topology_from_another_host_is_refused() -> None:
    with pytest.raises(ParseError, match="matching neither"):
        _parse_files(NPU_64, TOPO_8X)


def test_topology_alone_asks_for_the_device_table() -> None:
    with pytest.raises(ParseError, match="also capture `npu-smi info`"):
        _parse_files(TOPO_8X)


def test_two_device_tables_are_refused() -> None:
    with pytest.raises(ParseError, match="two info captures"):
        _parse_files(INFO_8X, INFO_8X)


def test_errors_name_tool_source_and_line() -> None:
    chip_row = "| 0       0                     | NA     "
    text = _text(ALARM_310B).replace(chip_row, "| 0       x                     | NA     ")
    with pytest.raises(ParseError) as excinfo:
        _parse((str(Path("node1") / ALARM_310B), text))
    message = str(excinfo.value)
    assert "npu-smi info" in message and f"node1/{ALARM_310B}:8" in message and "\n" not in message


@pytest.mark.parametrize("name", [INFO_8X, NPU_64, ALARM_310B])
def test_info_without_its_process_table_is_a_cut(name: str) -> None:
    with pytest.raises(ParseError, match="without the process table"):
        _parse_files(name)


def test_info_cut_after_fifteen_lines_is_refused_not_three_npus() -> None:
    cut = "".join(_text(INFO_8X).splitlines(keepends=True)[:15])
    assert len(_table(INFO_8X, cut)) == 3  # what the table alone would give
    with pytest.raises(ParseError, match="npu-smi info"):
        _parse((INFO_8X, cut))
