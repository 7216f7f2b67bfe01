"""Communicator selection for one process group, and what moving bytes through it costs. Pure.

`choose`: one vendor -> its collective library (vendor-ccl); several vendors whose devices all
expose memory to an RDMA NIC of one kind on every node, in memory UCC handles -> `ucc`, NIC to
NIC (rdma-direct); else `gloo` through host memory (cpu-relay). Vendor facts are each vendor's
`model.VendorTraits`, so no table here is keyed by vendor.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from slurm_hetero.core.compat import StrEnum
from slurm_hetero.core.devicespec import DeviceSpec
from slurm_hetero.core.model import Nic, VendorTraits

GB = 1e9
PCIE_GBS = 25.0  # PCIe 4.0 x16, one way
NIC_GBS = {"infiniband": 25.0, "roce": 25.0, "ethernet": 12.5}  # HDR 200 Gb/s, 200 GbE, 100 GbE
DEFAULT_NIC_GBS = 12.5
RDMA_NICS = ("infiniband", "roce")
PEER_MEMORY_CAPABILITIES = ("gpudirect_rdma", "peer_rdma")


class CommKind(StrEnum):
    VENDOR_CCL = "vendor-ccl"
    RDMA_DIRECT = "rdma-direct"
    CPU_RELAY = "cpu-relay"


@dataclass(frozen=True)
class Member:
    """One rank of a group, as communicator choice sees it: its vendor, device facts and node."""

    vendor: VendorTraits
    spec: DeviceSpec
    node: str


@dataclass(frozen=True)
class Communicator:
    """The torch backend and transport of one group; `env` is filled per node by `communicator_env`."""

    backend: str
    kind: CommKind
    env_prefix: str | None = None  # the vendor CCL's NCCL-style variable prefix (NCCL, MCCL)
    env: Mapping[str, str] = field(default_factory=dict)


def choose(
    members: Sequence[Member], nics: Mapping[str, Sequence[Nic]], override: str | None = None
) -> Communicator:
    """The communicator of a group of `members`; `override` (`--backend-override`) forces a backend."""
    vendors, nodes = {m.vendor for m in members}, {m.node for m in members}
    if len(vendors) <= 1:
        vendor = next(iter(vendors), None)
        backend = vendor.torch_backend if vendor else "gloo"
        chosen = Communicator(backend, CommKind.VENDOR_CCL, vendor.ccl_env_prefix if vendor else None)
    elif (
        all(v.ucc_memory for v in vendors)
        and all(any(m.spec.has(c) for c in PEER_MEMORY_CAPABILITIES) for m in members)
        and any(all(any(n.kind == kind for n in nics.get(node, ())) for node in nodes) for kind in RDMA_NICS)
    ):
        chosen = Communicator("ucc", CommKind.RDMA_DIRECT)
    else:
        chosen = Communicator("gloo", CommKind.CPU_RELAY)
    if override is None:
        return chosen
    kind = CommKind.CPU_RELAY if override == "gloo" else chosen.kind
    return Communicator(override, kind, chosen.env_prefix if override == chosen.backend else None)


def communicator_env(communicator: Communicator, nics: Sequence[Nic]) -> dict[str, str]:
    """The network variables a communicator needs on a node with `nics` (none listed: none set, the
    libraries pick). hccl's RDMA is on the device: it only needs the Ethernet interface."""
    backend, prefix = communicator.backend, communicator.env_prefix
    rdma = [n.name for n in nics if n.kind in RDMA_NICS]
    ethernet = [n.name for n in nics if n.kind not in RDMA_NICS]
    env: dict[str, str] = {}
    if prefix is not None:
        if rdma:
            env[f"{prefix}_IB_HCA"] = ",".join(rdma)
        elif nics:
            env[f"{prefix}_IB_DISABLE"] = "1"
        if ethernet:
            env[f"{prefix}_SOCKET_IFNAME"] = ",".join(ethernet)
    elif backend in ("hccl", "gloo") and ethernet:
        env[f"{backend.upper()}_SOCKET_IFNAME"] = ",".join(ethernet)
    elif backend == "ucc" and rdma:
        env["UCX_NET_DEVICES"] = ",".join(f"{name}:1" for name in rdma)
    return env


def nic_gbs(nics: Sequence[Nic]) -> float:
    """One device's share of its node's network, GB/s one way: the fastest NIC kind listed."""
    return max((NIC_GBS.get(n.kind, DEFAULT_NIC_GBS) for n in nics), default=DEFAULT_NIC_GBS)


def pair_gbs(
    groups: Sequence[Sequence[Member]],
    nics: Mapping[str, Sequence[Nic]],
    network_gbs: Sequence[float],
    override: str | None = None,
) -> dict[tuple[int, int], float]:
    """GB/s one way between devices of each pair of groups (i < j) on different nodes, over the slower
    of their `network_gbs`; a cpu-relay also copies every byte through host memory, over PCIe twice."""
    out = {}
    for i, j in itertools.combinations(range(len(groups)), 2):
        seconds = GB / (min(network_gbs[i], network_gbs[j]) * GB)  # one GB over the network
        if choose([*groups[i], *groups[j]], nics, override).kind == CommKind.CPU_RELAY:
            seconds += 2 * GB / (PCIE_GBS * GB)
        out[i, j] = 1.0 / seconds
    return out
