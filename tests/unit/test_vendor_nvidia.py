"""NVIDIA specifics the contract test cannot see: topology matrices (every real capture), topology
applied to a device listing, health fields, and the NVML path with a fake pynvml."""

from __future__ import annotations

import copy
import ctypes
import logging
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurm_hetero.core.errors import HeteroError, ParseError, ToolError
from slurm_hetero.core.model import Capture, Health, Link
from slurm_hetero.vendors import _nvidia_smi, _nvidia_topo, _nvml, get_vendor
from slurm_hetero.vendors import nvidia as nv
from tests.conftest import FIXTURES

DIR = FIXTURES / "nvidia"
A100_XML = "nvidia-smi-q-x_a100-sxm4-80gb_mig_drv535_1-of-4-gpus.xml"
H100_TEXT = "nvidia-smi-a_h100-80gb-hbm3_drv545_princeton.txt"
DGX_A100_TOPO = "topo-m_dgx-a100_8gpu-nv12_12x-mlx5_tabs.txt"
DGX1_TOPO_MP = "topo-mp_dgx1_8gpu_4x-mlx5_pcie-only.txt"


def _capture(name: str, text: str | None = None) -> Capture:
    return Capture(str(DIR / name), (DIR / name).read_text() if text is None else text)


# -- topology matrices ---------------------------------------------------------------------------
# file: (GPUs, NV# count between every two GPUs or None, cores by GPU, NUMA node by GPU, shows NVLink)
A100_CORES: list[str | None] = [
    c for c in ("48-63,176-191", "16-31,144-159", "112-127,240-255", "80-95,208-223") for _ in range(2)
]
TOPOLOGIES: dict[str, tuple[int, int | None, list[str | None], list[int | None], bool]] = {
    DGX_A100_TOPO: (8, 12, A100_CORES, [3, 3, 1, 1, 7, 7, 5, 5], True),
    "topo-m_8x-a100-sxm-40g_epyc7742_nic-legend_tabs.txt": (
        8,
        12,
        A100_CORES,
        [3, 3, 1, 1, 7, 7, 5, 5],
        True,
    ),
    "topo-m_princeton-della-pli_8x-h100_nic-legend_blank-cpu-affinity.txt": (
        8,
        18,
        [None] * 8,
        [0, 0, 0, 0, 1, 1, 1, 1],
        True,
    ),
    "topo-m_asus-esc8000a-e12_4x-rtx6000ada_2numa_nic-legend.txt": (
        4,
        None,
        ["0-31", "0-31", "32-63", "32-63"],
        [0, 0, 1, 1],
        True,
    ),
    "topo-m_puget-threadripper-wrx90_2gpu_phb_nic-legend.txt": (2, None, ["0-23", "0-23"], [0, 0], True),
    DGX1_TOPO_MP: (8, None, [*["0-19,40-59"] * 4, *["20-39,60-79"] * 4], [0, 0, 0, 0, 1, 1, 1, 1], False),
}


def test_every_topology_capture_has_expectations() -> None:
    assert sorted(p.name for p in DIR.glob("topo*.txt")) == sorted(TOPOLOGIES)


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_topology_matrix(name: str) -> None:
    count, nv_count, cores, numa, shows_nvlink = TOPOLOGIES[name]
    topo = _nvidia_topo.parse_topology(_capture(name))
    assert [g.position for g in topo.gpus] == list(range(count))  # NIC rows are not GPUs
    assert [g.cores for g in topo.gpus] == cores
    assert [g.numa_node for g in topo.gpus] == numa
    assert topo.shows_nvlink is shows_nvlink
    for gpu in topo.gpus:
        expected = [(p, nv_count) for p in range(count) if p != gpu.position] if nv_count else []
        assert list(gpu.nvlinks) == expected


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_topology_terminal_copy_with_expanded_tabs_parses_the_same(name: str) -> None:
    original = _capture(name)
    expanded = Capture(original.source, original.text.expandtabs(8))
    assert _nvidia_topo.parse_topology(expanded) == _nvidia_topo.parse_topology(original)


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
@pytest.mark.parametrize("cut", [0.2, 0.4, 0.6, 0.8])
def test_truncated_topology_raises_parse_error(name: str, cut: float) -> None:
    """A cut in the matrix or the Legend is noticed; one inside the trailing NIC Legend is not (and loses
    nothing this parser uses: one real capture's NIC Legend is itself cut short)."""
    text = _capture(name).text
    with pytest.raises(ParseError) as excinfo:
        _nvidia_topo.parse_topology(Capture(name, text[: int(len(text) * cut)]))
    assert "\n" not in str(excinfo.value)


def test_blank_cpu_affinity_distrusts_the_whole_column(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        topo = _nvidia_topo.parse_topology(
            _capture("topo-m_princeton-della-pli_8x-h100_nic-legend_blank-cpu-affinity.txt")
        )
    assert all(g.cores is None for g in topo.gpus)  # GPU4-7 printed "1": the odd CPUs, badly formatted
    assert "CPU Affinity blank for GPU0,GPU1,GPU2,GPU3" in caplog.text


def test_split_topo_fields_rebuilds_blank_fields_from_tab_stops() -> None:
    line = "GPU0\t X \tNV18\t\t0\t\tN/A"
    assert _nvidia_topo.split_topo_fields(line) == ["GPU0", "X", "NV18", "", "0", "", "N/A"]
    assert _nvidia_topo.split_topo_fields(line.expandtabs(8)) == ["GPU0", "X", "NV18", "", "0", "", "N/A"]
    header = "\tGPU0\tCPU Affinity\tNUMA Affinity".expandtabs(8)
    assert _nvidia_topo.split_topo_fields(header) == ["", "GPU0", "CPU Affinity", "NUMA Affinity"]


def test_topology_with_an_unknown_cell_names_the_line() -> None:
    text = _capture(DGX1_TOPO_MP).text.replace("GPU1\tPIX", "GPU1\tP?X", 1)
    with pytest.raises(ParseError, match=r":3: not a matrix row"):
        _nvidia_topo.parse_topology(Capture("t.txt", text))


# -- device listing + topology -------------------------------------------------------------------
def _xml_with_gpus(minors: list[int], edit: Callable[[ET.Element, int], None] | None = None) -> str:
    """The real A100 XML with its one <gpu> block repeated, one per minor number (in listing order)."""
    root = ET.fromstring(_capture(A100_XML).text)
    template = root.find("gpu")
    assert template is not None
    root.remove(template)
    for position, minor in enumerate(minors):
        gpu = copy.deepcopy(template)
        bus = f"00000000:{0x07 + position:02X}:00.0"
        gpu.set("id", bus)
        gpu.find("minor_number").text = str(minor)  # type: ignore[union-attr]
        gpu.find("pci/pci_bus_id").text = bus  # type: ignore[union-attr]
        if edit:
            edit(gpu, position)
        root.append(gpu)
    root.find("attached_gpus").text = str(len(minors))  # type: ignore[union-attr]
    return ET.tostring(root, encoding="unicode")


def test_topology_applies_by_listing_order_and_links_name_minor_numbers() -> None:
    minors = [2, 3, 0, 1, 6, 7, 4, 5]  # listing (PCI) order need not be minor order
    devices = get_vendor("nvidia").parse([Capture("q.xml", _xml_with_gpus(minors)), _capture(DGX_A100_TOPO)])
    assert [d.index for d in devices] == sorted(minors)
    by_index = {d.index: d for d in devices}
    first = by_index[2]  # listed first: the matrix's GPU0
    assert first.cores == "48-63,176-191" and first.numa_node == 3
    assert first.links == tuple(Link(p, "nvlink", 12) for p in range(8) if p != 2)
    assert by_index[6].cores == "112-127,240-255" and by_index[6].numa_node == 7  # GPU4


def test_pcie_only_matrix_keeps_nvlinks_of_a_full_matrix() -> None:
    captures = [
        Capture("q.xml", _xml_with_gpus(list(range(8)))),
        _capture(DGX_A100_TOPO),
        _capture(DGX1_TOPO_MP),
    ]
    devices = get_vendor("nvidia").parse(captures)
    assert all(len(d.links) == 7 for d in devices)


def test_topology_from_another_node_is_refused() -> None:
    with pytest.raises(
        ParseError, match="the matrix has 8 GPUs but .* lists 1; capture both on the same node"
    ):
        get_vendor("nvidia").parse([_capture(A100_XML), _capture(DGX_A100_TOPO)])


def test_topology_alone_asks_for_the_device_listing() -> None:
    with pytest.raises(
        ParseError, match=r"topology alone has no device list; also capture `nvidia-smi -q -x`"
    ):
        get_vendor("nvidia").parse([_capture(DGX1_TOPO_MP)])


def test_mig_profile_table_is_ignored_beside_a_listing() -> None:
    devices = get_vendor("nvidia").parse(
        [_capture("nvidia-smi-mig-lgip_4x-h100-sxm5.txt"), _capture(A100_XML)]
    )
    assert [d.index for d in devices] == [1]


def test_two_device_listings_are_refused() -> None:
    with pytest.raises(ParseError, match="two device listings"):
        get_vendor("nvidia").parse([_capture(A100_XML), _capture(H100_TEXT)])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "+----+\n| NVIDIA-SMI 535.54.03   Driver Version: 535.54.03   CUDA Version: 12.2 |\n",
            "no minor numbers",
        ),
        ("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-513536b6-7d19-9063-b049-1e69664bb298)\n", "nvidia-smi -L"),
        ("<?xml version='1.0'?><rocm_smi/>", "not <nvidia_smi_log>"),
        ("hello\n", "at x.txt:1: not `nvidia-smi -q -x`"),
    ],
)
def test_other_outputs_are_refused_with_a_hint(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        get_vendor("nvidia").parse([Capture("x.txt", text)])


def test_trimmed_xml_is_accepted_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        devices = get_vendor("nvidia").parse([_capture(A100_XML)])
    assert len(devices) == 1
    assert "says 4 attached GPUs but lists 1" in caplog.text


# -- health --------------------------------------------------------------------------------------
def _set(path: str, value: str) -> Callable[[ET.Element, int], None]:
    def edit(gpu: ET.Element, position: int) -> None:
        if position == 1:
            node = gpu.find(path)
            if node is None:  # the v12 A100 capture prints remapped_rows as plain N/A
                parent_path, _, leaf = path.rpartition("/")
                parent = gpu.find(parent_path)
                assert parent is not None
                parent.text = None
                node = ET.SubElement(parent, leaf)
            node.text = value

    return edit


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        ("retired_pages/pending_retirement", "Yes", "retired pages pending"),
        ("remapped_rows/remapped_row_pending", "Yes", "row remapping pending"),
        ("remapped_rows/remapped_row_failure", "Yes", "row remapping failed"),
        ("gpu_reset_status/reset_required", "Yes", "GPU reset required"),
        ("uuid", "Unknown Error", "UUID reads 'Unknown Error'"),
        ("fb_memory_usage/total", "GPU is lost", "memory total reads 'GPU is lost'"),
        ("fabric/state", "In Progress", "NVLink fabric in progress"),
    ],
)
def test_unhealthy_gpu_from_xml(path: str, value: str, reason: str) -> None:
    devices = _nvidia_smi.parse_smi_xml(Capture("q.xml", _xml_with_gpus([0, 1, 2], _set(path, value))))
    assert [d.health for d in devices] == [Health.OK, Health.UNHEALTHY, Health.OK]
    assert reason in (devices[1].health_reason or "")


def test_gpu_without_readable_minor_number_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        devices = _nvidia_smi.parse_smi_xml(
            Capture("q.xml", _xml_with_gpus([0, 1, 2], _set("minor_number", "Unknown Error")))
        )
    assert [d.index for d in devices] == [0, 2]
    assert "no readable minor number" in caplog.text


def test_malformed_field_is_a_parse_error_naming_the_gpu() -> None:
    with pytest.raises(ParseError, match=r"<gpu id='00000000:08:00.0'>: memory total '80 GB'"):
        _nvidia_smi.parse_smi_xml(
            Capture("q.xml", _xml_with_gpus([0, 1], _set("fb_memory_usage/total", "80 GB")))
        )


def test_text_listing_health_and_lost_gpu_line(caplog: pytest.LogCaptureFixture) -> None:
    text = _capture(H100_TEXT).text
    text = text.replace(
        "        Pending                           : No", "        Pending                           : Yes"
    )
    text = text.replace(
        "Attached GPUs",
        "Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error\nAttached GPUs",
    )
    with caplog.at_level(logging.WARNING):
        (device,) = _nvidia_smi.parse_smi_text(Capture("a.txt", text))
    assert device.health == Health.UNHEALTHY and device.health_reason == "row remapping pending"
    assert "GPU 0000:3B:00.0 not listed: Unknown Error" in caplog.text


def test_text_listing_without_processes_section_is_truncated() -> None:
    text = _capture(H100_TEXT).text.replace("    Processes                             : None", "")
    with pytest.raises(ParseError, match=r"a.txt:7: GPU 00000000:19:00.0 block ends before its Processes"):
        _nvidia_smi.parse_smi_text(Capture("a.txt", text))


# -- pure conversions ----------------------------------------------------------------------------
def test_cpu_lists() -> None:
    assert _nvidia_smi.cpu_list([3, 1, 2, 0, 8, 32, 33]) == "0-3,8,32-33"
    assert _nvidia_smi.normalize_cpu_list(" 48-63,176-191") == "48-63,176-191"
    assert _nvidia_smi.normalize_cpu_list("N/A") is None and _nvidia_smi.normalize_cpu_list("") is None
    for bad in ("0-", "a-3", "5-2", "0;3"):
        with pytest.raises(ValueError):
            _nvidia_smi.normalize_cpu_list(bad)
    assert _nvml.cpu_list_from_mask([0x0000FFFF0000FFFF, 0]) == "0-15,32-47"
    assert _nvml.cpu_list_from_mask([0, 1]) == "64"
    assert _nvml.cpu_list_from_mask([0, 0]) is None


def test_versions_and_ids() -> None:
    assert _nvml.cuda_version_string(12040) == "12.4" and _nvml.cuda_version_string(13020) == "13.2"
    assert _nvml.bus_key("00000000:1A:00.0") == "0000:1a:00.0"
    assert _nvml.bus_key("0000:1a:00.0") == "0000:1a:00.0"
    assert _nvidia_smi.parse_mib("81920 MiB") == 81920 and _nvidia_smi.parse_mib("N/A") is None


# -- NVML with a fake pynvml ---------------------------------------------------------------------
class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 9: "Driver Not Loaded", 15: "GPU is lost", 2: "Invalid Argument"}[
            self.value
        ]


class FakePciInfo(ctypes.Structure):
    _fields_ = [("busId", ctypes.c_char * 32)]  # a char array field: reads back as bytes, like pynvml's


class FakeMemory:
    def __init__(self, total: int) -> None:
        self.total, self.free, self.used = total, total, 0


class FakeGpu:
    def __init__(
        self,
        minor: int,
        bus: str,
        links: list[tuple[int, str]] | None = None,
        *,
        name: str = "NVIDIA H100 80GB HBM3",
        mask: tuple[int, ...] = (0xFFFF,),
        node: int = 0,
        mig: int | None = 0,
        retired: int = 0,
        lost: bool = False,
    ) -> None:
        self.minor, self.bus, self.name, self.mask, self.node = minor, bus, name, mask, node
        self.links = links  # (remote device type, remote bus id) per link; None: no NVLink at all
        self.mig, self.retired, self.lost = mig, retired, lost


class FakeNvml:
    """The slice of pynvml NvidiaVendor.probe uses, with the real names, arguments and return types."""

    NVMLError = FakeNVMLError
    NVML_NVLINK_MAX_LINKS = 18
    NVML_NVLINK_DEVICE_TYPE_GPU, NVML_NVLINK_DEVICE_TYPE_SWITCH = 0, 2
    NVML_AFFINITY_SCOPE_NODE = 0

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus, self.init_error = gpus, init_error
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if self.gpus[index].lost:
            raise FakeNVMLError(15)
        return self.gpus[index]

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return h.name

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> FakeMemory:
        return FakeMemory(80 * 2**30)

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return f"GPU-0000000{h.minor}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> FakePciInfo:
        return FakePciInfo(h.bus.encode())

    def nvmlDeviceGetMinorNumber(self, h: FakeGpu) -> int:
        return h.minor

    def nvmlDeviceGetNumaNodeId(self, h: FakeGpu) -> int:
        return 99  # the GPU's own memory node on coherent platforms: must not be used

    def nvmlDeviceGetMemoryAffinity(self, h: FakeGpu, size: int, scope: int) -> Any:
        return (ctypes.c_ulonglong * size)(1 << h.node)

    def nvmlDeviceGetCpuAffinity(self, h: FakeGpu, size: int) -> Any:
        return (ctypes.c_ulonglong * size)(*h.mask)

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> list[int]:
        if h.mig is None:
            raise FakeNVMLError(3)
        return [h.mig, h.mig]

    def _link(self, h: FakeGpu, link: int) -> tuple[int, str]:
        if h.links is None:
            raise FakeNVMLError(3)
        if link >= len(h.links):
            raise FakeNVMLError(2)
        return h.links[link]

    def nvmlDeviceGetNvLinkState(self, h: FakeGpu, link: int) -> int:
        self._link(h, link)
        return 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: FakeGpu, link: int) -> int:
        return self._link(h, link)[0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: FakeGpu, link: int) -> FakePciInfo:
        return FakePciInfo(self._link(h, link)[1].encode())

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: FakeGpu) -> int:
        return h.retired

    def nvmlDeviceGetRemappedRows(self, h: FakeGpu) -> tuple[int, int, int, int]:
        return (0, 0, 0, 0)


def _probe(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml, sysfs: Path) -> list[Any]:
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(_nvml, "SYSFS_PCI", sysfs)
    return get_vendor("nvidia").probe()


def test_probe_direct_nvlinks_affinity_and_numa(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bus = [f"00000000:{b:02X}:00.0" for b in (0x07, 0x0F, 0x47, 0x4E)]
    gpus = [
        FakeGpu(0, bus[0], [(0, bus[1])] * 4, mask=(0x0000FFFF0000FFFF,)),
        FakeGpu(1, bus[1], [(0, bus[0])] * 4, mask=(0x0000FFFF0000FFFF,), mig=1),
        FakeGpu(2, bus[2], None, mask=(0xFFFF0000FFFF0000,), node=1, retired=1),
        FakeGpu(3, bus[3], None, mask=(0, 1), node=1, mig=None),
    ]
    (tmp_path / "0000:07:00.0").mkdir()
    (tmp_path / "0000:07:00.0" / "numa_node").write_text("0\n")
    fake = FakeNvml(gpus)
    devices = _probe(monkeypatch, fake, tmp_path)
    assert [d.index for d in devices] == [0, 1, 2, 3]
    d0, d1, d2, d3 = devices
    assert (d0.model, d0.file, d0.memory_mib, d0.pci_bus_id) == (
        "NVIDIA H100 80GB HBM3",
        "/dev/nvidia0",
        81920,
        bus[0],
    )
    assert (d0.driver_version, d0.runtime_version) == ("550.54.15", "12.4")
    assert d0.links == (Link(1, "nvlink", 4),) and d1.links == (Link(0, "nvlink", 4),) and d2.links == ()
    assert d0.cores == "0-15,32-47" and d2.cores == "16-31,48-63" and d3.cores == "64"
    assert [d.numa_node for d in devices] == [0, 0, 1, 1]  # sysfs for GPU0, memory affinity for the rest
    assert d1.partition_mode == "mig" and d0.partition_mode is None and d3.partition_mode is None
    assert d2.health == Health.UNHEALTHY and d2.health_reason == "retired pages pending"
    assert fake.calls == ["shutdown"]


def test_probe_nvswitch_fabric_links_every_pair(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gpus = [FakeGpu(m, f"00000000:{0x10 + m:02X}:00.0", [(2, "00000000:C0:00.0")] * 18) for m in range(8)]
    devices = _probe(monkeypatch, FakeNvml(gpus), tmp_path)
    for device in devices:
        assert device.links == tuple(Link(p, "nvlink", 18) for p in range(8) if p != device.index)


def test_probe_skips_a_lost_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gpus = [FakeGpu(0, "00000000:07:00.0"), FakeGpu(1, "00000000:0F:00.0", lost=True)]
    with caplog.at_level(logging.WARNING):
        devices = _probe(monkeypatch, FakeNvml(gpus), tmp_path)
    assert [d.index for d in devices] == [0]
    assert "nvmlDeviceGetHandleByIndex: GPU is lost" in caplog.text


def test_probe_without_driver_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ToolError, match=r"NVML cannot start\): Driver Not Loaded.*--from-file") as e:
        _probe(monkeypatch, FakeNvml([], init_error=9), tmp_path)
    assert e.value.exit_code == 3  # a vendor tool or library that fails, as the exit code table says


def test_probe_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(HeteroError, match="pip install nvidia-ml-py"):
        get_vendor("nvidia").probe()


def test_affinity_is_cheap_and_needs_pynvml_and_driver(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    vendor = get_vendor("nvidia")
    monkeypatch.setattr(nv, "DEV", tmp_path)
    monkeypatch.setattr(nv, "PROC_DRIVER", tmp_path / "version")
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([]))
    assert vendor.affinity() == 0
    (tmp_path / "nvidia3").touch()  # a container that was given GPU 3 only
    assert vendor.affinity() == 2
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert vendor.affinity() == 0


def test_commands_are_what_admins_capture() -> None:
    assert get_vendor("nvidia").commands() == [["nvidia-smi", "-q", "-x"], ["nvidia-smi", "topo", "-m"]]


def test_a_topology_alone_with_the_admins_model_gives_the_devices() -> None:
    """`discover --vendor nvidia --model M --from-file topo.txt`: a node whose device listing was
    not captured (the DGX A100 SMT host of the real-Slurm group)."""
    vendor = get_vendor("nvidia")
    devices = vendor.parse_with_model([_capture(DGX_A100_TOPO)], "NVIDIA A100-SXM4-40GB")
    assert [(d.index, d.file, d.model) for d in devices] == [
        (k, f"/dev/nvidia{k}", "NVIDIA A100-SXM4-40GB") for k in range(8)
    ]
    assert devices[0].cores == "48-63,176-191" and devices[0].links[0] == Link(1, "nvlink", 12)
    assert devices[0].memory_mib is None  # the catalog gives it (discover.complete_device)


def test_the_model_option_with_a_device_listing_is_refused() -> None:
    xml = next(p.name for p in DIR.glob("nvidia-smi-q-x_*.xml"))
    with pytest.raises(ParseError, match="leave --model out"):
        get_vendor("nvidia").parse_with_model([_capture(xml)], "NVIDIA A100-SXM4-40GB")


def test_query_csv_without_an_index_column_takes_rows_in_index_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 26 repro 7: `--query-gpu=name,uuid,...` without `index` was refused, though nvidia-smi
    prints one row per GPU in index order; now the rows are GPUs 0, 1, ..., and a warning says so."""
    path = DIR / "nvidia-smi-query-gpu-csv_4x-a100-sxm4-80gb_drv580.txt"
    indexed = get_vendor("nvidia").parse([Capture(path.name, path.read_text())])
    unindexed = "\n".join(line.split(", ", 1)[1] for line in path.read_text().splitlines()) + "\n"
    assert unindexed.startswith("name, memory.total [MiB]")  # the index column cut off (a derived copy)
    with caplog.at_level(logging.WARNING):
        devices = get_vendor("nvidia").parse([Capture("no-index.csv", unindexed)])
    assert devices == indexed and [d.index for d in devices] == [0, 1, 2, 3]
    assert "no index or minor_number column: the rows are taken as GPUs 0, 1, ... in order" in caplog.text
    with pytest.raises(ParseError, match="needs the name column"):
        get_vendor("nvidia").parse([Capture("no-name.csv", "index, uuid\n0, GPU-1\n")])


def billion_laughs(levels: int = 9) -> str:
    entities = ['<!ENTITY l0 "lol">'] + [
        f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, levels + 1)
    ]
    return with_dtd("".join(entities), f"&l{levels};")


def with_dtd(subset: str, body: str) -> str:
    return f'<?xml version="1.0"?><!DOCTYPE nvidia_smi_log [{subset}]><nvidia_smi_log>{body}</nvidia_smi_log>'


@pytest.mark.parametrize(
    "text",
    [
        billion_laughs(),  # adv26b F2: 1 KB that peaked at 106 MB before expat's amplification limit
        with_dtd('<!ENTITY a "x">', "<gpu/>"),  # declared, never used
        with_dtd('<!ENTITY e SYSTEM "/etc/passwd">', "&e;"),
    ],
)
def test_xml_declaring_entities_is_refused_before_any_is_expanded(text: str) -> None:
    """nvidia-smi's DOCTYPE names an external DTD (never read) and declares no entity, so any
    declaration is refused as expat reads it: before the document uses one."""
    with pytest.raises(
        ParseError, match=r"declares XML entities \(<!ENTITY>\), which nvidia-smi never writes$"
    ):
        _nvidia_smi.parse_smi_xml(Capture("bomb.xml", text))


@pytest.mark.parametrize("bare", ["Driver Version", "Attached GPUs"])
def test_text_listing_header_line_without_its_value_is_refused(bare: str) -> None:
    """The header's facts are read by name: a bare line there is a damaged capture, not an empty
    section (the driver version became None, silently)."""
    lines = _capture(H100_TEXT).text.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith(bare))
    lines[at] = bare
    with pytest.raises(ParseError, match=rf"a.txt:{at + 1}: unexpected line outside a GPU block"):
        _nvidia_smi.parse_smi_text(Capture("a.txt", "\n".join(lines)))
