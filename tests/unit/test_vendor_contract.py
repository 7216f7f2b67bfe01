"""Every vendor parser against every real capture of its tools (R9).

A case is `tests/fixtures/<vendor>/<name>.expected.yaml`:
    captures: [file, ...]      # real captures parsed together (a device table plus its topology, ...)
    devices: [...]             # the normalized records (regenerate with `pytest --update-golden`)
  or
    error: "text"              # the parse must fail with a ParseError containing this text
    truncation_exempt: {file: reason}   # optional: a cut that no parser could notice
    truncation_exempt_at_line_ends: {file: reason}   # optional: only cuts at a line's end may
                                                     # give fewer devices (formats with no footer)
Each capture must be covered by at least one case. A capture cut anywhere (at many line ends and
inside lines) must raise ParseError or still give the full device list, never fewer devices and
never another exception; garbage must raise ParseError.
"""

from __future__ import annotations

import fnmatch
import glob
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurm_hetero.core import proc
from slurm_hetero.core.errors import ParseError, ToolError
from slurm_hetero.core.model import Capture
from slurm_hetero.inventory.document import device_to_dict, inventory_from_dict
from slurm_hetero.vendors import all_vendors, get_vendor
from slurm_hetero.vendors.base import Vendor
from tests.conftest import FIXTURES, fake_tool_run

MAX_CUTS = 160  # per capture: line ends and mid-line points, spread evenly over the file


def cut_points(text: str) -> list[tuple[int, bool]]:
    """(offset, at a line end) pairs to cut `text` at: after each line and in its middle."""
    points: list[tuple[int, bool]] = []
    offset = 0
    for line in text.splitlines(keepends=True)[:-1]:
        if len(line.strip()) > 1:
            points.append((offset + len(line) // 2, False))
        offset += len(line)
        points.append((offset, True))
    step = max(1, len(points) // MAX_CUTS)
    return points[::step]


GARBAGE = [
    "",
    "lorem ipsum dolor sit amet\nconsectetur adipiscing elit\n",
    "\x00\x01\x02binary\xff\xfe garbage\n" * 3,
    "+----+\n| a |\n+----+\n",
]


def _cases() -> list[tuple[str, Path]]:
    return sorted((p.parent.name, p) for p in FIXTURES.glob("*/*.expected.yaml"))


def _captures_of(vendor_dir: Path) -> list[Path]:
    return sorted(
        p
        for p in vendor_dir.iterdir()
        if p.is_file() and not p.name.endswith((".source", ".expected.yaml")) and p.name != "README.md"
    )


def _load_case(path: Path) -> dict[str, Any]:
    case = yaml.safe_load(path.read_text())
    assert isinstance(case, dict) and case.get("captures"), f"{path}: needs a captures list"
    return case


def _read(path: Path) -> Capture:
    return Capture(str(path), path.read_text(encoding="utf-8", errors="replace"))


CASES = _cases()
IDS = [f"{v}/{p.name.removesuffix('.expected.yaml')}" for v, p in CASES]
VENDOR_DIRS = sorted(p for p in FIXTURES.iterdir() if p.is_dir() and any(p.glob("*.expected.yaml")))


def test_every_vendor_has_cases() -> None:
    with_cases = {p.name for p in VENDOR_DIRS}
    missing = [v.name for v in all_vendors() if v.name not in with_cases]
    assert not missing, f"vendors without fixture cases: {missing}"


@pytest.mark.parametrize("vendor_dir", VENDOR_DIRS, ids=[p.name for p in VENDOR_DIRS])
def test_every_capture_is_covered_and_sourced(vendor_dir: Path) -> None:
    covered = {c for _, p in CASES if p.parent == vendor_dir for c in _load_case(p)["captures"]}
    for capture in _captures_of(vendor_dir):
        assert capture.name in covered, f"{capture} is in no *.expected.yaml case"
        assert capture.with_name(capture.name + ".source").exists(), f"{capture} has no .source"


@pytest.mark.parametrize(("vendor_name", "case_path"), CASES, ids=IDS)
def test_parse_matches_golden(vendor_name: str, case_path: Path, update_golden: bool) -> None:
    vendor = get_vendor(vendor_name)
    case = _load_case(case_path)
    captures = [_read(case_path.parent / c) for c in case["captures"]]
    if "error" in case:
        with pytest.raises(ParseError) as excinfo:
            vendor.parse(captures)
        assert case["error"] in str(excinfo.value)
        assert "\n" not in str(excinfo.value)
        return
    devices = [device_to_dict(d) for d in vendor.parse(captures)]
    assert devices, "a device capture must yield devices"
    if update_golden:
        case["devices"] = devices
        case_path.write_text(yaml.safe_dump(case, sort_keys=False))
    assert devices == case["devices"]
    # the whole validation every command shares, not the schema alone: one record per index and
    # file, links to devices of the node that link back (every real topology capture is symmetric)
    inventory_from_dict({"version": 1, "nodes": [{"name": "n1", "devices": devices}]}, str(case_path))
    assert [d["index"] for d in devices] == sorted({d["index"] for d in devices})


def _identity(devices: list[Any]) -> list[tuple[int, str]]:
    return [(d.index, d.model) for d in devices]


@pytest.mark.parametrize(("vendor_name", "case_path"), CASES, ids=IDS)
def test_truncated_captures_raise_parse_error_or_give_every_device(vendor_name: str, case_path: Path) -> None:
    vendor = get_vendor(vendor_name)
    case = _load_case(case_path)
    if "error" in case:
        pytest.skip("error case")
    exempt = case.get("truncation_exempt") or {}
    line_ends_exempt = case.get("truncation_exempt_at_line_ends") or {}
    full_captures = [_read(case_path.parent / c) for c in case["captures"]]
    full = _identity(vendor.parse(full_captures))
    for i, name in enumerate(case["captures"]):
        if name in exempt:
            continue
        text = full_captures[i].text
        for offset, at_line_end in cut_points(text):
            captures = list(full_captures)
            captures[i] = Capture(full_captures[i].source, text[:offset])
            try:
                got = _identity(vendor.parse(captures))
            except ParseError as e:
                assert "\n" not in str(e), f"{name} cut at {offset}"
                continue
            if at_line_end and name in line_ends_exempt:
                assert got == full[: len(got)], f"{name} cut at {offset}: wrong devices"
                continue
            assert got == full, f"{name} cut at byte {offset} parsed to {len(got)} of {len(full)} devices"


@pytest.mark.parametrize(("vendor_name", "case_path"), CASES, ids=IDS)
def test_garbage_raises_parse_error(vendor_name: str, case_path: Path) -> None:
    vendor = get_vendor(vendor_name)
    _load_case(case_path)  # the case file must at least be valid
    for garbage in GARBAGE:
        with pytest.raises(ParseError):
            vendor.parse([Capture("garbage.txt", garbage)])


@pytest.mark.parametrize("vendor", all_vendors(), ids=lambda v: v.name)
def test_commands_are_argv_lists(vendor: Any) -> None:
    commands = vendor.commands()
    assert isinstance(commands, list)
    for argv in commands:
        assert isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)


# Vendors whose live discovery is their one tool, bare: (tool, a capture of it, visible-devices variable)
ONE_TOOL = {
    "cambricon": ("cnmon", "cnmon_2x-mlu370-x8_v5.10.13_paddle-docs.txt", "MLU_VISIBLE_DEVICES"),
    "enflame": ("efsmi", "efsmi_2x-enflame-s60_paddle-docs.txt", "TOPS_VISIBLE_DEVICES"),
    "iluvatar": ("ixsmi", "ixsmi_2x-bi-v150_drv4.3.0_paddle-docs.txt", None),  # CoreX reads Slurm's CUDA_
    "kunlunxin": ("xpu_smi", "xpu_smi_2x-kunlunxin-r300_paddle-docs.txt", "XPU_VISIBLE_DEVICES"),
    "mthreads": (
        "mthreads-gmi",
        "mthreads-gmi_mtt-s4000_drv1.2.0_wrong-mem-total_faq.txt",
        "MUSA_VISIBLE_DEVICES",
    ),
}


@pytest.mark.parametrize("name", sorted(ONE_TOOL))
def test_probe_runs_the_one_tool_and_parses_as_from_file(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    vendor = get_vendor(name)
    tool, capture, env = ONE_TOOL[name]
    assert vendor.commands() == [[tool]]
    assert vendor.traits.visible_devices_env == env
    text = (FIXTURES / name / capture).read_text(encoding="utf-8")
    monkeypatch.setattr(proc, "run", fake_tool_run({(tool,): text}))
    assert vendor.probe() == vendor.parse([Capture(capture, text)])
    monkeypatch.setattr(proc, "run", fake_tool_run({(tool,): ToolError([tool], 1, "no device found")}))
    with pytest.raises(ToolError):
        vendor.probe()


def test_other_vendors_captures_are_rejected() -> None:
    """A capture of vendor A handed to vendor B is a ParseError, not silently wrong devices."""
    for vendor_name, case_path in CASES:
        case = _load_case(case_path)
        if "error" in case:
            continue
        first = _read(case_path.parent / case["captures"][0])
        for other in all_vendors():
            if other.name == vendor_name or other.name in _SHARED_FORMATS.get(vendor_name, ()):
                continue
            with pytest.raises(ParseError):
                other.parse([first])


# Vendors whose tools legitimately share an output format (Hygon's DTK ships rocm-smi).
_SHARED_FORMATS = {"amd": ("hygon",), "hygon": ("amd",)}


# -- affinity: a tool on PATH or a device node the driver made ----------------------------------

# A node each vendor's driver really creates (the vendor's docs); None: only its tool shows it.
DRIVER_NODE = {
    "ascend": "/dev/davinci0",
    "cambricon": "/dev/cambricon_dev0",
    "enflame": "/dev/gcu0",
    "iluvatar": "/dev/iluvatar0",
    "intel": None,
    "kunlunxin": "/dev/xpu0",
    "metax": "/dev/mxcd",
    "mthreads": "/dev/mtgpu.0",
}


def test_every_vendor_on_the_shared_affinity_has_a_driver_node_case() -> None:
    shared = {v.name for v in all_vendors() if type(v).affinity is Vendor.affinity}
    assert shared == set(DRIVER_NODE)


@pytest.mark.parametrize("name", sorted(DRIVER_NODE))
def test_affinity_is_a_tool_on_path_or_the_drivers_device_node(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    vendor = get_vendor(name)
    node = DRIVER_NODE[name]
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    monkeypatch.setattr(glob, "glob", lambda pattern: [])
    assert vendor.affinity() == 0
    if node is not None:
        monkeypatch.setattr(glob, "glob", lambda pattern: [node] if fnmatch.fnmatch(node, pattern) else [])
        assert vendor.affinity() == 1
        monkeypatch.setattr(glob, "glob", lambda pattern: [])
    for tool in vendor.tools:
        monkeypatch.setattr(shutil, "which", lambda t, tool=tool: f"/usr/bin/{tool}" if t == tool else None)
        assert vendor.affinity() == 1


@pytest.mark.parametrize("text", ["8A:00.0", "00:8A:00.0", "10000:8a:00.0", "0000:8a:00.8"])
def test_table_tools_bus_ids_carry_a_full_domain(text: str) -> None:
    """The box-table tools (cnmon, hl-smi, ixsmi, mx-smi, npu-smi, ...) print a 4-8 digit domain;
    anything shorter is a damaged capture, not an address to guess."""
    from slurm_hetero.vendors._table import sysfs_bus_id

    assert sysfs_bus_id(text) is None and sysfs_bus_id("00000000:8A:00.0") == "0000:8a:00.0"
