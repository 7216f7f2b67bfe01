"""AMD vendor: merging captures of one node, xGMI links, the amd-smi formats and live discovery.

The golden cases in tests/fixtures/amd/ run through test_vendor_contract.py; this file covers what
those cannot: captures that are error cases on their own (topology, list, version), merging across
tools by PCI address, conflicts, the amdsmi library path with a fake module and the tool path with
`proc.run` patched. Texts built here (not read from fixtures) are marked as constructed.
"""

from __future__ import annotations

import importlib.util
import itertools
import types
from enum import IntEnum
from pathlib import Path
from typing import Any

import pytest

from slurm_hetero.core import proc
from slurm_hetero.core.errors import HeteroError, ParseError
from slurm_hetero.core.model import Capture, Link
from slurm_hetero.vendors import _amd_smi, _rocm, amd, get_vendor
from tests.conftest import FIXTURES, fake_tool_run

AMD_DIR = FIXTURES / "amd"
CONCISE = "rocm-smi-concise_8gpu-mi300-series_partitions.txt"
MEMINFO = "rocm-smi-u-showmeminfo-vram_8gpu-mi300-series.txt"
SHOWTOPO = "rocm-smi-showtopo_8gpu-mi300-series_xgmi_2numa.txt"
ARCHER2 = "rocm-smi-showtopo_archer2_4x-mi210_xgmi_nps4.txt"
JSON_MI100 = "rocm-smi_json_mi100_rocm6.0.2.json"
STATIC = "amd-smi-static_4x-mi300a-apu_with-cpu-sections.txt"
TOPOLOGY = "amd-smi-topology_8gpu-mi300-series_xgmi_bdf-tables.txt"
LIST = "amd-smi-list_2gpu_kfd-node-partition.txt"
VERSION = "amd-smi-version_rocm6.1.0.txt"
MI300A_BDFS = ["0000:01:00.0", "0001:01:00.0", "0002:01:00.0", "0003:01:00.0"]


def cap(name: str) -> Capture:
    return Capture(str(AMD_DIR / name), (AMD_DIR / name).read_text(encoding="utf-8"))


def vendor() -> Any:
    return get_vendor("amd")


def smi_text(title: str, lines: list[str]) -> str:
    """Constructed rocm-smi text in the real framing (banner, section, footer)."""
    return "\n".join(
        [
            "============================ ROCm System Management Interface ============================",
            f"================================== {title} ==================================",
            *lines,
            "==========================================================================================",
            "================================== End of ROCm SMI Log ===================================",
            "",
        ]
    )


def amdsmi_topology(bdfs: list[str], cell: str = "XGMI") -> str:
    """Constructed `amd-smi topology` LINK TYPE and HOPS tables in the CHANGELOG's layout."""
    header = " " * 13 + " ".join(f"{b:<12}" for b in bdfs)
    out = []
    for name, same, other in (("HOPS", "0", "1"), ("LINK TYPE", "SELF", cell)):
        out += [f"{name} TABLE:", header.rstrip()]
        out += [f"{a} " + " ".join(f"{same if a == b else other:<12}" for b in bdfs).rstrip() for a in bdfs]
        out.append("")
    return "\n".join(out)


def amdsmi_list(bdfs: list[str]) -> str:
    """Constructed `amd-smi list` blocks in the CHANGELOG's layout."""
    blocks = [
        f"GPU: {i}\n    BDF: {b}\n    UUID: {i:02x}ff74a0-0000-1000-80ae-000000000000\n"
        f"    KFD_ID: {1000 + i}\n    NODE_ID: {i + 1}\n    PARTITION_ID: 0\n"
        for i, b in enumerate(bdfs)
    ]
    return "\n".join(blocks)


# merging ----------------------------------------------------------------------------------------
def test_mi300_node_captures_merge_in_any_order() -> None:
    names = [CONCISE, MEMINFO, SHOWTOPO]
    results = {tuple(vendor().parse([cap(n) for n in order])) for order in itertools.permutations(names)}
    assert len(results) == 1
    devices = next(iter(results))
    assert [d.index for d in devices] == list(range(8))
    assert {d.model for d in devices} == {"0x74a2"}  # only the concise table's DID names the model
    assert {d.memory_mib for d in devices} == {206141652992 // 2**20}
    assert [d.numa_node for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {d.partition_mode for d in devices} == {"SPX/NPS1"}
    assert [d.file for d in devices] == [f"/dev/dri/renderD{128 + i}" for i in range(8)]


def test_showtopo_gives_one_xgmi_link_to_every_peer() -> None:
    devices = vendor().parse([cap(CONCISE), cap(MEMINFO), cap(SHOWTOPO)])
    for d in devices:
        assert d.links == tuple(Link(peer=p, kind="xgmi") for p in range(8) if p != d.index)


def test_archer2_topology_with_product_and_memory() -> None:
    product = smi_text(
        "Product Info",
        [f"GPU[{i}]\t\t: Card series: \t\tAldebaran/MI200 [Instinct MI210]" for i in range(4)]
        + [f"GPU[{i}]\t\t: VRAM Total Memory (B): 68702699520" for i in range(4)],
    )  # constructed
    devices = vendor().parse([cap(ARCHER2), Capture("product.txt", product)])
    assert [d.numa_node for d in devices] == [0, 1, 2, 3]
    assert all(len(d.links) == 3 and {link.kind for link in d.links} == {"xgmi"} for d in devices)
    assert devices[0].model == "Aldebaran/MI200 [Instinct MI210]"
    assert devices[0].memory_mib == 65520


def test_pcie_only_topology_gives_no_links() -> None:
    devices = vendor().parse([cap(JSON_MI100)])
    assert all(d.links == () for d in devices)


def test_xgmi_beyond_one_hop_is_not_a_direct_link() -> None:
    data = (AMD_DIR / JSON_MI100).read_text()
    data = data.replace('"PCIE"', '"XGMI"')  # constructed: XGMI, but at the capture's 2 hops
    assert all(d.links == () for d in vendor().parse([Capture("x.json", data)]))
    one_hop = data.replace('devices 0 and 1": "2"', 'devices 0 and 1": "1"')
    devices = vendor().parse([Capture("x.json", one_hop)])
    assert devices[0].links == (Link(peer=1, kind="xgmi"),)
    assert devices[1].links == (Link(peer=0, kind="xgmi"),)


def test_captures_of_different_gpu_sets_are_refused() -> None:
    with pytest.raises(
        ParseError, match=r"lists GPUs \[0, 1, 2, 3\] but .* lists \[0, 1, 2, 3, 4, 5, 6, 7\]"
    ):
        vendor().parse([cap(MEMINFO), cap(ARCHER2)])


def test_conflicting_memory_is_refused_with_the_line() -> None:
    other = cap(MEMINFO).text.replace(
        "GPU[3]          : VRAM Total Memory (B): 206141652992",
        "GPU[3]          : VRAM Total Memory (B): 1073741824",
    )
    with pytest.raises(ParseError) as excinfo:
        vendor().parse([cap(CONCISE), cap(MEMINFO), Capture("other.txt", other)])
    message = str(excinfo.value)
    assert "other.txt:" in message and "GPU 3: conflicting memory mib: 196592 and 1024" in message


def test_default_table_alone_names_the_capture_to_add() -> None:
    with pytest.raises(ParseError) as excinfo:
        vendor().parse([cap(CONCISE)])
    message = str(excinfo.value)
    assert "rocm-smi --showproductname --showmeminfo vram" in message
    assert f"{CONCISE}:6:" in message  # the row of GPU 0


def test_mi300x_concise_name_rows_and_rocm_smi_a() -> None:
    concise = cap("rocm-smi-concise_4x-mi300x-oam-sriov_name-rows.txt")
    show_all = cap("rocm-smi-a_4x-mi300x-oam-sriov_drv6.7.0.txt")
    memory = smi_text(
        "Memory Usage (Bytes)", [f"GPU[{i}]\t\t: VRAM Total Memory (B): 205822885888" for i in range(4)]
    )
    devices = vendor().parse([concise, show_all, Capture("mem.txt", memory)])  # memory: constructed
    assert [d.pci_bus_id for d in devices] == ["0000:26:00.0", "0000:46:00.0", "0000:65:00.0", "0000:85:00.0"]
    assert {d.model for d in devices} == {"AMD Instinct MI300X OAM"}  # -a's name beats the 20-char cut
    assert {d.driver_version for d in devices} == {"6.7.0"}
    assert devices[0].uuid == "0x8d1457e2c20f59d2"
    assert {d.partition_mode for d in devices} == {"SPX/NPS1"}
    short = vendor().parse([concise, Capture("mem.txt", memory)])
    assert short[0].model == "AMD Instinct MI300X"


# amd-smi ---------------------------------------------------------------------------------------
def test_amdsmi_topology_parses_bdf_tables() -> None:
    parsed = _amd_smi.parse_amdsmi_topology(cap(TOPOLOGY), amd.AMD)
    bdfs = {a for a, _ in parsed.link_kind}
    assert len(bdfs) == 8 and "0000:0c:00.0" in bdfs
    assert {kind for (a, b), kind in parsed.link_kind.items() if a != b} == {"XGMI"}
    assert {hops for (a, b), hops in parsed.hops.items() if a != b} == {1}


def test_amdsmi_list_parses_bdf_and_hides_redacted_uuid() -> None:
    parsed = _amd_smi.parse_amdsmi_blocks(cap(LIST), amd.AMD)
    assert {i: (f.bdf, f.uuid) for i, f in parsed.gpus.items()} == {
        0: ("0000:23:00.0", None),
        1: ("0000:26:00.0", None),
    }


def test_amdsmi_static_topology_list_version_merge_by_pci_address() -> None:
    captures = [
        cap(STATIC),
        Capture("topology.txt", amdsmi_topology(MI300A_BDFS)),  # constructed for the MI300A BDFs
        Capture("list.txt", amdsmi_list(MI300A_BDFS)),  # constructed
        cap(VERSION),
    ]
    devices = vendor().parse(captures)
    assert [d.model for d in devices] == ["MI300A"] * 4
    assert [d.uuid for d in devices] == [f"{i:02x}ff74a0-0000-1000-80ae-000000000000" for i in range(4)]
    assert {d.runtime_version for d in devices} == {"6.1.0"}
    assert devices[2].links == (Link(0, "xgmi"), Link(1, "xgmi"), Link(3, "xgmi"))


def test_amdsmi_topology_of_unknown_gpus_is_refused() -> None:
    with pytest.raises(ParseError, match="names GPU 0000:0c:00.0, which no other capture maps"):
        vendor().parse([cap(STATIC), cap(TOPOLOGY)])


def test_pcie_amdsmi_topology_gives_no_links() -> None:
    devices = vendor().parse([cap(STATIC), Capture("t.txt", amdsmi_topology(MI300A_BDFS, "PCIE"))])
    assert all(d.links == () for d in devices)


@pytest.mark.parametrize("name", [TOPOLOGY, LIST])
@pytest.mark.parametrize("cut", [0.6, 0.8])
def test_truncated_amdsmi_captures_raise(name: str, cut: float) -> None:
    # (the list cut at 40% ends exactly after GPU 0's NODE_ID line: a one-GPU list no parser can doubt)
    text = cap(name).text
    capture = Capture(name, text[: int(len(text) * cut)])
    with pytest.raises(ParseError):
        _rocm.PARSERS[_rocm.detect(capture, amd.AMD)](capture, amd.AMD)


def test_static_block_missing_sections_is_truncation() -> None:
    text = cap(STATIC).text
    cut = text[: text.index("    VRAM:", text.index("GPU: 3"))]
    with pytest.raises(ParseError, match=r"GPU 3 block differs from GPU 0 \(missing: CACHE_INFO, VRAM\)"):
        vendor().parse([Capture("static.txt", cut)])


def test_static_cut_inside_a_section_of_the_only_block_is_truncation() -> None:
    """Issue 26 repro 7: a cut inside GPU 0's CACHE_INFO (after the section's name, or into the
    indent of its next entry) parsed to 1 of 4 devices: no later block to compare GPU 0 with."""
    text = cap(STATIC).text
    section = text.index("    CACHE_INFO:\n", text.index("GPU: 0")) + len("    CACHE_INFO:\n")
    entry = text.index("        CACHE_1:\n", section)
    for cut in (text[:section], text[: section + 8], text[: entry + 8]):
        with pytest.raises(ParseError, match="truncated"):
            vendor().parse([Capture("static.txt", cut)])


# robustness ------------------------------------------------------------------------------------
ALL_CAPTURES = sorted(p.name for p in AMD_DIR.iterdir() if not p.name.endswith((".source", ".yaml")))


@pytest.mark.parametrize("name", ALL_CAPTURES)
def test_damaged_captures_give_parse_errors_only(name: str) -> None:
    """Every single-line deletion and 50 cut points: devices or ParseError, never another exception."""
    text = cap(name).text
    lines = text.splitlines(keepends=True)
    variants = ["".join(lines[:i] + lines[i + 1 :]) for i in range(len(lines))]
    variants += [text[: len(text) * k // 50] for k in range(50)]
    for variant in variants:
        try:
            vendor().parse([Capture(name, variant)])
        except ParseError as e:
            assert "\n" not in str(e)


def test_hygon_table_and_card_vendor_are_refused() -> None:
    table = FIXTURES / "hygon" / "hygon-dcu_rocm-smi-dtk_4x-dcu_paddle-docs.txt"
    with pytest.raises(ParseError, match="use --vendor hygon"):
        vendor().parse([Capture(str(table), table.read_text())])
    text = smi_text("Product Info", ["GPU[0]\t\t: Card vendor: \t\tChengdu Haiguang IC Design Co., Ltd."])
    with pytest.raises(ParseError, match="use --vendor hygon"):
        vendor().parse([Capture("p.txt", text)])


# live: amdsmi library ----------------------------------------------------------------------------
class LinkType(IntEnum):  # newer amdsmi numbering
    AMDSMI_LINK_TYPE_INTERNAL = 0
    AMDSMI_LINK_TYPE_XGMI = 1
    AMDSMI_LINK_TYPE_PCIE = 2


class IoLinkType(IntEnum):  # older amdsmi numbering
    UNDEFINED = 0
    PCIEXPRESS = 1
    XGMI = 2


def fake_amdsmi(new: bool = True) -> Any:
    """A stand-in for the amdsmi module: three GPUs, 0 and 1 joined by XGMI, 2 on PCIe only."""
    handles = ["h0", "h1", "h2"]
    xgmi, pcie = (LinkType.AMDSMI_LINK_TYPE_XGMI, 2) if new else (IoLinkType.XGMI, IoLinkType.PCIEXPRESS)
    calls: list[str] = []

    def link(a: str, b: str) -> dict[str, Any]:
        joined = {a, b} == {"h0", "h1"}
        return {"hops": 1 if joined else 2, "type": xgmi if joined else pcie}

    def unsupported(handle: str) -> str:
        raise RuntimeError("AMDSMI_STATUS_NOT_SUPPORTED")

    module = types.SimpleNamespace(
        calls=calls,
        amdsmi_init=lambda: calls.append("init"),
        amdsmi_shut_down=lambda: calls.append("shut_down"),
        amdsmi_get_processor_handles=lambda: handles,
        amdsmi_get_gpu_asic_info=lambda h: {"market_name": "AMD Instinct MI300X", "device_id": 0x74A1},
        amdsmi_get_gpu_vram_info=lambda h: {"vram_size": 196592} if new else {"vram_size_mb": 196592},
        amdsmi_get_gpu_device_bdf=lambda h: f"0000:{0x11 * (handles.index(h) + 1):02X}:00.0",
        amdsmi_get_gpu_device_uuid=lambda h: f"uuid-{h}",
        amdsmi_topo_get_numa_node_number=lambda h: handles.index(h) // 2,
        amdsmi_get_gpu_topo_numa_affinity=lambda h: -1 if h == "h2" else handles.index(h) // 2,
        amdsmi_get_gpu_driver_info=lambda h: {"driver_name": "amdgpu", "driver_version": "6.10.5"},
        amdsmi_get_gpu_compute_partition=lambda h: "SPX",
        amdsmi_get_gpu_memory_partition=unsupported if not new else (lambda h: "NPS1"),
        amdsmi_topo_get_link_type=link,
    )
    if new:
        module.AmdSmiLinkType = LinkType
        module.amdsmi_get_gpu_enumeration_info = lambda h: {"drm_render": 128 + 8 * handles.index(h)}
    else:
        module.AmdSmiIoLinkType = IoLinkType
    return module


def test_amdsmi_library_devices() -> None:
    module = fake_amdsmi()
    devices = amd.devices_from_amdsmi(module)
    assert module.calls == ["init", "shut_down"]
    assert [d.file for d in devices] == ["/dev/dri/renderD128", "/dev/dri/renderD136", "/dev/dri/renderD144"]
    assert [d.pci_bus_id for d in devices] == ["0000:11:00.0", "0000:22:00.0", "0000:33:00.0"]
    assert [d.numa_node for d in devices] == [0, 0, 1]  # h2: affinity -1, so the KFD node
    assert devices[0].links == (Link(1, "xgmi"),) and devices[2].links == ()
    assert {(d.model, d.memory_mib, d.partition_mode, d.driver_version) for d in devices} == {
        ("AMD Instinct MI300X", 196592, "SPX/NPS1", "6.10.5")
    }


def test_amdsmi_library_older_release() -> None:
    devices = amd.devices_from_amdsmi(fake_amdsmi(new=False))
    assert [d.file for d in devices] == ["/dev/dri/renderD128", "/dev/dri/renderD129", "/dev/dri/renderD130"]
    assert devices[1].links == (Link(0, "xgmi"),)
    assert (
        devices[0].memory_mib == 196592 and devices[0].partition_mode == "SPX"
    )  # memory partition unsupported


def test_amdsmi_library_failures() -> None:
    module = fake_amdsmi()

    def broken() -> None:
        raise RuntimeError("AMDSMI_STATUS_DRIVER_NOT_LOADED")

    module.amdsmi_init = broken
    with pytest.raises(HeteroError, match=r"amdsmi.amdsmi_init\(\) failed: AMDSMI_STATUS_DRIVER_NOT_LOADED"):
        amd.devices_from_amdsmi(module)
    module = fake_amdsmi()
    module.amdsmi_get_gpu_vram_info = lambda h: {"vram_size": "N/A"}
    with pytest.raises(HeteroError, match="amdsmi reports no memory size for GPU 0"):
        amd.devices_from_amdsmi(module)
    assert module.calls == ["init", "shut_down"]


def sysfs(tmp_path: Path, devices: dict[str, tuple[str, str, str | None]]) -> Path:
    """A fake /sys/bus/pci/devices: {bdf: (vendor, class, local_cpulist)}."""
    for bdf, (vendor_id, pci_class, cpus) in devices.items():
        entry = tmp_path / bdf
        entry.mkdir(parents=True)
        (entry / "vendor").write_text(vendor_id + "\n")
        (entry / "class").write_text(pci_class + "\n")
        if cpus:
            (entry / "local_cpulist").write_text(cpus + "\n")
    return tmp_path


def test_probe_prefers_the_library_and_reads_local_cpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = sysfs(tmp_path, {"0000:11:00.0": ("0x1002", "0x120000", "0-23,48-71")})
    monkeypatch.setattr(amd.AmdVendor, "pci_root", root)
    monkeypatch.setattr(amd, "load_amdsmi", fake_amdsmi)
    monkeypatch.setattr(proc, "run", lambda argv, timeout=60.0: pytest.fail(f"ran {argv}"))
    devices = vendor().probe()
    assert [d.cores for d in devices] == ["0-23,48-71", None, None]


def test_probe_without_library_runs_rocm_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(amd, "load_amdsmi", lambda: None)
    monkeypatch.setattr(amd.shutil, "which", lambda tool: None)
    monkeypatch.setattr(
        amd.AmdVendor, "pci_root", sysfs(tmp_path, {"0000:83:00.0": ("0x1002", "0x038000", "24-47")})
    )
    monkeypatch.setattr(proc, "run", fake_tool_run({tuple(amd.ROCM_SMI_ARGV): cap(JSON_MI100).text}))
    devices = vendor().probe()
    assert [d.model for d in devices] == ["Arcturus GL-XL [Instinct MI100]"] * 4
    assert [d.cores for d in devices] == ["24-47", None, None, None]


def test_probe_without_library_runs_amd_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(amd, "load_amdsmi", lambda: None)
    monkeypatch.setattr(amd.shutil, "which", lambda tool: f"/opt/rocm/bin/{tool}")
    monkeypatch.setattr(amd.AmdVendor, "pci_root", tmp_path)
    outputs: dict[tuple[str, ...], str] = {
        ("amd-smi", "static"): cap(STATIC).text,
        ("amd-smi", "topology"): amdsmi_topology(MI300A_BDFS),  # constructed
        ("amd-smi", "list"): amdsmi_list(MI300A_BDFS),  # constructed
        ("amd-smi", "version"): cap(VERSION).text,
    }
    monkeypatch.setattr(proc, "run", fake_tool_run(outputs))
    devices = vendor().probe()
    assert len(devices) == 4 and all(len(d.links) == 3 for d in devices)
    assert {d.runtime_version for d in devices} == {"6.1.0"}


def test_affinity(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(amd.shutil, "which", lambda tool: "/usr/bin/rocm-smi" if tool == "rocm-smi" else None)
    amd_node = sysfs(tmp_path / "amd", {"0000:83:00.0": ("0x1002", "0x038000", None)})
    hygon_node = sysfs(
        tmp_path / "hygon",
        {"0000:03:00.0": ("0x1d94", "0x038000", None), "0000:00:00.0": ("0x1d94", "0x060000", None)},
    )
    monkeypatch.setattr(amd.AmdVendor, "pci_root", amd_node)
    assert vendor().affinity() == 1
    monkeypatch.setattr(amd.AmdVendor, "pci_root", hygon_node)
    assert vendor().affinity() == 0  # the DTK's rocm-smi on a Hygon node
    monkeypatch.setattr(amd.AmdVendor, "pci_root", tmp_path / "missing")
    assert vendor().affinity() == 1  # no sysfs: trust the tool
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(amd.AmdVendor, "pci_root", amd_node)
    assert vendor().affinity() == 2
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(amd.shutil, "which", lambda tool: None)
    assert vendor().affinity() == 0


def test_commands_prefer_amd_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(amd.shutil, "which", lambda tool: None)
    assert vendor().commands() == [amd.ROCM_SMI_ARGV]
    monkeypatch.setattr(amd.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    assert vendor().commands()[0] == ["amd-smi", "static"]
    assert vendor().traits.visible_devices_env == "ROCR_VISIBLE_DEVICES"
    assert vendor().traits.relative_visible_envs == (
        "HIP_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
    )


@pytest.mark.parametrize("damaged", ["        VENDOR_ID 0x1002", "            VENDOR_ID: 0x1002"])
def test_amdsmi_static_refuses_a_damaged_line_where_it_is(damaged: str) -> None:
    """A line without its colon, or deeper than its section, is named at its own line (nvidia-smi's
    looser reading is not amd-smi's)."""
    lines = cap(STATIC).text.split("\n")
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("VENDOR_ID"))
    lines[at] = damaged
    with pytest.raises(ParseError, match=rf"{STATIC}:{at + 1}: "):
        _amd_smi.parse_amdsmi_blocks(Capture(STATIC, "\n".join(lines)), amd.AMD)
