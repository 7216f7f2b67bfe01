"""Hygon vendor: the DTK default table, hy-smi product/memory output, refusals, live discovery.

No public hy-smi capture with a traceable source was found, so apart from the DTK rocm-smi table in
tests/fixtures/hygon/ the texts here are constructed in the layout hy-smi users' scripts parse
(`DCU[0] : Card Series: K100_AI`, `vram Total Memory (MiB): 65520`, HCU in newer releases).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slurm_hetero.core import proc
from slurm_hetero.core.errors import ParseError
from slurm_hetero.core.model import Capture
from slurm_hetero.vendors import get_vendor, hygon
from tests.conftest import FIXTURES

TABLE = FIXTURES / "hygon" / "hygon-dcu_rocm-smi-dtk_4x-dcu_paddle-docs.txt"


def vendor() -> Any:
    return get_vendor("hygon")


def table() -> Capture:
    return Capture(str(TABLE), TABLE.read_text(encoding="utf-8"))


def hy_smi(prefix: str = "DCU", count: int = 4, unit: str = "MiB", total: int = 65520) -> str:
    """Constructed `hy-smi --showproductname --showmeminfo vram --showbus --showdriverversion`."""
    lines = ["============================ System Management Interface ============================="]
    lines.append("==================================== Product Info ====================================")
    lines += [f"{prefix}[{i}]\t\t: Card Series: \t\tK100_AI" for i in range(count)]
    lines.append(f"================================ Memory Usage ({unit}) =================================")
    for i in range(count):
        lines.append(f"{prefix}[{i}]\t\t: vram Total Memory ({unit}): {total}")
        lines.append(f"{prefix}[{i}]\t\t: vram Total Used Memory ({unit}): 2")
    lines.append("===================================== PCI Bus ID =====================================")
    lines += [f"{prefix}[{i}]\t\t: PCI Bus: 0000:{0x3D + i:02X}:00.0" for i in range(count)]
    lines.append("============================ Version of System Component ============================")
    lines.append("Driver version: 6.3.13-V1.12.0a")
    lines.append("=================================== End of SMI Log ===================================")
    return "\n".join(lines) + "\n"


def test_table_alone_names_both_tools() -> None:
    with pytest.raises(ParseError) as excinfo:
        vendor().parse([table()])
    message = str(excinfo.value)
    assert "no model or memory size for DCU 0 in hy-smi/rocm-smi default table" in message
    assert (
        "`hy-smi --showproductname --showmeminfo vram` (or the DTK's rocm-smi with the same options)"
        in message
    )
    assert f"{TABLE}:4:" in message and "\n" not in message


def test_table_with_product_and_memory() -> None:
    devices = vendor().parse([table(), Capture("hy-smi.txt", hy_smi())])
    assert [d.index for d in devices] == [0, 1, 2, 3]
    assert {(d.vendor, d.model, d.memory_mib, d.driver_version) for d in devices} == {
        ("hygon", "K100_AI", 65520, "6.3.13-V1.12.0a")
    }
    assert [d.file for d in devices] == [f"/dev/dri/renderD{128 + i}" for i in range(4)]
    assert devices[1].pci_bus_id == "0000:3e:00.0"


@pytest.mark.parametrize(
    ("prefix", "unit", "total", "mib"), [("HCU", "MiB", 65520, 65520), ("DCU", "B", 68702699520, 65520)]
)
def test_hcu_prefix_and_byte_units(prefix: str, unit: str, total: int, mib: int) -> None:
    devices = vendor().parse([Capture("hy-smi.txt", hy_smi(prefix, 2, unit, total))])
    assert [(d.index, d.memory_mib) for d in devices] == [(0, mib), (1, mib)]


@pytest.mark.parametrize(
    "header",
    [
        "DCU  Temp   AvgPwr   SCLK    MCLK  Fan   Perf    PwrCap  VRAM%  DCU%",
        "HCU  Temp  AvgPwr  Perf  PwrCap  VRAM%  HCU%  Mode",
    ],
)
def test_table_variants(header: str) -> None:
    rule = "=" * 80
    rows = [f"{i}    44.0c  20.0W   1250Mhz 800Mhz 0.0%  manual  450.0W    0%   0%" for i in range(2)]
    text = "\n".join(
        ["=== System Management Interface ===", rule, header, *rows, rule, "=== End of SMI Log ==="]
    )
    devices = vendor().parse(
        [Capture("table.txt", text), Capture("hy-smi.txt", hy_smi(count=2))]
    )  # constructed
    assert [d.index for d in devices] == [0, 1]


def test_json_layout() -> None:
    data = {f"card{i}": {"Card Series": "Z100L", "vram Total Memory (MiB)": "32752"} for i in range(2)}
    devices = vendor().parse([Capture("hy.json", json.dumps(data))])
    assert [(d.model, d.memory_mib) for d in devices] == [("Z100L", 32752)] * 2


def test_table_of_other_dcu_count_is_refused() -> None:
    with pytest.raises(ParseError, match=r"lists DCUs \[0, 1, 2, 3, 4, 5, 6, 7\] but"):
        vendor().parse([table(), Capture("hy-smi.txt", hy_smi(count=8))])


@pytest.mark.parametrize("cut", [0.4, 0.6, 0.8])
def test_truncated_hy_smi_output_raises(cut: float) -> None:
    text = hy_smi()
    with pytest.raises(ParseError):
        vendor().parse([table(), Capture("hy-smi.txt", text[: int(len(text) * cut)])])


@pytest.mark.parametrize(
    "name",
    [
        "rocm-smi-concise_8gpu-mi300-series_partitions.txt",
        "amd-smi-static_4x-mi300a-apu_with-cpu-sections.txt",
        "rocm-smi_json_mi100_rocm6.0.2.json",
        "amd-smi-topology_8gpu-mi300-series_xgmi_bdf-tables.txt",
    ],
)
def test_amd_captures_are_refused(name: str) -> None:
    path = FIXTURES / "amd" / name
    with pytest.raises(ParseError, match="use --vendor amd"):
        vendor().parse([Capture(str(path), path.read_text())])


def test_commands_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        hygon.shutil, "which", lambda tool: "/opt/hyhal/bin/hy-smi" if tool == "hy-smi" else None
    )
    assert vendor().commands() == [["hy-smi", *hygon.HY_SMI_OPTIONS]]
    monkeypatch.setattr(hygon.shutil, "which", lambda tool: None)
    assert vendor().commands() == [["rocm-smi", *hygon.HY_SMI_OPTIONS]]
    assert vendor().traits.visible_devices_env == "ROCR_VISIBLE_DEVICES"  # the DTK is ROCm: HIP inside ROCR
    assert vendor().traits.relative_visible_envs == (
        "HIP_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
    )


def test_probe_runs_hy_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(hygon.shutil, "which", lambda tool: f"/opt/hyhal/bin/{tool}")
    (tmp_path / "0000:3d:00.0").mkdir()
    (tmp_path / "0000:3d:00.0" / "local_cpulist").write_text("0-31\n")
    monkeypatch.setattr(hygon.HygonVendor, "pci_root", tmp_path)

    def run(argv: list[str], timeout: float = 60.0) -> str:
        assert argv == ["hy-smi", *hygon.HY_SMI_OPTIONS]
        return hy_smi()

    monkeypatch.setattr(proc, "run", run)
    devices = vendor().probe()
    assert [d.cores for d in devices] == ["0-31", None, None, None]


def test_affinity(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for bdf, vendor_id, pci_class in (
        ("0000:3d:00.0", "0x1d94", "0x038000"),
        ("0000:00:00.0", "0x1d94", "0x060000"),
    ):
        (tmp_path / "h" / bdf).mkdir(parents=True)
        (tmp_path / "h" / bdf / "vendor").write_text(vendor_id)
        (tmp_path / "h" / bdf / "class").write_text(pci_class)
    (tmp_path / "a" / "0000:83:00.0").mkdir(parents=True)
    (tmp_path / "a" / "0000:83:00.0" / "vendor").write_text("0x1002")
    (tmp_path / "a" / "0000:83:00.0" / "class").write_text("0x038000")
    monkeypatch.setattr(
        hygon.shutil, "which", lambda tool: "/usr/bin/rocm-smi" if tool == "rocm-smi" else None
    )
    monkeypatch.setattr(hygon.HygonVendor, "pci_root", tmp_path / "h")
    assert vendor().affinity() == 1
    monkeypatch.setattr(hygon.HygonVendor, "pci_root", tmp_path / "a")
    assert vendor().affinity() == 0  # ROCm's rocm-smi on an AMD node
    monkeypatch.setattr(
        hygon.shutil, "which", lambda tool: "/opt/hyhal/bin/hy-smi" if tool == "hy-smi" else None
    )
    assert vendor().affinity() == 1
    monkeypatch.setattr(hygon.shutil, "which", lambda tool: None)
    assert vendor().affinity() == 0


def discover_table(*extra: str) -> Any:
    from click.testing import CliRunner

    from slurm_hetero.cli import cli

    args = ["discover", "--vendor", "hygon", "--from-file", str(TABLE), "--node", "dcun1", *extra]
    return CliRunner().invoke(cli, args)


def test_table_alone_error_names_the_model_option() -> None:
    result = discover_table()
    assert result.exit_code == 1
    assert "--model" in result.output and "K100_AI" in result.output
    assert result.output.startswith("slurm-hetero: ") and result.output.count("\n") == 1


def test_table_alone_with_the_admins_model_takes_memory_from_the_catalog() -> None:
    import yaml

    from slurm_hetero.inventory.catalog import load_catalog

    result = discover_table("--model", "K100_AI")
    assert result.exit_code == 0, result.output
    devices = yaml.safe_load(result.stdout)["nodes"][0]["devices"]
    spec = load_catalog().by_type("k100_ai")
    assert spec is not None
    assert [d["index"] for d in devices] == [0, 1, 2, 3]
    assert {(d["model"], d["type"], d["memory_mib"]) for d in devices} == {
        ("K100_AI", "k100_ai", spec.memory_mib)
    }
    assert [d["file"] for d in devices] == [f"/dev/dri/renderD{128 + i}" for i in range(4)]


def test_the_admins_model_must_agree_with_a_capture_that_names_one(tmp_path: Path) -> None:
    capture = Capture("hy-smi.txt", hy_smi())
    with pytest.raises(ParseError, match="K100_AI in the captures, not --model Z100"):
        vendor().parse_with_model([capture, table()], "Z100")
    devices = vendor().parse_with_model([Capture("hy-smi.txt", hy_smi())], "k100_ai")
    assert {d.model for d in devices} == {"K100_AI"}


@pytest.mark.parametrize("model", ["X999", "XK100_AI", "K100_AI_FAKE", "K100_AI;rm -rf /"])  # adv33 E37
def test_a_model_the_catalog_does_not_know_is_one_line(model: str) -> None:
    """A catalog pattern inside another word (`XK100_AI`) or a name with shell characters was
    taken for K100_AI and recorded as typed."""
    result = discover_table("--model", model)
    said = f"slurm-hetero: --model {model!r} names no hygon model of the catalog; give one as its tool"
    assert result.exit_code == 1 and result.output.startswith(said) and result.output.count("\n") == 1


def test_model_is_refused_where_captures_name_their_model() -> None:
    from click.testing import CliRunner

    from slurm_hetero.cli import cli

    info = FIXTURES / "ascend" / "npu-smi-info_910b2c_hbm_drv23.0.2.1.txt"
    args = ["discover", "--vendor", "ascend", "--from-file", str(info), "--node", "a1", "--model", "910B2C"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "leave --model out" in result.output
    result = CliRunner().invoke(cli, ["discover", "--from-file", str(TABLE), "--model", "K100_AI"])
    assert result.exit_code == 1 and "--model needs --vendor" in result.output
    result = CliRunner().invoke(cli, ["discover", "--vendor", "hygon", "--model", "K100_AI"])
    assert result.exit_code == 1 and "use it with --from-file" in result.output
