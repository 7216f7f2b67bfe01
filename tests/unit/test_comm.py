"""Communicator choice per group, its network variables, and what a transfer costs."""

from __future__ import annotations

import pytest

from slurm_hetero.core.model import Nic
from slurm_hetero.engine.comm import (
    CommKind,
    Communicator,
    Member,
    choose,
    communicator_env,
    nic_gbs,
    pair_gbs,
)
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.vendors import vendor_traits

CATALOG = load_catalog()
TRAITS = vendor_traits()
IB = (Nic("mlx5_0", "infiniband"), Nic("eth0", "ethernet"))
ROCE = (Nic("mlx5_0", "roce"),)
VENDOR = CommKind.VENDOR_CCL


def member(vendor: str, gres_type: str, node: str) -> Member:
    spec = CATALOG.by_type(gres_type)
    assert spec is not None
    return Member(TRAITS[vendor], spec, node)


def test_every_registered_vendor_names_its_collective_library() -> None:
    for traits in TRAITS.values():
        assert traits.torch_backend != "gloo", traits.name
        if traits.torch_package:
            assert traits.torch_package.replace(".", "_").isidentifier()


def test_one_vendor_uses_its_own_library_even_across_types_and_nodes() -> None:
    members = [member("nvidia", "a100_80g", "n1"), member("nvidia", "l40s", "n2")]
    chosen = choose(members, {})
    assert (chosen.backend, chosen.kind) == ("nccl", CommKind.VENDOR_CCL)
    assert choose([member("ascend", "ascend910b3", "n3")], {}).backend == "hccl"


def test_vendors_with_peer_memory_on_one_rdma_fabric_go_direct_through_ucc() -> None:
    members = [member("nvidia", "a100_80g", "n1"), member("amd", "mi300x", "n2")]
    chosen = choose(members, {"n1": IB, "n2": IB})
    assert (chosen.backend, chosen.kind) == ("ucc", CommKind.RDMA_DIRECT)
    assert choose(members, {"n1": ROCE, "n2": ROCE}).kind == CommKind.RDMA_DIRECT


@pytest.mark.parametrize(
    ("members", "nics"),
    [
        # no NICs recorded
        ([("nvidia", "a100_80g", "n1"), ("amd", "mi300x", "n2")], {}),
        # two fabrics: InfiniBand on one node, RoCE on the other
        ([("nvidia", "a100_80g", "n1"), ("amd", "mi300x", "n2")], {"n1": IB, "n2": ROCE}),
        # l4 has no GPUDirect RDMA
        ([("nvidia", "l4", "n1"), ("amd", "mi300x", "n2")], {"n1": IB, "n2": IB}),
        # Ascend memory is not something UCC handles
        ([("nvidia", "a100_80g", "n1"), ("ascend", "ascend910b3", "n2")], {"n1": IB, "n2": IB}),
    ],
)
def test_anything_else_across_vendors_relays_through_host_memory(
    members: list[tuple[str, str, str]], nics: dict[str, tuple[Nic, ...]]
) -> None:
    chosen = choose([member(*m) for m in members], nics)
    assert (chosen.backend, chosen.kind) == ("gloo", CommKind.CPU_RELAY)


def test_backend_override_applies_to_every_group() -> None:
    members = [member("nvidia", "a100_80g", "n1")]
    assert choose(members, {}, override="gloo").kind == CommKind.CPU_RELAY
    forced = choose(members, {}, override="ucc")
    assert (forced.backend, forced.kind) == ("ucc", CommKind.VENDOR_CCL)


def test_network_variables_follow_the_nodes_nics() -> None:
    nccl, mccl = Communicator("nccl", VENDOR, "NCCL"), Communicator("mccl", VENDOR, "MCCL")
    assert communicator_env(nccl, IB) == {"NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_IFNAME": "eth0"}
    assert communicator_env(nccl, (Nic("eth0", "ethernet"),)) == {
        "NCCL_IB_DISABLE": "1",
        "NCCL_SOCKET_IFNAME": "eth0",
    }
    assert communicator_env(mccl, ROCE) == {"MCCL_IB_HCA": "mlx5_0"}
    assert communicator_env(Communicator("gloo", CommKind.CPU_RELAY), IB) == {"GLOO_SOCKET_IFNAME": "eth0"}
    assert communicator_env(Communicator("hccl", VENDOR), IB) == {"HCCL_SOCKET_IFNAME": "eth0"}
    assert communicator_env(Communicator("ucc", CommKind.RDMA_DIRECT), IB) == {"UCX_NET_DEVICES": "mlx5_0:1"}
    assert communicator_env(nccl, ()) == {}
    # the prefix is the vendor's, not the backend name's: a vendor whose CCL registers as nccl may read MCCL_*
    assert choose([member("mthreads", "mtt_s4000", "n1")], {}).env_prefix == "MCCL"


def test_relay_costs_two_pcie_copies_plus_the_network() -> None:
    groups = [[member("nvidia", "a100_80g", "n1")], [member("amd", "mi300x", "n2")]]
    groups += [[member("ascend", "ascend910b3", "n3")], [member("nvidia", "l40s", "n4")]]
    gbs = pair_gbs(groups, dict.fromkeys(("n1", "n2", "n3", "n4"), IB), [25, 50, 25, 25])
    assert gbs[0, 1] == pytest.approx(25)  # rdma-direct, at the slower of the two
    assert 1 / gbs[0, 2] == pytest.approx(2 / 25 + 1 / 25)  # cpu-relay
    assert gbs[0, 3] == pytest.approx(25)  # vendor-ccl between nodes


def test_nic_speed_is_the_fastest_kind_listed() -> None:
    assert nic_gbs(IB) == 25.0
    assert nic_gbs((Nic("eth0", "ethernet"),)) == 12.5
    assert nic_gbs(()) == 12.5
