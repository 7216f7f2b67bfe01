"""MetaX-specific behaviour: the three table layouts, GPU-State health, topology, the live path.

Variants below marked "derived" are edits of the real captures made in the test, each named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_hetero.core import proc
from slurm_hetero.core.devicespec import DeviceSpec
from slurm_hetero.core.errors import ParseError
from slurm_hetero.core.model import Capture, Device, Health, Link
from slurm_hetero.vendors import get_vendor
from tests.conftest import FIXTURES, fake_tool_run

HERE = FIXTURES / "metax"
SWIFT = "mx-smi_table_8x-c500_drv3.4.4_ms-swift-docs.txt"
TOPO_M = "mx-smi_topo-m_8x-c500_metaxlink_ms-swift-docs.txt"
TOPO_N = "mx-smi_topo-n_8x-c500_metaxlink-6nic_ms-swift-docs.txt"
ERNIE = "mx-smi_table_8x-c550_drv2.15.9_ernie-docs.txt"
PADDLENLP = "mx-smi_table_8x-mxc550_drv2.5.014_paddlenlp-docs.txt"
BLOG = "mx-smi_table_4x-mxc500_drv2.5.014_busy_blog.txt"


def _text(name: str) -> str:
    return (HERE / name).read_text(encoding="utf-8")


def _parse(*texts: str) -> list[Device]:
    return get_vendor("metax").parse([Capture(f"capture{i}.txt", t) for i, t in enumerate(texts)])


def test_commands_files_and_runtime_facts() -> None:
    vendor = get_vendor("metax")
    assert vendor.commands() == [["mx-smi"], ["mx-smi", "topo", "-m"]]
    assert vendor.traits.visible_devices_env == "MACA_VISIBLE_DEVICES"  # read before CUDA_VISIBLE_DEVICES
    assert vendor.device_glob == "/dev/mxcd"
    facts = {
        k: getattr(vendor.traits, k)
        for k in ("torch_backend", "torch_package", "torch_device", "stack_label")
    }
    assert facts == {
        "torch_backend": "nccl",
        "torch_package": None,
        "torch_device": "cuda",
        "stack_label": "maca",
    }


def test_probe_runs_the_table_and_the_topology(monkeypatch: pytest.MonkeyPatch) -> None:
    outputs = {("mx-smi",): _text(SWIFT), ("mx-smi", "topo", "-m"): _text(TOPO_M)}
    monkeypatch.setattr(proc, "run", fake_tool_run(outputs))
    devices = get_vendor("metax").probe()
    assert devices == _parse(_text(SWIFT), _text(TOPO_M))
    assert [d.file for d in devices] == [f"/dev/dri/card{i}" for i in range(8)]


def test_four_column_layout_2_2_9_takes_the_gpu_column_not_the_board() -> None:
    devices = _parse(_text(SWIFT))
    assert [(d.index, d.model, d.memory_mib) for d in devices] == [(i, "MetaX C500", 65536) for i in range(8)]
    assert [d.pci_bus_id for d in devices][:4] == [
        "0000:0e:00.0",
        "0000:0f:00.0",
        "0000:10:00.0",
        "0000:12:00.0",
    ]
    assert {(d.driver_version, d.runtime_version, d.health) for d in devices} == {
        ("3.4.4", "3.3.0.15", Health.OK)
    }


def test_gpu_state_layout_2_2_4() -> None:
    devices = _parse(_text(ERNIE))
    assert len(devices) == 8 and {d.model for d in devices} == {"MetaX C550"}
    assert devices[7].pci_bus_id == "0000:d7:00.0"
    assert {(d.driver_version, d.runtime_version) for d in devices} == {("2.15.9", "2.32.0.6")}


def test_oldest_layout_2_1_6_with_busy_gpus() -> None:
    nlp = _parse(_text(PADDLENLP))
    assert [d.model for d in nlp] == ["MXC550"] * 8 and nlp[4].pci_bus_id == "0000:aa:00.0"
    blog = _parse(_text(BLOG))
    # 60982 of 65536 MiB in use: the total is what counts; four processes in the Process: box
    assert [(d.index, d.model, d.memory_mib) for d in blog] == [(i, "MXC500", 65536) for i in range(4)]
    assert {(d.driver_version, d.runtime_version) for d in blog} == {("2.5.014", "2.23.0.1018")}


def test_topology_gives_metaxlink_groups_numa_and_cores() -> None:
    devices = _parse(_text(SWIFT), _text(TOPO_M))
    assert devices[0].links == tuple(Link(peer, "metaxlink") for peer in (1, 2, 3))
    assert devices[6].links == tuple(Link(peer, "metaxlink") for peer in (4, 5, 7))
    assert {(d.numa_node, d.cores) for d in devices} == {(0, "0-31,64-95")}
    # topo -n adds NIC rows and a NIC legend; the GPU facts are the same
    assert _parse(_text(TOPO_N), _text(SWIFT)) == devices


def test_topology_alone_or_twice_is_rejected() -> None:
    with pytest.raises(ParseError, match="a topology alone names no models"):
        _parse(_text(TOPO_M))
    with pytest.raises(ParseError, match="at most one topology"):
        _parse(_text(SWIFT), _text(TOPO_M), _text(TOPO_N))


def test_topology_of_another_node_is_rejected() -> None:
    with pytest.raises(ParseError, match="captures of different nodes"):
        _parse(_text(BLOG), _text(TOPO_M))


def test_unavailable_gpu_is_kept_unhealthy() -> None:
    # derived: GPU 3's GPU-State `Available` replaced by `Unavailable`
    text = _text(ERNIE)
    row = "| 29C         54W / 450W             | 858/65536 MiB       | Available            |"
    assert text.count(row) == 1
    device = _parse(text.replace(row, row.replace("Available  ", "Unavailable")))[3]
    assert (device.index, device.health, device.memory_mib) == (3, Health.UNHEALTHY, 65536)
    assert "Unavailable" in (device.health_reason or "") and "--show-unavailable-reason" in (
        device.health_reason or ""
    )


def test_unknown_maca_version_is_no_runtime_version() -> None:
    # derived: `MACA Version: unknown`, as mx-smi prints in a container without the SDK
    text = _text(ERNIE).replace("MACA Version: 2.32.0.6 ", "MACA Version: unknown  ")
    assert {d.runtime_version for d in _parse(text)} == {None}


def test_fewer_gpus_than_attached_is_a_cut_capture() -> None:
    # derived: the table cut right after GPU 6's block, the blank line and Process box dropped
    text = _text(ERNIE)
    cut = text[: text.index("| 7           MetaX C550")]
    with pytest.raises(ParseError, match="`Attached GPUs : 8` but the table lists 7"):
        _parse(cut)


def test_table_without_process_box_and_end_of_log_are_accepted() -> None:
    text = _text(ERNIE)
    assert len(_parse(text[: text.index("\n\n+---") + 2])) == 8
    assert len(_parse(text + "\nEnd of Log\n")) == 8  # the trailer mx-smi 2.1.12 prints


def test_cut_process_box_is_rejected() -> None:
    text = _text(BLOG)
    with pytest.raises(ParseError, match="`Process:` table not closed"):
        _parse(text[: text.index("|  2                    22945")])


def test_legend_cut_before_its_na_entry_is_rejected() -> None:
    text = _text(TOPO_M)
    with pytest.raises(ParseError, match="the Legend does not explain"):
        _parse(_text(SWIFT), text[: text.index("  NA   =")])


def test_other_tools_tables_are_not_mx_smi() -> None:
    text = _text(SWIFT).replace("MetaX System Management Interface Log", "NVIDIA System Management Interface")
    with pytest.raises(ParseError, match="not mx-smi output"):
        _parse(text)


def test_captured_node_flows_through_discover_render_taskprolog_and_launch(tmp_path: Path) -> None:
    """The whole path with nothing MetaX-specific outside vendors/metax.py and the catalog rows."""
    from click.testing import CliRunner

    from slurm_hetero.cli import cli
    from slurm_hetero.engine import comm
    from slurm_hetero.vendors import vendor_traits

    runner = CliRunner()
    args = ["discover", "--vendor", "metax", "--node", "mx1", "--from-file", str(HERE / SWIFT)]
    found = runner.invoke(cli, [*args, "--from-file", str(HERE / TOPO_M)])
    assert found.exit_code == 0, found.output
    inventory = tmp_path / "mx.yaml"
    inventory.write_text(found.stdout)
    rendered = runner.invoke(cli, ["gres", "render", "--inventory", str(inventory), "--out", str(tmp_path)])
    assert rendered.exit_code == 0, rendered.output
    gres = (tmp_path / "gres.conf").read_text()
    assert "NodeName=mx1 Name=gpu Type=c500 File=/dev/dri/card0" in gres
    features = (tmp_path / "slurm-nodes.conf").read_text()
    assert "Features=metax,c500,gpumem64g,metaxlink" in features and ",maca" in features
    env = {"SLURMD_NODENAME": "mx1", "SLURM_STEP_GPUS": "2,3"}
    prolog = runner.invoke(cli, ["task-prolog", "--inventory", str(inventory)], env=env)
    assert (prolog.exit_code, prolog.stdout) == (0, "export MACA_VISIBLE_DEVICES=2,3\n")
    traits = vendor_traits()["metax"]
    chosen = comm.choose([comm.Member(traits, _c500(), "mx1")], {})
    assert (chosen.backend, chosen.env_prefix) == ("nccl", "MCCL")


def _c500() -> DeviceSpec:
    from slurm_hetero.inventory.catalog import load_catalog

    spec = load_catalog().by_type("c500")
    assert spec is not None
    return spec
