"""One node's inventory: vendors by affinity (or --vendor), their tools or captured files, the catalog.

A vendor that fails is a warning (a broken AMD tool does not hide the NVIDIA GPUs), unless the
admin forced it with --vendor.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_hetero.core.devicespec import Catalog
from slurm_hetero.core.errors import HeteroError, InventoryError, ParseError, ToolError
from slurm_hetero.core.model import Capture, ClusterInventory, Device, NodeInventory
from slurm_hetero.core.readfile import MAX_CAPTURE_BYTES, read_text
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.hosttopo import HostTopology, memtotal_mib, read_topology
from slurm_hetero.inventory.nodes import lookup_spec, unknown_device
from slurm_hetero.slurm import syntax
from slurm_hetero.slurm.scontrol import show_node
from slurm_hetero.vendors import Vendor, all_vendors, get_vendor

logger = logging.getLogger(__name__)


def complete_device(device: Device, catalog: Catalog, vendor: Vendor) -> Device:
    """Fill the Slurm type and, where the capture lacked it, the memory from the catalog."""
    spec = lookup_spec(device, catalog)
    if spec is None and not device.type:
        raise unknown_device(device)
    memory = device.memory_mib or (spec.memory_mib if spec else None)
    if memory is None:
        hint = f"; also capture `{vendor.memory_capture_hint}`" if vendor.memory_capture_hint else ""
        raise InventoryError(
            f"{device.vendor} device {device.index} ({device.model}): no memory size known{hint}"
        )
    return dataclasses.replace(device, type=device.type or (spec.type if spec else ""), memory_mib=memory)


def _parse_with_any_vendor(captures: list[Capture]) -> tuple[Vendor, list[Device]]:
    vendors = all_vendors()
    for vendor in vendors:
        try:
            return vendor, vendor.parse(captures)
        except ParseError:
            continue  # --vendor names the one whose refusal matters
    names = ", ".join(c.source for c in captures)
    what, it = (f"{names} together", "them") if len(captures) > 1 else (names, "it")
    raise HeteroError(
        f"no vendor parser recognised {what}; pass --vendor NAME to see why that vendor's parser "
        f"refuses {it} ({', '.join(v.name for v in vendors)})"
    )


def devices_from_files(
    vendor_names: Sequence[str], paths: Sequence[Path], catalog: Catalog, model: str | None = None
) -> list[tuple[Vendor, list[Device]]]:
    """Captured files of one --vendor, else of the vendor whose parser takes them; `model` names
    the catalog model for captures that name none (Hygon's `hy-smi`)."""
    captures = [
        Capture(str(p), read_text(p, MAX_CAPTURE_BYTES, "capture file", errors="replace")) for p in paths
    ]
    if len(vendor_names) > 1:
        raise HeteroError("--from-file takes captures of one vendor at a time; run discover once per vendor")
    if model is not None:
        if not vendor_names:
            raise HeteroError("--model needs --vendor NAME: it names the model of that vendor's captures")
        vendor = get_vendor(vendor_names[0])
        if catalog.named_model(vendor.name, model) is None:
            known = ", ".join(s.name for s in catalog.specs if s.vendor == vendor.name)
            raise HeteroError(
                f"--model {syntax.text(model)} names no {vendor.name} model of the catalog; "
                f"give one as its tool prints it ({known}), or add it to a site catalog (--models-dir)"
            )
        return [(vendor, vendor.parse_with_model(captures, model))]
    if vendor_names:
        vendor = get_vendor(vendor_names[0])
        return [(vendor, vendor.parse(captures))]
    return [_parse_with_any_vendor(captures)]


def probe_each(vendors: Sequence[Vendor]) -> tuple[list[tuple[Vendor, list[Device]]], dict[str, HeteroError]]:
    """Probe every vendor; the errors of those that cannot be asked are returned, not raised."""
    found, failed = [], {}
    for vendor in vendors:
        try:
            if vendor.unavailable_reason:
                raise HeteroError(f"vendor {vendor.name} unavailable: {vendor.unavailable_reason}")
            found.append((vendor, vendor.probe()))
        except HeteroError as e:
            failed[vendor.name] = e
    return found, failed


def devices_live(vendor_names: Sequence[str]) -> list[tuple[Vendor, list[Device]]]:
    """Probe forced vendors (errors are fatal) or every vendor whose affinity is positive."""
    if vendor_names:
        found, failed = probe_each([get_vendor(n) for n in vendor_names])
        for error in failed.values():
            raise error
        return found
    found, failed = probe_each([v for v in all_vendors() if v.affinity() > 0])
    for name, error in failed.items():
        logger.warning("%s discovery failed, skipped: %s", name, error)
    return found


def live_facts(root: Path = Path("/"), strict: bool = False) -> tuple[dict[str, int], HostTopology | None]:
    """This host's NodeName facts as slurmd -C reports them, and its topology (for Cores=)."""
    topology = read_topology(root, strict)
    if topology is None:
        memory = memtotal_mib(root)
        return {"cpus": os.cpu_count() or 1, **({"real_memory_mib": memory} if memory else {})}, None
    return {k: v for k in inventory.NODE_FACTS if (v := getattr(topology, k))}, topology


def slurm_facts(name: str) -> dict[str, int]:
    """The node's facts as slurmctld knows them; {} before the node joins Slurm."""
    try:
        record = show_node(name)
    except ToolError as e:
        logger.info("node %s: no facts from Slurm: %s", name, e)
        return {}
    if record is None:
        return {}
    found = {k: getattr(record, k) for k in inventory.NODE_FACTS if getattr(record, k) is not None}
    logger.info("node %s: facts from scontrol show node: %s", name, found)
    return found


def with_core_indices(device: Device, topology: HostTopology) -> Device:
    """The device's CPU affinity (OS CPU ids) as Slurm core indices."""
    if not device.cores:
        return device
    cores = topology.slurm_cores(device.cores)
    if cores is None:
        logger.warning(
            "%s device %d: CPU affinity %s is not among this host's online CPUs; Cores= left out",
            device.vendor,
            device.index,
            device.cores,
        )
    return dataclasses.replace(device, cores=cores)


def discover_node(
    catalog: Catalog,
    vendor_names: Sequence[str] = (),
    from_files: Sequence[Path] = (),
    node_name: str | None = None,
    facts: Mapping[str, int] | None = None,
    root: Path | None = None,
    model: str | None = None,
) -> NodeInventory:
    """One node's inventory. Node facts: `facts` win; else the kernel under `root`; else, for
    captures, what slurmctld knows."""
    if model is not None and not from_files:
        raise HeteroError("--model names the model of captured devices; use it with --from-file")
    found = (
        devices_from_files(vendor_names, from_files, catalog, model)
        if from_files
        else devices_live(vendor_names)
    )
    devices = [complete_device(d, catalog, v) for v, ds in found for d in ds]
    if not devices:
        raise HeteroError(
            "no accelerators found (try --vendor NAME, or --from-file with a captured tool output)"
        )
    name = this_node(node_name)
    if from_files and root is None:
        missing = [k for k in inventory.NODE_FACTS if k not in (facts or {})]
        known = slurm_facts(name) if missing and shutil.which("scontrol") else {}
    else:
        known, topology = live_facts(root or Path("/"), strict=root is not None)
        if topology is not None:
            devices = [with_core_indices(d, topology) for d in devices]
    known.update(facts or {})
    node_facts: dict[str, Any] = {key: known.get(key) for key in inventory.NODE_FACTS}
    return validated(NodeInventory(name, tuple(devices), **node_facts))


def this_node(node_name: str | None = None) -> str:
    """`node_name` (--node), else $SLURMD_NODENAME, else the short host name."""
    name = (
        node_name
        if node_name is not None
        else os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    )
    try:
        return syntax.host_name(name)
    except ValueError as e:
        raise InventoryError(f"node name: {e}; pass --node NAME as slurm.conf names the node") from None


def validated(node: NodeInventory) -> NodeInventory:
    """The node read back from its text, so discover never writes what `inventory check` refuses
    (`8.0` for 8 is refused in the text, not in the dict)."""
    text = inventory.dumps(ClusterInventory(nodes=(node,)), as_json=True)
    return inventory.loads(text, f"discovered node {node.name}", as_json=True).nodes[0]
