"""Scoring engine (filters, policies, shards, reports) and the settings that feed it.

Two clusters: the bundled `gres_conf/examples/mixed.yaml` (a100_80g x4 NVLink, l40s x2,
ascend910b3 x8 HCCS) and `second_inventory()` below (H100, MI300X, L40S, T4 and a mixed L4/A100
node), which `test_job_submit_lua.py` also uses.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from slurm_hetero.core.errors import ConfigError
from slurm_hetero.core.model import ClusterInventory
from slurm_hetero.engine.score import (
    ClusterModel,
    PartitionOptions,
    ScoringOptions,
    TypeFacts,
    compile_model,
    policy_key,
    rank,
)
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.config import (
    DEFAULTS,
    Settings,
    config_paths,
    exempt_uids,
    load_settings,
    merge,
    settings_from_dict,
)
from slurm_hetero.inventory.nodes import slurm_nodes
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


# ------------------------------------------------------------------------------------ the model


def test_model_facts_come_from_the_inventory_and_the_catalog(mixed: ClusterModel) -> None:
    a100, l40s, ascend = (mixed.types[t] for t in ("a100_80g", "l40s", "ascend910b3"))
    assert (a100.memory_mib, a100.size, a100.fast_link, a100.price) == (81920, "80G", True, 1.79)
    assert (l40s.memory_mib, l40s.size, l40s.fast_link) == (46068, "46068M", False)  # reported, not nominal
    assert ascend.fast_link and ascend.throughput is None
    assert [(s.count, s.nodes) for s in ascend.shapes] == [(8, 1)]
    assert {"ib", "nvlink", "a100_80g"} <= a100.shapes[0].features


@pytest.mark.parametrize(
    ("second_node_link", "linked"), [("nvlink", True), (None, False)], ids=["every-node", "one-node"]
)
def test_a_type_is_linked_only_where_every_node_of_several_devices_is(
    second_node_link: str | None, linked: bool
) -> None:
    """The hook may place a multi-device job on any node of the type: a link on one node alone
    must not rank the type first for such jobs. A node with one device of the type has no peer."""
    nodes = [
        {"name": "l40sn1", "devices": _devices("nvidia", "NVIDIA L40S", "l40s", 4, 46068, "nvlink")},
        {"name": "l40sn2", "devices": _devices("nvidia", "NVIDIA L40S", "l40s", 4, 46068, second_node_link)},
        {"name": "l40sn3", "devices": _devices("nvidia", "NVIDIA L40S", "l40s", 1, 46068)},
    ]
    cluster = inventory.inventory_from_dict({"version": 1, "nodes": nodes}, "links")
    model = compile_model(slurm_nodes(cluster, load_catalog()), ScoringOptions())
    assert model.types["l40s"].fast_link is linked


def test_vendor_partitions_restrict_types(mixed: ClusterModel, second: ClusterModel) -> None:
    assert mixed.partitions["ascend"].allowed == {"ascend910b3"}
    assert mixed.partitions["nvidia"].allowed == {"a100_80g", "l40s"}
    assert "gpu" not in mixed.partitions and mixed.default_partition == "gpu"  # gpu: not configured
    assert second.partitions["inference"].allowed == {"l40s", "t4", "l4"}
    assert "t4" not in second.partitions["green"].allowed
    assert second.partitions["cheap"].mode == "exact" and second.default.mode == "any-fit"


def test_mixed_node_counts_each_type_separately(second: ClusterModel) -> None:
    assert max(s.count for s in second.types["l4"].shapes) == 2
    assert [s.count for s in second.types["a100_40g"].shapes if "ib" in s.features] == [1]
    assert not [s for s in second.types["l40s"].shapes if "ib" in s.features]
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
    assert list(second.orders[policy][0]) == single
    assert list(second.orders[policy][1]) == multi


def test_best_fit_ties_break_on_price_then_memory_then_name() -> None:
    model = compile_model(slurm_nodes(second_inventory(), load_catalog()), ScoringOptions())
    facts = [model.types[t] for t in ("l40s", "t4")]
    same = [type(f)(**{**f.__dict__, "memory_mib": 1000}) for f in facts]
    assert rank("best-fit", same, False) == ("t4", "l40s")  # 0.35 $/h before 0.86 $/h
    unpriced = [type(f)(**{**f.__dict__, "price": None}) for f in same]
    assert rank("best-fit", unpriced, False) == ("l40s", "t4")  # then by name
    assert rank("fastest", [], True) == ()


def test_a_price_of_0_is_known_and_ranks_first_under_cheapest_as_under_best_fit() -> None:
    """adv32 A06: cheapest read a price of 0 as unknown (ranked last) while best-fit's tie-break
    read it as the lowest price."""
    base = dict(
        vendor="nvidia", feature="f", shares={}, shapes=(), memory_mib=1000, tdp_w=300, fast_link=False
    )
    free = TypeFacts(name="zz", price=0.0, throughput=100.0, **base)
    priced = TypeFacts(name="aa", price=1.0, throughput=400.0, **base)
    assert policy_key("cheapest", free) == 0.0
    assert rank("cheapest", [priced, free], False) == ("zz", "aa")
    assert rank("best-fit", [priced, free], False) == ("zz", "aa")
    idle = TypeFacts(name="bb", price=None, throughput=0.0, **base)  # 0 TFLOPS: known, the least green
    assert rank("greenest", [idle, priced, free], False) == ("aa", "zz", "bb")


def test_policy_key_ranks_unknown_figures_last_and_unknown_policies_fail(second: ClusterModel) -> None:
    assert policy_key("greenest", second.types["t4"]) == math.inf
    with pytest.raises(ValueError, match="choose one of best-fit"):
        policy_key("fastest-ever", second.types["t4"])


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
    assert (settings.scoring.policy, settings.scoring.dtype, settings.fail_policy) == (
        "greenest",
        "fp16",
        "closed",
    )
    assert settings.scoring.partitions["inference"] == PartitionOptions("cheapest", "any-fit")
    assert settings.scoring.shares == {"l40s": 4096} and settings.exempt_users == ("root",)
    assert len(settings.sources) == 5 and settings.scoring.policy == "greenest"


def test_env_points_elsewhere_and_must_exist(tmp_path: Path) -> None:
    etc = _write(tmp_path / "etc" / "config.yaml", "scoring: {policy: fastest}\n").parent
    only = _write(tmp_path / "only.yaml", "job_submit: {mode: any-fit}\n")
    settings = load_settings(None, {"SLURM_HETERO_CONFIG": str(only)}, etc)
    assert (settings.scoring.policy, settings.scoring.mode, settings.sources) == (
        "best-fit",
        "any-fit",
        (str(only),),
    )
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
        (  # adv32 A09: the refusal named 'all' among the valid choices
            "job_submit: {default_vendors: [all]}\n",
            "job_submit.default_vendors",
            "'all' is not a vendor: write `default_vendors: all`, not in a list",
        ),
        ("nonsense: 1\n", "nonsense", "valid keys: scoring, partitions, job_submit, sharing"),
        ("[1, 2]\n", None, "expected a mapping"),
        ("scoring: {policy: [\n", None, "malformed YAML"),
        ("sharing:\n  shard_size: " + "[" * 40_000 + "]" * 40_000, None, "nested too deeply"),  # adv38 D2
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
    from slurm_hetero.engine.score import vendor_scope

    types = mixed.types  # 6 nvidia devices, 8 ascend
    assert sum(t.devices for t in types.values() if t.vendor == "ascend") == 8
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


def test_exempt_users_resolve_to_uids() -> None:
    users = {"alice": 1001}
    assert exempt_uids(["root", "alice", 4242, "ghost", "77"], users.__getitem__) == (0, 77, 1001, 4242)


def test_site_type_names_take_their_facts_from_the_model_string() -> None:
    nodes = slurm_nodes(inventory.load(REPO / "gres_conf" / "examples" / "site-names.yaml"), load_catalog())
    model = compile_model(nodes, ScoringOptions())
    assert set(model.types) == {"a800", "h100", "ascend910b", "lab_big"}
    assert (model.types["ascend910b"].vendor, model.types["ascend910b"].memory_mib) == ("ascend", 65536)
    assert model.types["lab_big"].memory_mib == 46068  # an L40S, by its model string
    assert model.orders["best-fit"][0][:2] == ("lab_big", "ascend910b")  # smallest memory first


def test_a_device_neither_type_nor_model_identifies_is_one_error_naming_both() -> None:
    from slurm_hetero.core.model import Device, NodeInventory

    odd = Device("nvidia", "Mystery 9000", 0, "/dev/nvidia0", 1024, "lab_tiny")
    with pytest.raises(
        Exception, match="node n1: nvidia device 0: neither type 'lab_tiny' nor model 'Mystery 9000'"
    ):
        slurm_nodes(ClusterInventory((NodeInventory("n1", (odd,)),)), load_catalog())


def test_one_type_name_for_two_models_is_one_error() -> None:
    """Adversarial find (issue 7): `type: big` on an L40S and on an H100 was accepted; plan then read
    whichever node came last. Slurm cannot tell the two apart."""
    from slurm_hetero.core.model import Device, NodeInventory

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
    from slurm_hetero.core.model import Device, NodeInventory

    device = Device(vendor, model, 0, "/dev/x0", 46068, gres_type)
    with pytest.raises(Exception, match=f"type '{gres_type}' is the catalog's .* not this '{model}'"):
        slurm_nodes(ClusterInventory((NodeInventory("n1", (device,)),)), load_catalog())


@pytest.mark.parametrize("name", ["", "a b", "x\ny", "default", 7])
def test_the_default_partition_setting_is_one_partition_name(name: object) -> None:
    """job_submit.default_partition reaches the hook's table: a name Slurm could have, nothing else."""
    from slurm_hetero.inventory.config import SCHEMA, _validate

    with pytest.raises(ConfigError, match="partition name"):
        _validate({"job_submit": {"default_partition": name}}, SCHEMA, "site.yaml")


def test_the_default_partition_setting_reaches_the_model() -> None:
    settings = settings_from_dict(merge(DEFAULTS, {"job_submit": {"default_partition": "batch"}}))
    model = compile_model(slurm_nodes(inventory.load(MIXED), load_catalog()), settings.scoring)
    assert model.default_partition == "batch" and settings.scoring.default_partition == "batch"
    assert (
        compile_model(slurm_nodes(inventory.load(MIXED), load_catalog()), ScoringOptions()).default_partition
        == "gpu"
    )
