"""Scoring engine (filters, policies, shards, reports) and the settings that feed it.

Two clusters: the bundled `gres_conf/examples/mixed.yaml` (a100_80g x4 NVLink, l40s x2,
ascend910b3 x8 HCCS) and `second_inventory()` below (H100, MI300X, L40S, T4 and a mixed L4/A100
node), which `test_job_submit_lua.py` also uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slurm_hetero import inventory
from slurm_hetero.catalog import load_catalog
from slurm_hetero.config import (
    DEFAULTS,
    Settings,
    config_paths,
    exempt_uids,
    load_settings,
    merge,
    settings_from_dict,
)
from slurm_hetero.engine.reasons import FitReport, ReasonCode
from slurm_hetero.engine.score import (
    Choice,
    ClusterModel,
    Need,
    PartitionOptions,
    ScoringOptions,
    compile_model,
    decide,
    max_per_node,
    policy_key,
    rank,
    reason,
    size_up,
)
from slurm_hetero.errors import ConfigError
from slurm_hetero.model import ClusterInventory
from slurm_hetero.nodes import slurm_nodes
from tests.conftest import REPO

MIXED = REPO / "gres_conf" / "examples" / "mixed.yaml"
GIB = 1024


def _devices(
    vendor: str, model: str, gres_type: str, count: int, mib: int, link: str | None = None, first: int = 0
) -> list[dict[str, Any]]:
    out = []
    for i in range(first, first + count):
        device: dict[str, Any] = {
            "vendor": vendor,
            "model": model,
            "type": gres_type,
            "index": i,
            "file": f"/dev/{gres_type}{i}",
            "memory_mib": mib,
        }
        if link:
            device["links"] = [
                {"peer": p, "kind": link, "count": 1} for p in range(first, first + count) if p != i
            ]
        out.append(device)
    return out


def second_inventory() -> ClusterInventory:
    """A second cluster: 2 H100 nodes (ib), one MI300X node, 4 L40S nodes, one T4 node and one
    node mixing 2 L4 with an A100 40GB (ib)."""
    nodes = [
        {
            "name": "h100n[1-2]",
            "features": ["ib"],
            "devices": _devices("nvidia", "NVIDIA H100 80GB HBM3", "h100_sxm", 8, 81559, "nvlink"),
        },
        {"name": "mi300n1", "devices": _devices("amd", "AMD Instinct MI300X", "mi300x", 8, 196608, "xgmi")},
        {"name": "l40sn[1-4]", "devices": _devices("nvidia", "NVIDIA L40S", "l40s", 4, 46068)},
        {"name": "t4n1", "devices": _devices("nvidia", "Tesla T4", "t4", 2, 15360)},
        {
            "name": "mixn1",
            "features": ["ib"],
            "devices": _devices("nvidia", "NVIDIA L4", "l4", 2, 23034)
            + _devices("nvidia", "NVIDIA A100-SXM4-40GB", "a100_40g", 1, 40960, first=2),
        },
    ]
    return inventory.inventory_from_dict({"version": 1, "nodes": nodes}, "second")


def second_settings() -> Settings:
    """any-fit, shards of 4G on L40S (11 per device) and of 2G on T4 (7), fail closed, per-partition
    policies; no vendor scope but in partition `amdfirst` (AMD)."""
    site = {
        "job_submit": {
            "mode": "any-fit",
            "fail_policy": "closed",
            "exempt_users": ["root", 4242],
            "default_vendors": "all",
        },
        "sharing": {"shard_size": {"l40s": "4G", "t4": 2048}},
        "partitions": {
            "fast": {"policy": "fastest"},
            "cheap": {"policy": "cheapest", "mode": "exact"},
            "green": {"policy": "greenest", "deny_types": ["t4"]},
            "inference": {"allow_types": ["l40s", "t4", "l4"]},
            "amdfirst": {"mode": "exact", "default_vendors": ["amd"]},
        },
    }
    return settings_from_dict(merge(DEFAULTS, site))


@pytest.fixture(scope="module")
def mixed() -> ClusterModel:
    return compile_model(slurm_nodes(inventory.load(MIXED), load_catalog()), ScoringOptions())


@pytest.fixture(scope="module")
def second() -> ClusterModel:
    return compile_model(slurm_nodes(second_inventory(), load_catalog()), second_settings().scoring)


def need(request: str = "gpumem", memory_gib: float | None = None, **kw: Any) -> Need:
    mib = None if memory_gib is None else int(memory_gib * GIB)
    return Need(request, mib, **kw)


# ------------------------------------------------------------------------------------ the model


def test_model_facts_come_from_the_inventory_and_the_catalog(mixed: ClusterModel) -> None:
    a100, l40s, ascend = (mixed.types[t] for t in ("a100_80g", "l40s", "ascend910b3"))
    assert (a100.memory_mib, a100.size, a100.fast_link, a100.price) == (81920, "80G", True, 1.79)
    assert (l40s.memory_mib, l40s.size, l40s.fast_link) == (46068, "46068M", False)  # reported, not nominal
    assert ascend.fast_link and ascend.throughput is None
    assert [(s.count, s.nodes) for s in ascend.shapes] == [(8, 1)]
    assert {"ib", "nvlink", "a100_80g"} <= a100.shapes[0].features


def test_vendor_partitions_restrict_types(mixed: ClusterModel, second: ClusterModel) -> None:
    assert mixed.partitions["ascend"].allowed == {"ascend910b3"}
    assert mixed.partitions["nvidia"].allowed == {"a100_80g", "l40s"}
    both = mixed.rule("ascend,nvidia")  # what either allows, the first's policy
    assert (
        both.allowed == {"ascend910b3", "a100_80g", "l40s"}
        and both.policy == mixed.partitions["ascend"].policy
    )
    assert mixed.rule("ascend,ascend") is mixed.partitions["ascend"]
    assert mixed.rule(None) is mixed.default and mixed.rule("nosuch") is mixed.default  # gpu: not configured
    assert second.partitions["inference"].allowed == {"l40s", "t4", "l4"}
    assert "t4" not in second.partitions["green"].allowed
    assert second.partitions["cheap"].mode == "exact" and second.default.mode == "any-fit"


def test_mixed_node_counts_each_type_separately(second: ClusterModel) -> None:
    assert max_per_node(second.types["l4"], ((frozenset(),),)) == 2
    assert max_per_node(second.types["a100_40g"], ((frozenset({"ib"}),),)) == 1
    assert max_per_node(second.types["l40s"], ((frozenset({"ib"}),),)) == 0
    assert second.types["h100_sxm"].shapes[0].nodes == 2  # a hostlist is two nodes


# ---------------------------------------------------------------------------------- rankings


@pytest.mark.parametrize(
    "policy, single, multi",
    [
        (
            "best-fit",
            ["t4", "l4", "a100_40g", "l40s", "h100_sxm", "mi300x"],
            ["a100_40g", "h100_sxm", "mi300x", "t4", "l4", "l40s"],
        ),
        (
            "fastest",
            ["mi300x", "h100_sxm", "l40s", "a100_40g", "l4", "t4"],
            ["mi300x", "h100_sxm", "a100_40g", "l40s", "l4", "t4"],
        ),
        (
            "cheapest",
            ["mi300x", "l40s", "h100_sxm", "a100_40g", "t4", "l4"],
            ["mi300x", "h100_sxm", "a100_40g", "l40s", "t4", "l4"],
        ),
        (
            "greenest",
            ["mi300x", "l4", "h100_sxm", "l40s", "a100_40g", "t4"],
            ["mi300x", "h100_sxm", "a100_40g", "l4", "l40s", "t4"],
        ),
    ],
)
def test_policy_orders(second: ClusterModel, policy: str, single: list[str], multi: list[str]) -> None:
    """best-fit: memory; fastest: bf16 TFLOPS (T4 has none: last); cheapest: $/TFLOPS (T4 has no
    bf16 and L4 no price: both last, by memory); greenest: TFLOPS/W. Multi: fabrics first."""
    assert list(second.order(policy, 1)) == single
    assert list(second.order(policy, 2)) == multi


def test_best_fit_ties_break_on_price_then_memory_then_name() -> None:
    model = compile_model(slurm_nodes(second_inventory(), load_catalog()), ScoringOptions())
    facts = [model.types[t] for t in ("l40s", "t4")]
    same = [type(f)(**{**f.__dict__, "memory_mib": 1000}) for f in facts]
    assert rank("best-fit", same, False) == ("t4", "l40s")  # 0.35 $/h before 0.86 $/h
    unpriced = [type(f)(**{**f.__dict__, "price": None}) for f in same]
    assert rank("best-fit", unpriced, False) == ("l40s", "t4")  # then by name
    assert rank("fastest", [], True) == ()


def test_policy_key_is_numpy_and_unknown_policies_fail(second: ClusterModel) -> None:
    key = policy_key("greenest", list(second.types.values()))
    assert isinstance(key, np.ndarray) and np.isinf(key[list(second.types).index("t4")])
    with pytest.raises(ValueError, match="choose one of best-fit"):
        policy_key("fastest-ever", [])


# ---------------------------------------------------------------------------------- decisions


def test_best_fit_picks_the_smallest_adequate_memory(mixed: ClusterModel) -> None:
    assert decide(mixed, need(memory_gib=20)) == Choice("gpu", ("l40s",), 1, "best-fit", "exact")
    assert decide(mixed, need(memory_gib=45)).types == ("ascend910b3",)  # l40s has 44.99G
    assert decide(mixed, need(memory_gib=70)).types == ("a100_80g",)


def test_multi_device_requests_prefer_fast_links(mixed: ClusterModel) -> None:
    two = decide(mixed, need(memory_gib=20, count=2, explicit_count=True))
    assert isinstance(two, Choice) and two.types == ("ascend910b3",) and two.count == 2


def test_reasons_in_check_order(mixed: ClusterModel) -> None:
    a100 = mixed.types["a100_80g"]
    allowed = mixed.default.allowed
    assert reason(a100, need(memory_gib=10), frozenset()) == ReasonCode.TYPE_EXCLUDED
    assert (
        reason(a100, need(memory_gib=90, features=frozenset({"nope"})), allowed) == ReasonCode.MISSING_FEATURE
    )
    assert reason(a100, need(memory_gib=90, count=9), allowed) == ReasonCode.INSUFFICIENT_MEMORY
    assert reason(a100, need(memory_gib=10, count=5), allowed) == ReasonCode.TOO_FEW_DEVICES
    assert reason(a100, need(memory_gib=10, features=frozenset({"ib"})), allowed) is None


def test_impossible_requests_name_what_would_fit(mixed: ClusterModel, second: ClusterModel) -> None:
    big = decide(second, need("gpumem:200G", 200))
    assert isinstance(big, FitReport)
    assert (
        big.message == "gpumem:200G: largest device is mi300x with 192G; request 2 devices with "
        "--gres=gpu:2,gpumem:100G"
    )
    typed = decide(
        mixed,
        need(
            "gpu:a100_80g:1,gpumem:90G",
            90,
            gpu_type="a100_80g",
            explicit_count=True,
            memory_items=("gpumem:90G",),
        ),
    )
    assert isinstance(typed, FitReport) and typed.counts == {ReasonCode.INSUFFICIENT_MEMORY: 1}
    assert typed.message.startswith("gpu:a100_80g:1,gpumem:90G: a100_80g has 80G per device; request 2")
    five = decide(
        mixed,
        need(
            "gpu:a100_80g:5,gpumem:20G",
            20,
            count=5,
            gpu_type="a100_80g",
            explicit_count=True,
            memory_items=("gpumem:20G",),
        ),
    )
    assert isinstance(five, FitReport)
    assert five.message.endswith(
        "a100_80g has at most 4 per node; would fit: --gres=gpu:ascend910b3:5,gpumem:20G"
    )
    many = decide(mixed, need("gpu:16,gpumem:20G", 20, count=16, explicit_count=True))
    assert isinstance(many, FitReport)
    assert (
        many.message == "gpu:16,gpumem:20G: no device type fits (3 too few per node); at most 8 devices "
        "per node (ascend910b3)"
    )
    assert many.as_dict()["counts"] == {"TOO_FEW_DEVICES": 3}


def test_partition_limits_and_features_filter(mixed: ClusterModel) -> None:
    report = decide(mixed, need("gpumem:70G", 70, partition="ascend"))
    assert isinstance(report, FitReport)
    assert (
        report.message == "gpumem:70G: largest device is ascend910b3 with 64G; request 2 devices with "
        "--gres=gpu:2,gpumem:35G"
    )
    assert decide(mixed, need(memory_gib=20, features=frozenset({"ib"}))).types == ("a100_80g",)
    assert decide(mixed, need(memory_gib=20, features=None)).types == ("l40s",)  # unread: no filter
    nothing = decide(mixed, need("gpumem:1G", 1, features=frozenset({"nope"})))
    assert (
        isinstance(nothing, FitReport)
        and nothing.message == "gpumem:1G: no device type fits (3 without the features)"
    )


def test_any_fit_lists_every_adequate_type(second: ClusterModel) -> None:
    choice = decide(second, need(memory_gib=70, explicit_count=True))
    assert choice == Choice("any", ("h100_sxm", "mi300x"), 1, "best-fit", "any-fit", ("h100_sxm", "mi300x"))
    typed = decide(second, need(memory_gib=70, gpu_type="mi300x", explicit_count=True))
    assert isinstance(typed, Choice) and typed.kind == "gpu"  # a named type stays exact
    cheap = decide(second, need(memory_gib=20, explicit_count=True, partition="cheap"))
    assert isinstance(cheap, Choice) and (cheap.kind, cheap.types) == ("gpu", ("mi300x",))
    unread = decide(second, need(memory_gib=70, explicit_count=True, features=None))
    assert isinstance(unread, Choice) and unread.kind == "gpu"  # a complex constraint is never extended


def test_below_a_whole_device_becomes_shards(second: ClusterModel) -> None:
    t4, l40s = second.types["t4"], second.types["l40s"]
    assert (t4.shares, t4.shard_mib, l40s.shares, l40s.shard_mib) == (7, 2048, 11, 4096)  # memory // size
    ten = decide(second, need(memory_gib=10))
    assert ten == Choice("shard", ("t4",), 5, "best-fit", "any-fit", ("t4",))  # ceil(10G / 2G)
    core = decide(second, Need("gpucore:30", None, 30))
    assert isinstance(core, Choice) and (core.kind, core.count) == ("shard", 3)  # ceil(30% of 7)
    both = decide(second, Need("gpumem:20G,gpucore:90", 20 * GIB, 90))
    assert isinstance(both, Choice) and (both.kind, both.types, both.count) == ("shard", ("l40s",), 10)
    full = decide(second, need(memory_gib=14))  # 7 shards of 2G: all of a T4, so a whole device
    assert isinstance(full, Choice) and full.kind == "any" and full.types[0] == "t4"
    whole = decide(second, Need("gpucore:100", None, 100))
    assert isinstance(whole, Choice) and whole.kind == "any"
    counted = decide(second, need(memory_gib=10, explicit_count=True))
    assert isinstance(counted, Choice) and counted.kind == "any"


def test_size_up_rounds_to_gib_only_when_it_still_fits() -> None:
    assert size_up(68267, 81920) == "67G"
    assert size_up(46068, 46068) == "46068M"


# ------------------------------------------------------------------------------------ settings


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_layers_merge_in_order(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    _write(
        etc / "config.yaml", "scoring: {policy: fastest, dtype: fp16}\njob_submit: {fail_policy: closed}\n"
    )
    _write(etc / "config.d" / "10-site.yaml", "partitions: {inference: {policy: cheapest}}\n")
    _write(etc / "config.d" / "20-site.yaml", "partitions: {inference: {mode: any-fit}}\n")
    _write(tmp_path / "xdg" / "slurm-hetero" / "config.yaml", "scoring: {policy: greenest}\n")
    extra = _write(tmp_path / "cli.yaml", "sharing: {shard_size: {l40s: 4G}}\n")
    settings = load_settings(extra, {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}, etc)
    assert (settings.policy, settings.dtype, settings.fail_policy) == ("greenest", "fp16", "closed")
    assert settings.partitions["inference"] == PartitionOptions("cheapest", "any-fit")
    assert settings.shares == {"l40s": 4096} and settings.exempt_users == ("root",)
    assert len(settings.sources) == 5 and settings.scoring.policy == "greenest"


def test_env_points_elsewhere_and_must_exist(tmp_path: Path) -> None:
    etc = _write(tmp_path / "etc" / "config.yaml", "scoring: {policy: fastest}\n").parent
    only = _write(tmp_path / "only.yaml", "job_submit: {mode: any-fit}\n")
    settings = load_settings(None, {"SLURM_HETERO_CONFIG": str(only)}, etc)
    assert (settings.policy, settings.mode, settings.sources) == ("best-fit", "any-fit", (str(only),))
    assert config_paths({"SLURM_HETERO_CONFIG": str(only)}, etc) == [(only, True)]
    with pytest.raises(ConfigError, match="not found"):
        load_settings(None, {"SLURM_HETERO_CONFIG": str(tmp_path / "missing.yaml")}, etc)


@pytest.mark.parametrize(
    "text, where, what",
    [
        (
            "scoring: {polcy: fastest}\n",
            "scoring.polcy",
            "valid keys: policy, dtype, allow_types, deny_types",
        ),
        (
            "job_submit: {fail_policy: maybe}\n",
            "job_submit.fail_policy",
            "'maybe' is not one of: open, closed",
        ),
        (
            "partitions: {gpu: {policy: fastest, speed: 1}}\n",
            "partitions.gpu.speed",
            "valid keys: policy, mode",
        ),
        ("sharing: {shard_size: {l40s: 0}}\n", "sharing.shard_size.l40s", "size must be positive"),
        ("sharing: {shard_size: {l40s: [1]}}\n", "sharing.shard_size.l40s", "is not a size"),
        ("job_submit: {exempt_users: root}\n", "job_submit.exempt_users", "list of user names or uids"),
        ("job_submit: {default_vendors: [nvida]}\n", "job_submit.default_vendors", "unknown vendor 'nvida'"),
        (
            "job_submit: {default_vendors: nvidia}\n",
            "job_submit.default_vendors",
            "list of vendor names or 'all'",
        ),
        ("partitions: {p: {default_vendors: [1]}}\n", "partitions.p.default_vendors", "list of vendor names"),
        ("nonsense: 1\n", "nonsense", "valid keys: scoring, partitions, job_submit, sharing"),
        ("[1, 2]\n", None, "expected a mapping"),
        ("scoring: {policy: [\n", None, "malformed YAML"),
    ],
)
def test_bad_settings_name_file_key_and_choices(
    tmp_path: Path, text: str, where: str | None, what: str
) -> None:
    path = _write(tmp_path / "bad.yaml", text)
    with pytest.raises(ConfigError) as err:
        load_settings(path, {"HOME": str(tmp_path)}, tmp_path / "etc")
    assert str(err.value).startswith(f"{path}:{where}:" if where else f"{path}:") and what in str(err.value)


def test_the_vendor_scope_holds_present_vendors_else_the_one_with_most_devices(mixed: ClusterModel) -> None:
    from slurm_hetero.engine.score import device_counts, vendor_scope

    types = mixed.types
    assert device_counts(types.values()) == {"nvidia": 6, "ascend": 8}
    assert vendor_scope(types, types, ("nvidia",)) == {"nvidia"}
    assert vendor_scope(types, types, ("amd", "nvidia")) == {"nvidia"}  # amd has no devices here
    assert vendor_scope(types, types, ("cambricon",)) == {"ascend"}  # none present: most devices
    assert vendor_scope(types, types, ("nvidia", "ascend")) == frozenset()  # every vendor: no scope
    assert vendor_scope(types, types, ()) == frozenset()
    assert vendor_scope(types, ["l40s", "a100_80g"], ("ascend",)) == frozenset()  # one vendor allowed


def test_a_feature_two_vendors_carry_does_not_choose_a_vendor() -> None:
    from dataclasses import replace as with_

    nodes = slurm_nodes(inventory.load(MIXED), load_catalog())
    shared = [with_(n, features=(*n.features, "ib")) if "ascend" in n.features else n for n in nodes]
    model = compile_model(shared, ScoringOptions(vendor_scope=("nvidia",)))
    assert "ib" not in model.vendor_features and {"hccs", "ascend", "nvlink"} <= model.vendor_features
    kept = need(memory_gib=60, features=frozenset({"ib"}), named_features=frozenset({"ib"}))
    assert decide(model, kept).types == ("a100_80g",)
    lifted = need(memory_gib=60, features=frozenset({"hccs"}), named_features=frozenset({"hccs"}))
    assert decide(model, lifted).types == ("ascend910b3",)


def test_exempt_users_resolve_to_uids() -> None:
    users = {"alice": 1001}
    assert exempt_uids(["root", "alice", 4242, "ghost", "77"], users.__getitem__) == (0, 77, 1001, 4242)


def test_site_type_names_take_their_facts_from_the_model_string() -> None:
    nodes = slurm_nodes(inventory.load(REPO / "gres_conf" / "examples" / "site-names.yaml"), load_catalog())
    model = compile_model(nodes, ScoringOptions())
    assert set(model.types) == {"a800", "h100", "ascend910b", "lab_big"}
    assert (model.types["ascend910b"].vendor, model.types["ascend910b"].memory_mib) == ("ascend", 65536)
    assert model.types["lab_big"].memory_mib == 46068  # an L40S, by its model string
    assert decide(model, need(memory_gib=40)).types == ("lab_big",)
    assert decide(model, need(memory_gib=60)).types == ("ascend910b",)


def test_a_device_neither_type_nor_model_identifies_is_one_error_naming_both() -> None:
    from slurm_hetero.model import Device, NodeInventory

    odd = Device("nvidia", "Mystery 9000", 0, "/dev/nvidia0", 1024, "lab_tiny")
    with pytest.raises(
        Exception, match="node n1: nvidia device 0: neither type 'lab_tiny' nor model 'Mystery 9000'"
    ):
        slurm_nodes(ClusterInventory((NodeInventory("n1", (odd,)),)), load_catalog())


def test_one_type_name_for_two_models_is_one_error() -> None:
    """Adversarial find (issue 7): `type: big` on an L40S and on an H100 was accepted; plan then read
    whichever node came last. Slurm cannot tell the two apart."""
    from slurm_hetero.model import Device, NodeInventory

    l40s = Device("nvidia", "NVIDIA L40S", 0, "/dev/nvidia0", 46068, "big")
    h100 = Device("nvidia", "NVIDIA H100 80GB HBM3", 0, "/dev/nvidia0", 81559, "big")
    nodes = (NodeInventory("n1", (l40s,)), NodeInventory("n2", (h100,)))
    with pytest.raises(Exception, match="Type= 'big' names two device models: NVIDIA L40S .node n1. and"):
        slurm_nodes(ClusterInventory(nodes), load_catalog())


@pytest.mark.parametrize(
    ("vendor", "model", "gres_type"),
    [
        ("nvidia", "NVIDIA L40S", "h100_sxm"),  # another model's catalog type
        ("ascend", "Ascend910B3", "a100_80g"),  # another vendor's catalog type
    ],
)
def test_a_catalog_type_that_is_not_the_device_is_refused(vendor: str, model: str, gres_type: str) -> None:
    from slurm_hetero.model import Device, NodeInventory

    device = Device(vendor, model, 0, "/dev/x0", 46068, gres_type)
    with pytest.raises(Exception, match=f"type '{gres_type}' is the catalog's .* not this '{model}'"):
        slurm_nodes(ClusterInventory((NodeInventory("n1", (device,)),)), load_catalog())


@pytest.mark.parametrize("name", ["", "a b", "x\ny", "default", 7])
def test_the_default_partition_setting_is_one_partition_name(name: object) -> None:
    """job_submit.default_partition reaches the hook's table: a name Slurm could have, nothing else."""
    from slurm_hetero.config import SCHEMA, _validate

    with pytest.raises(ConfigError, match="partition name"):
        _validate({"job_submit": {"default_partition": name}}, SCHEMA, "site.yaml")


def test_the_default_partition_setting_reaches_the_model() -> None:
    settings = settings_from_dict(merge(DEFAULTS, {"job_submit": {"default_partition": "batch"}}))
    model = compile_model(slurm_nodes(inventory.load(MIXED), load_catalog()), settings.scoring)
    assert model.default_partition == "batch" and settings.default_partition == "batch"
    assert (
        compile_model(slurm_nodes(inventory.load(MIXED), load_catalog()), ScoringOptions()).default_partition
        == "gpu"
    )
