"""gres render: golden files for the bundled example, a render -> parse round trip, folding."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_hetero.core import hostlist
from slurm_hetero.core.model import ClusterInventory, Device, Health, Link, NodeInventory
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.nodes import gres_order
from slurm_hetero.render.context import RenderOptions, build_context, slurm_cores
from slurm_hetero.render.templates import render_configs
from tests.conftest import REPO
from tests.gresreader import parse_gres_conf

EXAMPLES = REPO / "gres_conf" / "examples"


def render(inv: ClusterInventory, **options: object) -> dict[str, str]:
    context = build_context(inv, load_catalog(), RenderOptions(**options))  # type: ignore[arg-type]
    context["source"] = "test"
    return render_configs(context)


def node_lines(text: str) -> dict[str, dict[str, str]]:
    """NodeName lines of slurm-nodes.conf, expanded per host."""
    out = {}
    for line in text.splitlines():
        if line.startswith("NodeName="):
            fields = dict(tok.split("=", 1) for tok in line.split())
            for host in hostlist.expand(fields["NodeName"]):
                out[host] = fields
    return out


def test_bundled_example_matches_golden(update_golden: bool) -> None:
    for source in sorted(EXAMPLES.glob("*.yaml")):
        inv = inventory.load(source)
        context = build_context(inv, load_catalog(), RenderOptions())
        context["source"] = source.name
        for name, text in render_configs(context).items():
            golden = source.with_name(f"{source.stem}.{name}.example")
            if update_golden:
                golden.write_text(text)
            assert text == golden.read_text(), f"{golden} differs; review and run pytest --update-golden"


def _spec_strategy() -> st.SearchStrategy:
    specs = [s for s in load_catalog().specs if not s.compare_only]
    return st.sampled_from(specs)


@st.composite
def nodes(draw: st.DrawFn, position: int) -> NodeInventory:
    count = draw(st.integers(1, 8))
    spec = draw(_spec_strategy())
    mixed = draw(_spec_strategy()) if draw(st.booleans()) else spec
    cores = draw(st.sampled_from([None, "0-7", "8-15", "0,2,4"]))
    devices = []
    for i in range(count):
        chosen = spec if i < count // 2 or count == 1 else mixed
        links = tuple(
            Link(j, "nvlink", draw(st.integers(1, 18)))
            for j in range(count)
            if j != i and draw(st.booleans()) and draw(st.booleans())
        )
        health = Health.UNHEALTHY if draw(st.integers(0, 9)) == 0 else Health.OK
        devices.append(
            Device(
                vendor=chosen.vendor,
                model=chosen.name,
                type=chosen.type,
                index=i,
                file=f"/dev/accel{i}",
                memory_mib=chosen.memory_mib,
                cores=cores,
                links=links,
                health=health,
            )
        )
    # links only between devices of the same vendor (peer is a per-vendor index)
    devices = [
        dataclasses.replace(d, links=tuple(link for link in d.links if devices[link.peer].vendor == d.vendor))
        for d in devices
    ]
    return NodeInventory(
        name=f"node{position:03d}", devices=tuple(devices), cpus=draw(st.sampled_from([8, 64]))
    )


@st.composite
def inventories(draw: st.DrawFn) -> ClusterInventory:
    count = draw(st.integers(1, 6))
    distinct = [draw(nodes(i)) for i in range(count)]
    copies = [
        dataclasses.replace(n, name=f"copy{i:03d}") for i, n in enumerate(distinct) if draw(st.booleans())
    ]
    return ClusterInventory(nodes=tuple(distinct + copies))


def _expected(node: NodeInventory, include_unhealthy: bool) -> list[tuple]:
    devices = gres_order(node.devices, include_unhealthy)
    rows = []
    for d in devices:
        counts = {link.peer: link.count for link in d.links}
        row = [-1 if o is d else (counts.get(o.index, 0) if o.vendor == d.vendor else 0) for o in devices]
        links = ",".join(map(str, row)) if any(c > 0 for c in row) else None
        rows.append((d.type, d.file, slurm_cores(d.cores, node)[0], links))
    return rows


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inv=inventories(), include_unhealthy=st.booleans())
def test_render_then_parse_gives_the_same_devices(inv: ClusterInventory, include_unhealthy: bool) -> None:
    files = render(inv, include_unhealthy=include_unhealthy)
    parsed: dict[str, list[tuple]] = {}
    for e in parse_gres_conf(files["gres.conf"]):
        if e.name == "gpu":
            parsed.setdefault(e.node or "", []).append((e.type, e.file, e.cores, e.links))
    declared = node_lines(files["slurm-nodes.conf"])
    for node in inv.nodes:
        expected = _expected(node, include_unhealthy)
        assert parsed.get(node.name, []) == expected
        gres = declared[node.name].get("Gres", "")
        per_type: dict[str, int] = {}
        for t, *_ in expected:
            per_type[t] = per_type.get(t, 0) + 1
        assert [g for g in gres.split(",") if g.startswith("gpu:")] == [
            f"gpu:{t}:{n}" for t, n in per_type.items()
        ]
    # accounting names exactly the gpu types some node declares, plus gpumem and gpucore
    (tres,) = [
        ln.split("=", 1)[1]
        for ln in files["slurm-nodes.conf"].splitlines()
        if ln.startswith("# AccountingStorageTRES=")
    ]
    declared_types = {
        g.split(":")[1] for f in declared.values() for g in f.get("Gres", "").split(",") if g[:4] == "gpu:"
    }
    named = tres.split(",")
    assert {t.split(":", 1)[1] for t in named if t.startswith("gres/gpu:")} == declared_types
    assert {"gres/gpu", "gres/gpumem", "gres/gpucore"} <= set(named) and len(named) == len(set(named))


def test_identical_nodes_fold_into_one_line() -> None:
    base = inventory.load(EXAMPLES / "mixed.yaml").nodes[0]
    many = ClusterInventory(
        nodes=tuple(dataclasses.replace(base, name=f"gpu-{i:03d}") for i in range(1, 513))
    )
    files = render(many)
    node_line = [line for line in files["slurm-nodes.conf"].splitlines() if line.startswith("NodeName=")]
    assert len(node_line) == 1 and node_line[0].startswith("NodeName=gpu-[001-512] ")
    assert all(
        line.startswith("NodeName=gpu-[001-512] ")
        for line in files["gres.conf"].splitlines()
        if line.startswith("NodeName=")
    )


def test_unhealthy_devices_are_left_out_unless_asked() -> None:
    node = inventory.load(EXAMPLES / "mixed.yaml").nodes[1]
    sick = dataclasses.replace(node.devices[1], health=Health.UNHEALTHY, health_reason="xid 79")
    inv = ClusterInventory(nodes=(dataclasses.replace(node, devices=(node.devices[0], sick)),))
    assert "gpu:l40s:1," in render(inv)["slurm-nodes.conf"]
    assert "gpu:l40s:2," in render(inv, include_unhealthy=True)["slurm-nodes.conf"]


def test_binpack_weights_are_device_cost_and_spread_uses_lln() -> None:
    inv = inventory.load(EXAMPLES / "mixed.yaml")
    lines = node_lines(render(inv)["slurm-nodes.conf"])
    # catalog prices in cents/hour: L40S $0.86, A100 80GB $1.79; the 910B3 has no price, so its
    # 280 TFLOPS at the catalog's median price per TFLOPS-hour
    assert (lines["l40sn1"]["Weight"], lines["a100n1"]["Weight"]) == ("86", "179")
    assert int(lines["l40sn1"]["Weight"]) < int(lines["ascendn1"]["Weight"]) < int(lines["a100n1"]["Weight"])
    spread = render(inv, policy="spread")["slurm-nodes.conf"]
    assert {f["Weight"] for f in node_lines(spread).values()} == {"1"}
    assert "LLN=YES" in spread


def test_features_name_vendor_type_memory_interconnect_and_stack() -> None:
    lines = node_lines(render(inventory.load(EXAMPLES / "mixed.yaml"))["slurm-nodes.conf"])
    features = lines["a100n1"]["Features"].split(",")
    for expected in ("nvidia", "a100_80g", "gpumem80g", "nvlink", "nvidia_drv535", "cuda12.2", "ib"):
        assert expected in features


def test_rendered_example_is_parsed_back_by_the_site_parser(tmp_path: Path) -> None:
    files = render(inventory.load(EXAMPLES / "mixed.yaml"))
    entries = parse_gres_conf(files["gres.conf"])
    assert sum(1 for e in entries if e.name == "gpu") == 14
    assert {e.node for e in entries} == {"a100n1", "l40sn1", "ascendn1"}


def test_cores_are_slurm_core_indices_and_out_of_range_affinity_is_dropped_with_a_note() -> None:
    smt = NodeInventory("n", cpus=96, sockets=2, cores_per_socket=24, threads_per_core=2)
    assert slurm_cores("0-23,48-71", smt) == ("0-23", None)
    assert slurm_cores("24-47,72-95", smt) == ("24-47", None)
    assert slurm_cores("0,2,4", NodeInventory("n", cpus=8)) == ("0,2,4", None)
    assert slurm_cores("0-3", NodeInventory("n")) == ("0-3", None)  # node size unknown: kept
    small = NodeInventory(
        "small",
        cpus=16,
        devices=(Device("ascend", "910B3", 0, "/dev/davinci0", 65536, "ascend910b3", cores="144-167"),),
    )
    files = render(ClusterInventory(nodes=(small,)))
    assert "File=/dev/davinci0 Flags=no_gpu_env\n" in files["gres.conf"]
    assert (
        "# note: small: ascend device 0: CPU affinity 144-167 is beyond the node's 16 CPUs"
        in files["gres.conf"]
    )


def _h100_node(name: str = "h100n1") -> NodeInventory:
    device = Device("nvidia", "NVIDIA H100 80GB HBM3", 0, "/dev/nvidia0", 81559, "h100_sxm")
    return NodeInventory(name, cpus=8, real_memory_mib=16000, devices=(device,))


def test_binpack_fills_the_cheaper_a100_before_the_h100() -> None:
    a100 = inventory.load(EXAMPLES / "mixed.yaml").nodes[0]
    lines = node_lines(render(ClusterInventory(nodes=(a100, _h100_node())))["slurm-nodes.conf"])
    assert int(lines["a100n1"]["Weight"]) < int(lines["h100n1"]["Weight"]) == 399


def test_weights_are_stable_when_nodes_come_and_go() -> None:
    nodes = inventory.load(EXAMPLES / "mixed.yaml").nodes
    full = node_lines(render(ClusterInventory(nodes=nodes))["slurm-nodes.conf"])
    for gone in range(len(nodes)):
        rest = tuple(n for i, n in enumerate(nodes) if i != gone)
        lines = node_lines(render(ClusterInventory(nodes=rest))["slurm-nodes.conf"])
        assert all(lines[name]["Weight"] == full[name]["Weight"] for name in lines)


def test_memory_feature_is_the_devices_own_memory_rounded_down() -> None:
    apu = Device("amd", "MI300A", 0, "/dev/dri/renderD128", 64296, "mi300a")  # 62.8 GiB as amd-smi saw
    node = NodeInventory("apu1", cpus=96, real_memory_mib=100000, devices=(apu,))
    lines = node_lines(render(ClusterInventory(nodes=(node, _h100_node())))["slurm-nodes.conf"])
    assert "gpumem62g" in lines["apu1"]["Features"].split(",")
    assert "gpumem128g" not in lines["apu1"]["Features"]
    assert "gpumem79g" in lines["h100n1"]["Features"].split(",")  # 81559 MiB


def test_node_without_a_healthy_device_leaves_the_gpu_partitions_with_a_warning() -> None:
    node = _h100_node("sick1")
    sick = dataclasses.replace(node.devices[0], health=Health.UNHEALTHY, health_reason="xid 79")
    inv = ClusterInventory(nodes=(dataclasses.replace(node, devices=(sick,)), _h100_node()))
    files = render(inv)
    partitions = [line for line in files["slurm-nodes.conf"].splitlines() if line.startswith("PartitionName")]
    assert partitions and all("sick1" not in line for line in partitions)
    assert (
        "# note: sick1: no healthy device (nvidia 0 (xid 79)): left out of the GPU partitions"
        in files["gres.conf"]
    )


def test_missing_node_facts_are_named_with_what_slurm_assumes() -> None:
    bare = dataclasses.replace(_h100_node("bare1"), cpus=None, real_memory_mib=None)
    files = render(ClusterInventory(nodes=(bare,)))
    assert (
        "bare1: no CPUs or RealMemory in the inventory: Slurm will assume CPUs=1, RealMemory=1"
        in (files["gres.conf"])
    )


def test_dev_cluster_gives_each_host_of_a_hostlist_its_own_line_port_and_fake_devices() -> None:
    """Issue 9: `hx-a800-[1-2]` kept its brackets in the fake device path, which slurmd cannot parse."""
    from slurm_hetero.render.context import LocalSlurmd

    inv = inventory.load(EXAMPLES / "mixed.yaml")
    inv = dataclasses.replace(
        inv, nodes=(dataclasses.replace(inv.nodes[0], name="hx-a800-[1-2]"), *inv.nodes[1:])
    )
    files = render(inv, local=LocalSlurmd("localhost"))
    lines = node_lines(files["slurm-nodes.conf"])
    assert {"hx-a800-1", "hx-a800-2"} <= set(lines) and lines["hx-a800-1"]["Port"] != lines["hx-a800-2"][
        "Port"
    ]
    for entry in parse_gres_conf(files["gres.conf"]):
        if entry.name == "gpu" and entry.node and entry.node.startswith("hx-"):
            assert entry.file is not None and entry.file.startswith(f"/dev/fakegpu/{entry.node}/")
    assert "/dev/fakegpu/hx-a800-[" not in files["gres.conf"]


def test_partition_and_all_node_lists_are_folded_from_host_names_not_from_folded_lists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """10,000 nodes: re-folding the shapes' folded lists sent them through NodeSet's full parser
    and its multivariate folding (0.4 s of a 3.3 s render); the names fold in milliseconds."""
    seen: list[list[str]] = []
    real_fold = hostlist.fold

    def spy(names: Iterable[str]) -> str:
        names = list(names)
        seen.append(names)
        return real_fold(names)

    monkeypatch.setattr(hostlist, "fold", spy)
    small = dataclasses.replace(
        _h100_node("a30-1"), devices=(Device("nvidia", "NVIDIA A30", 0, "/dev/nvidia0", 24576, "a30"),)
    )
    files = render(ClusterInventory(nodes=(_h100_node("a100-40g-3"), _h100_node("a100-40g-4"), small)))
    assert seen and not [names for names in seen if any("[" in n or "," in n for n in names)]
    partition = next(
        line for line in files["slurm-nodes.conf"].splitlines() if line.startswith("PartitionName=nvidia")
    )
    assert "Nodes=a100-40g-[3-4],a30-1 " in partition + " "


def _gpu_lines(text: str) -> dict[str, str]:
    """Type= -> the Flags= value of its gres.conf lines."""
    found = {}
    for line in text.splitlines():
        if " Name=gpu " in line:
            fields = dict(item.split("=", 1) for item in line.split())
            found[fields["Type"]] = fields["Flags"]
    return found


def test_each_vendor_gets_its_own_environment_flag() -> None:
    def node(name: str, vendor: str, model: str, type_: str, file: str) -> NodeInventory:
        return NodeInventory(name, cpus=8, devices=(Device(vendor, model, 0, file, 65536, type_),))

    inv = ClusterInventory(
        nodes=(
            node("nv1", "nvidia", "NVIDIA L40S", "l40s", "/dev/nvidia0"),
            node("amd1", "amd", "AMD Instinct MI300X", "mi300x", "/dev/dri/renderD128"),
            node("npu1", "ascend", "Ascend910B3", "ascend910b3", "/dev/davinci0"),
            node("mlu1", "cambricon", "MLU370-X8", "mlu370", "/dev/cambricon_dev0"),
        )
    )
    assert _gpu_lines(render(inv)["gres.conf"]) == {
        "l40s": "nvidia_gpu_env",  # CUDA_VISIBLE_DEVICES only
        "mi300x": "amd_gpu_env",  # ROCR only: ROCm reads CUDA_VISIBLE_DEVICES inside ROCR's set
        "ascend910b3": "no_gpu_env",  # the TaskProlog exports ASCEND_RT_VISIBLE_DEVICES
        "mlu370": "no_gpu_env",
    }


def test_a_node_mixing_environment_flags_gets_one_for_all_its_gpu_lines() -> None:
    """adv47 C1: slurmd refused a node whose gpu lines carried amd_gpu_env and nvidia_gpu_env ("does
    not match env flags for previous GRES of same node and name")."""
    mixed = NodeInventory(
        "mixn1",
        cpus=8,
        devices=(
            Device("nvidia", "NVIDIA L40S", 0, "/dev/nvidia0", 46068, "l40s"),
            Device("amd", "AMD Instinct MI300X", 0, "/dev/dri/renderD128", 196608, "mi300x"),
        ),
    )
    gres = render(ClusterInventory(nodes=(mixed,)))["gres.conf"]
    assert _gpu_lines(gres) == {"l40s": "no_gpu_env", "mi300x": "no_gpu_env"}
    assert "mixn1: several vendors: Flags=no_gpu_env, as slurmd takes one per node and numbers" in gres
    assert "; nvidia devices get none: isolate them with ConstrainDevices=yes\n" in gres
    # adv48: one flag (nvidia_gpu_env) for both, but Slurm's CUDA_VISIBLE_DEVICES=1 named the L40S
    # after the Iluvatar card, where CUDA counts only NVIDIA's: 0
    iluvatar = Device("iluvatar", "Iluvatar CoreX BI-V150", 0, "/dev/iluvatar0", 32768, "bi_v150")
    both = dataclasses.replace(mixed, devices=(iluvatar, mixed.devices[0]))
    gres = render(ClusterInventory(nodes=(both,)))["gres.conf"]
    assert _gpu_lines(gres) == {"bi_v150": "no_gpu_env", "l40s": "no_gpu_env"}
    assert "; iluvatar and nvidia devices get none: isolate them" in gres
    # adv48 row 11: --autodetect left such a node out without the note the admin guide promises
    gres = render(ClusterInventory(nodes=(both,)), autodetect=True)["gres.conf"]
    assert "mixn1: AutoDetect left out: the node has several vendors (iluvatar, nvidia), slurmd one" in gres
    assert "AutoDetect=" not in gres


def test_autodetect_only_where_slurmd_can_match_the_type() -> None:
    files = render(inventory.load(EXAMPLES / "mixed.yaml"), autodetect=True)
    gres = files["gres.conf"]
    assert "NodeName=l40sn1 AutoDetect=nvml\n" in gres  # l40s is part of NVML's nvidia_l40s
    assert "a100n1 AutoDetect" not in gres and "ascendn1 AutoDetect" not in gres
    assert "a100n1: AutoDetect left out: Type=a100_80g is not part of the name nvml reports" in gres
    assert "AutoDetect" not in render(inventory.load(EXAMPLES / "mixed.yaml"))["gres.conf"]
