"""The device catalog: data file contract, model resolution, site overrides, comparison, CLI."""

from __future__ import annotations

import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.core.devicespec import DeviceSpec
from slurm_hetero.core.errors import ConfigError
from slurm_hetero.engine.compare import SCORERS, compare, headline_tflops, top_third
from slurm_hetero.inventory.catalog import load_catalog

VENDORS = {
    "nvidia",
    "amd",
    "ascend",
    "cambricon",
    "hygon",
    "iluvatar",
    "gaudi",
    "mthreads",
    "intel",
    "kunlunxin",
    "enflame",
    "metax",
}
COMPARE_ONLY_VENDORS = {"google", "aws"}
CAPABILITIES = {
    "tensor_cores",
    "fp8",
    "mig",
    "partitioning",
    "nvlink",
    "xgmi",
    "hccs",
    "mlulink",
    "xelink",
    "gpudirect_rdma",
    "peer_rdma",
    "sharing",
}
REQUIRED_KEYS = ("type", "vendor", "name", "match", "memory_gib", "source")

REQUIRED_TYPES = [
    "v100_16g",
    "v100_32g",
    "a100_40g",
    "a100_80g",
    "a800",
    "h100_pcie",
    "h100_sxm",
    "h800",
    "h20",
    "h200",
    "b200",
    "l40s",
    "l4",
    "t4",
    "rtx4090",
    "mi210",
    "mi250x",
    "mi300x",
    "mi300a",
    "mi100",
    "ascend910b1",
    "ascend910b2",
    "ascend910b3",
    "ascend910b4",
    "ascend910b2c",
    "ascend910c",
    "ascend310p",
    "ascend310b",
    "mlu370_x8",
    "mlu590",
    "k100_ai",
    "z100",
    "bi_v100",
    "bi_v150",
    "gaudi2",
    "gaudi3",
    "max1550",
    "mtt_s4000",
    "r300",
    "s60",
    "tpu_v4",
    "tpu_v5e",
    "tpu_v5p",
    "trainium",
    "trainium2",
    "inferentia2",
    "rtx6000_ada",
    "rtx4000_sff_ada",
    "a10",
    "a30",
    "a40",
    "p100",
    "mi325x",
    "mi355x",
    "gh200",
    "tpu_v6e",
    "p800",
    "ascend910",
]

# (vendor, model string as the vendor tool prints it, expected type). Strings marked "capture" are
# copied from the real captures in the shared fixtures (nvidia-smi, rocm-smi/amd-smi, npu-smi,
# cnmon, efsmi, hl-smi, mthreads-gmi, xpu_smi, mx-smi); the others are the names the tools print per docs.
RESOLUTIONS = [
    ("nvidia", "NVIDIA A100-SXM4-80GB", "a100_80g"),  # capture: nvidia-smi -q -x
    ("nvidia", "NVIDIA A100-SXM4-40GB", "a100_40g"),
    ("nvidia", "NVIDIA A100-PCIE-40GB", "a100_40g"),
    ("nvidia", "NVIDIA A100 80GB PCIe", "a100_80g"),
    ("nvidia", "NVIDIA A800-SXM4-80GB", "a800"),
    ("nvidia", "NVIDIA H100 80GB HBM3", "h100_sxm"),  # capture: nvidia-smi -a
    ("nvidia", "NVIDIA H100 PCIe", "h100_pcie"),
    ("nvidia", "NVIDIA H800", "h800"),
    ("nvidia", "NVIDIA H20", "h20"),
    ("nvidia", "NVIDIA H200", "h200"),
    ("nvidia", "NVIDIA B200", "b200"),
    ("nvidia", "NVIDIA L40S", "l40s"),
    ("nvidia", "NVIDIA L4", "l4"),
    ("nvidia", "Tesla T4", "t4"),
    ("nvidia", "Tesla V100-SXM2-32GB", "v100_32g"),
    ("nvidia", "Tesla V100-SXM2-16GB", "v100_16g"),
    ("nvidia", "NVIDIA GeForce RTX 4090", "rtx4090"),
    ("amd", "AMD Instinct MI300X", "mi300x"),
    ("amd", "MI210", "mi210"),
    ("amd", "AMD Instinct MI100", "mi100"),
    ("amd", "Arcturus GL-XL [Instinct MI100]", "mi100"),  # capture: rocm-smi --json card series
    ("amd", "MI300A", "mi300a"),  # capture: amd-smi static MARKET_NAME
    ("amd", "Aqua Vanjaram [Instinct MI300A]", "mi300a"),  # capture: amd-smi static PRODUCT_NAME
    ("amd", "AMD Instinct MI250X", "mi250x"),
    ("amd", "0x74a2", "mi308x"),  # capture: rocm-smi concise table gives only the device id (DID)
    ("amd", "0x740f", "mi210"),
    ("ascend", "910B1", "ascend910b1"),
    ("ascend", "910B2", "ascend910b2"),
    ("ascend", "910B3", "ascend910b3"),  # capture: npu-smi info 8x 910B3
    ("ascend", "910B4", "ascend910b4"),
    ("ascend", "910B4-1", "ascend910b4_1"),
    ("ascend", "910B2C", "ascend910b2c"),  # capture: npu-smi info 910B2C
    ("ascend", "Ascend910", "ascend910c"),  # capture: npu-smi info, 2 chips per NPU
    ("ascend", "310P3", "ascend310p"),  # capture: npu-smi info 2x 310P3
    ("ascend", "310B4", "ascend310b"),  # capture: npu-smi info 310B4
    ("cambricon", "MLU370-X8", "mlu370_x8"),  # capture: cnmon
    ("cambricon", "MLU370-X4", "mlu370_x4"),  # capture: cnmon v4.20.11
    ("cambricon", "MLU590", "mlu590"),
    ("hygon", "K100_AI", "k100_ai"),
    ("hygon", "K100", "k100"),
    ("hygon", "Z100", "z100"),
    ("hygon", "Z100L", "z100"),
    ("iluvatar", "Iluvatar BI-V100", "bi_v100"),  # capture: ixsmi
    ("iluvatar", "Iluvatar BI-V150", "bi_v150"),  # capture: ixsmi
    ("iluvatar", "Iluvatar BI-V150S", "bi_v150s"),  # capture: ixsmi (32 GB, not a BI-V150)
    ("gaudi", "HL-225", "gaudi2"),  # capture: hl-smi 8x Gaudi2
    ("gaudi", "HL-325L", "gaudi3"),
    ("intel", "Intel(R) Data Center GPU Max 1550", "max1550"),
    ("mthreads", "MTT S4000", "mtt_s4000"),  # capture: mthreads-gmi
    ("kunlunxin", "R300", "r300"),  # capture: xpu_smi
    ("enflame", "S60", "s60"),  # capture: efsmi
    ("metax", "MetaX C500", "c500"),  # capture: mx-smi 2.2.9
    ("metax", "MXC500", "c500"),  # capture: mx-smi 2.1.6
    ("metax", "MetaX C550", "c550"),  # capture: mx-smi 2.2.4
    ("metax", "MXC550", "c550"),  # capture: mx-smi 2.1.6
    ("nvidia", "NVIDIA RTX 4000 SFF Ada Generation", "rtx4000_sff_ada"),  # capture: nvidia-smi -q -x
    ("nvidia", "NVIDIA RTX 6000 Ada Generation", "rtx6000_ada"),  # capture: nvidia-smi topo -m legend
    ("nvidia", "NVIDIA A10", "a10"),
    ("nvidia", "NVIDIA A30", "a30"),
    ("nvidia", "NVIDIA A40", "a40"),
    ("nvidia", "Tesla P100-SXM2-16GB", "p100"),
    ("nvidia", "NVIDIA GH200 480GB", "gh200"),
    ("amd", "AMD Instinct MI325X", "mi325x"),
    ("amd", "AMD Instinct MI355X", "mi355x"),
    ("ascend", "910A", "ascend910"),  # npu-smi's name for the first Ascend 910
    ("ascend", "910ProA", "ascend910"),
    ("kunlunxin", "P800 OAM", "p800"),
]

UNRESOLVED = [
    ("nvidia", "NVIDIA A10G"),  # AWS's part, not an A10
    ("nvidia", "NVIDIA RTX A6000"),  # Ampere workstation card, not the RTX 6000 Ada
    ("nvidia", "NVIDIA H100 NVL"),  # a different SKU: never guessed as SXM
    ("amd", "NVIDIA H100 PCIe"),  # patterns are scoped by vendor
    ("intel", "Intel(R) Graphics [0x020a]"),  # capture: xpu-smi discovery, unnamed device id
    ("metax", "MetaX N260"),  # no public spec of known provenance: not in the catalog
]

SITE_FILE = """\
version: 1
models:
  - type: rtx_a6000
    vendor: nvidia
    name: NVIDIA RTX A6000
    match: ['RTX A6000']
    memory_gib: 48
  - type: a100_80g
    price_per_hour_usd: 9.99
"""


def _raw_models() -> list[dict[str, Any]]:
    text = resources.files("slurm_hetero.data").joinpath("models.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    assert data["version"] == 1
    return list(data["models"])


def _site_dir(root: Path, text: str = SITE_FILE, name: str = "site.yaml") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text, encoding="utf-8")
    return root


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, ["catalog", *args])


# --------------------------------------------------------------------------------- data contract
@pytest.mark.parametrize("raw", _raw_models(), ids=lambda r: str(r.get("type")))
def test_entry_is_complete_and_sourced(raw: dict[str, Any]) -> None:
    missing = [key for key in REQUIRED_KEYS if key not in raw]
    assert not missing, f"missing {missing}"
    assert re.fullmatch(r"https?://\S+", raw["source"]), raw["source"]
    assert re.fullmatch(r"[a-z0-9_]+", raw["type"])
    assert raw["match"], "needs at least one match pattern"
    assert set(raw.get("capabilities") or ()) <= CAPABILITIES
    if raw["vendor"] in COMPARE_ONLY_VENDORS:
        assert raw.get("compare_only") is True
    else:
        assert raw["vendor"] in VENDORS and not raw.get("compare_only")
    if raw.get("price_per_hour_usd") is not None:
        assert "price" in raw.get("notes", "").lower(), "a price needs its basis in notes"


def test_entries_without_figures_say_why() -> None:
    for raw in _raw_models():
        if raw.get("bf16_tflops") is None and raw.get("fp16_tflops") is None:
            assert raw.get("notes"), f"{raw['type']}: missing throughput must be explained in notes"


def test_types_and_aliases_are_unique() -> None:
    names = [n for raw in _raw_models() for n in (raw["type"], *(raw.get("aliases") or ()))]
    assert len(names) == len(set(names))


def test_every_required_model_is_present() -> None:
    catalog = load_catalog()
    missing = [t for t in REQUIRED_TYPES if catalog.by_type(t) is None]
    assert not missing


def test_seed_entry_keeps_its_type_and_alias() -> None:
    spec = load_catalog().by_type("a100")
    assert spec is not None and spec.type == "a100_80g"


# ---------------------------------------------------------------------------------- resolution
@pytest.mark.parametrize(("vendor", "model", "expected"), RESOLUTIONS, ids=[r[1] for r in RESOLUTIONS])
def test_reported_model_resolves_to_type(vendor: str, model: str, expected: str) -> None:
    spec = load_catalog().resolve(vendor, model)
    assert spec is not None and spec.type == expected


@pytest.mark.parametrize(("vendor", "model"), UNRESOLVED, ids=[u[1] for u in UNRESOLVED])
def test_unknown_model_is_not_guessed(vendor: str, model: str) -> None:
    assert load_catalog().resolve(vendor, model) is None


def test_real_gres_conf_type_names_are_aliases() -> None:
    catalog = load_catalog()
    for alias in ("v100", "tesla_v100-sxm2-32gb"):
        spec = catalog.by_type(alias)
        assert spec is not None and spec.type == "v100_32g"


# ----------------------------------------------------------------------------------- site files
def test_site_dir_adds_and_overrides_models(tmp_path: Path) -> None:
    catalog = load_catalog(extra_dirs=[_site_dir(tmp_path / "extra")])
    added = catalog.resolve("nvidia", "NVIDIA RTX A6000")
    assert added is not None and added.type == "rtx_a6000" and added.source.startswith("site file ")
    overridden = catalog.by_type("a100_80g")
    assert overridden is not None and overridden.price_per_hour_usd == 9.99
    assert overridden.memory_gib == 80 and overridden.fp16_tflops == 312, "unnamed facts stay bundled"
    assert catalog.by_type("a100") is overridden
    assert catalog.types().count("a100_80g") == 1
    assert catalog.by_type("h100_sxm") is not None, "bundled models stay"


def test_site_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_HETERO_MODELS_DIR", str(_site_dir(tmp_path / "env")))
    catalog = load_catalog()
    spec = catalog.by_type("a100_80g")
    assert spec is not None and spec.price_per_hour_usd == 9.99
    assert catalog.by_type("rtx_a6000") is not None


def test_site_entry_may_name_an_alias_and_override_one_fact(tmp_path: Path) -> None:
    site = "models:\n  - type: a100\n    price_per_hour_usd: 1.5\n"
    catalog = load_catalog(extra_dirs=[_site_dir(tmp_path / "alias", site)])
    spec = catalog.by_type("a100_80g")
    assert spec is not None and spec.price_per_hour_usd == 1.5 and spec.type == "a100_80g"


def test_site_new_type_needs_vendor_name_match_memory(tmp_path: Path) -> None:
    site = "models:\n  - {type: newgpu, vendor: nvidia, match: ['NewGPU']}\n"
    with pytest.raises(ConfigError) as excinfo:
        load_catalog(extra_dirs=[_site_dir(tmp_path / "new", site)])
    assert "name, memory_gib" in str(excinfo.value)


def test_estimates_carry_their_derivation() -> None:
    estimated = [raw for raw in _raw_models() if raw.get("estimate")]
    assert {"ascend910b3", "ascend910c", "rtx6000_ada"} <= {raw["type"] for raw in estimated}
    assert all(len(raw.get("derivation", "")) > 40 for raw in estimated)
    c = load_catalog().by_type("ascend910c")
    assert c is not None and c.fp16_tflops == pytest.approx(300_000 / 384 / 2, abs=0.1)


def test_family_lists_its_skus() -> None:
    result = _invoke("ascend910b")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()[1:]
    rows = [line.split()[0].rstrip("*") for line in lines if not line.startswith("*")]
    skus = ["ascend910b1", "ascend910b2", "ascend910b2c", "ascend910b3", "ascend910b4", "ascend910b4_1"]
    assert rows == skus
    assert "* ascend910b3: estimate:" in result.stdout and "ai.gitee.com" in result.stdout
    assert _invoke("nosuchfamily").exit_code == 1


@pytest.mark.parametrize(
    "text",
    [
        "version: 1\nmodels: [ {type: broken\n",  # YAML syntax error
        "version: 1\nmodels:\n  - type: x1\n    vendor: nvidia\n    match: ['X1']\n",  # missing keys
        "just a string\n",  # not a mapping
        "models:\n  - {type: x1, vendor: nvidia, name: X, match: ['('], memory_gib: 1, source: s}\n",
        "models: " + "[" * 990 + "]" * 990 + "\n",  # issue 9 re-pass: a RecursionError traceback
    ],
    ids=["yaml-syntax", "missing-keys", "not-a-mapping", "bad-regex", "nested-990"],
)
def test_malformed_site_file_names_the_file(tmp_path: Path, text: str) -> None:
    directory = _site_dir(tmp_path / "bad", text, name="broken.yaml")
    with pytest.raises(ConfigError) as excinfo:
        load_catalog(extra_dirs=[directory])
    assert str(directory / "broken.yaml") in str(excinfo.value)


# ------------------------------------------------------------------------------------- compare
def _spec(type_: str, **figures: Any) -> DeviceSpec:
    return DeviceSpec(
        type=type_,
        vendor="nvidia",
        name=type_,
        match=(type_,),
        source="https://x",
        memory_gib=figures.pop("memory_gib", 16),
        **figures,
    )


def test_top_third_ranks_missing_scores_last() -> None:
    scores = np.array([1.0, math.nan, 5.0, 3.0, 2.0, math.nan, 4.0], dtype=np.float64)
    assert top_third(scores).tolist() == [False, False, True, False, False, False, True]
    assert top_third(np.array([math.nan, math.nan])).tolist() == [False, False]
    assert top_third(np.array([], dtype=np.float64)).tolist() == []


def test_compare_rule_and_missing_figures() -> None:
    big = _spec(
        "big",
        bf16_tflops=1000,
        fp16_tflops=1000,
        memory_gib=192,
        memory_bandwidth_gbs=5000,
        interconnect_gbs=900,
        int8_tops=2000,
        tdp_w=1000,
        price_per_hour_usd=4.0,
    )
    cheap = _spec(
        "cheap",
        fp16_tflops=100,
        memory_gib=24,
        memory_bandwidth_gbs=300,
        interconnect_gbs=64,
        int8_tops=400,
        tdp_w=70,
        price_per_hour_usd=0.4,
    )
    mid = _spec("mid", bf16_tflops=300, memory_gib=80, memory_bandwidth_gbs=2000, interconnect_gbs=600)
    bare = _spec("bare")
    rows = {r["type"]: r for r in compare([big, cheap, mid, bare])}
    assert rows["big"]["tflops_per_dollar_hour"] == 250 and rows["big"]["tflops_per_watt"] == 1
    assert rows["big"]["best_for"] == ["training", "llm_inference"]
    assert rows["cheap"]["best_for"] == ["throughput_inference"]  # 1000 int8 TOPS per $/h beats 500
    assert rows["mid"]["tflops_per_dollar_hour"] is None
    assert rows["mid"]["scores"]["throughput_inference"] is None
    assert rows["bare"]["best_for"] == [] and set(rows["bare"]["scores"].values()) == {None}
    assert rows["bare"]["tflops_16bit"] is None
    json.dumps(list(rows.values()), allow_nan=False)  # JSON-ready: no NaN leaks out


def test_compare_whole_catalog_never_crashes() -> None:
    specs = load_catalog().specs
    rows = compare(specs)
    assert len(rows) == len(specs)
    assert all(set(r["best_for"]) <= set(SCORERS) for r in rows)
    ascend = next(r for r in rows if r["type"] == "ascend910b3")
    assert ascend["best_for"] == [] and ascend["tflops_per_watt"] is None
    assert headline_tflops(load_catalog().by_type("mi100")) == 92.3  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ CLI
def test_cli_table_is_aligned() -> None:
    result = _invoke()
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = lines[0]
    assert header.split()[:3] == ["TYPE", "VENDOR", "MEM_GIB"]
    estimates = [line for line in lines if line.startswith("* ")]
    assert len(lines) == len(load_catalog().specs) + 1 + len(estimates)
    row = next(line for line in lines if line.startswith("a100_80g "))
    end = header.index("MEM_GIB") + len("MEM_GIB")
    assert row[:end].endswith(" 80")  # numbers are right-aligned under their header
    ascend = next(line for line in lines if line.startswith("ascend910b3* "))
    assert " - " in ascend  # missing figures print as '-'


def test_cli_vendor_filter() -> None:
    result = _invoke("--vendor", "amd")
    assert result.exit_code == 0, result.output
    rows = result.stdout.splitlines()[1:]
    assert rows and all(line.split()[1] == "amd" for line in rows)


def test_cli_compare_table() -> None:
    result = _invoke("--compare")
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert "TFLOPS/USD_H" in header and "TFLOPS/W" in header and header.rstrip().endswith("BEST_FOR")
    by_type = {line.split()[0]: line for line in rows}
    assert "training" in by_type["b200"]
    assert by_type["ascend910b4"].rstrip().endswith("-")


def test_cli_json_rows() -> None:
    result = _invoke("--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["type"] for r in rows] == load_catalog().types()
    assert all(r["source"].startswith("http") for r in rows)


def test_cli_compare_json() -> None:
    result = _invoke("--compare", "--json", "--vendor", "nvidia")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {r["vendor"] for r in rows} == {"nvidia"}
    h100 = next(r for r in rows if r["type"] == "h100_sxm")
    assert h100["tflops_per_watt"] == pytest.approx(989 / 700)
    assert set(h100["scores"]) == set(SCORERS) and isinstance(h100["best_for"], list)


def test_cli_models_dir_adds_a_model(tmp_path: Path) -> None:
    result = _invoke("--models-dir", str(_site_dir(tmp_path / "cli")), "--vendor", "nvidia")
    assert result.exit_code == 0, result.output
    assert any(line.startswith("rtx_a6000 ") for line in result.stdout.splitlines())


def test_cli_bad_site_file_is_one_line(tmp_path: Path) -> None:
    directory = _site_dir(tmp_path / "clibad", "models: [ {type: x\n", name="oops.yaml")
    result = _invoke("--models-dir", str(directory))
    assert result.exit_code == 1
    assert result.stderr.startswith("slurm-hetero: ") and str(directory / "oops.yaml") in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_cli_missing_models_dir_and_unknown_vendor(tmp_path: Path) -> None:
    result = _invoke("--models-dir", str(tmp_path / "nowhere"))
    assert result.exit_code == 1 and "no such models directory" in result.stderr
    result = _invoke("--vendor", "acme")
    assert result.exit_code == 1 and "nvidia" in result.stderr and "acme" in result.stderr


@pytest.mark.parametrize(
    ("vendor", "model", "named"),
    [
        ("hygon", "K100_AI", "k100_ai"),
        ("hygon", "Hygon DCU K100_AI", "k100_ai"),
        ("nvidia", "NVIDIA A100-SXM4-40GB", "a100_40g"),
        ("nvidia", "NVIDIA L4", "l4"),
        ("hygon", "XK100_AI", None),  # adv33 E37: a pattern inside another word
        ("hygon", "K100_AI_FAKE", None),
        ("hygon", "K100_AI;rm -rf /", None),
        ("nvidia", "NVIDIA L4 L40S", None),  # adv34 K05: two models
        ("nvidia", "L40S L4", None),
        ("nvidia", "L4-", None),  # adv34 K06: as "-L4", not a name's last character
        ("nvidia", "-L4", None),
    ],
)
def test_an_admins_model_name_names_one_catalog_model_in_whole_words(
    vendor: str, model: str, named: str | None
) -> None:
    spec = load_catalog().named_model(vendor, model)
    assert (spec.type if spec else None) == named
