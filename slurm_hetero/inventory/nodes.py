"""The one record of a node as Slurm sees it (`model.SlurmNode`), and the one type resolution.

An admin's `type:` is the Slurm Type= name, kept as written; the catalog facts come from that
type's entry, else from the `model` string, so any site naming scheme works.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from slurm_hetero.core import hostlist
from slurm_hetero.core.devicespec import Catalog, DeviceSpec
from slurm_hetero.core.errors import ConfigError, InventoryError
from slurm_hetero.core.model import (
    ClusterInventory,
    Device,
    Health,
    NodeInventory,
    SlurmDevice,
    SlurmNode,
    VendorTraits,
)
from slurm_hetero.core.units import format_size
from slurm_hetero.inventory.catalog import SITE_MODELS_DIR
from slurm_hetero.slurm.syntax import feature
from slurm_hetero.vendors import vendor_traits


def lookup_spec(device: Device, catalog: Catalog) -> DeviceSpec | None:
    """The catalog facts of a device: by its type (of its vendor), else by its model."""
    spec = catalog.by_type(device.type) if device.type else None
    if spec is not None and spec.vendor == device.vendor:
        return spec
    return catalog.resolve(device.vendor, device.model)


def unknown_device(device: Device, node: str | None = None) -> InventoryError:
    """The one error for a device the catalog cannot identify."""
    where = f"node {node}: " if node else ""
    named = (
        f"neither type {device.type!r} nor model {device.model!r} is in the catalog"
        if device.type
        else f"model {device.model!r} is not in the catalog"
    )
    return InventoryError(
        f"{where}{device.vendor} device {device.index}: {named}; set `type:` to a type that "
        f"`slurm-hetero catalog` lists, or add the model to a site file in {SITE_MODELS_DIR}/"
    )


def resolve_spec(device: Device, catalog: Catalog, node: str | None = None) -> DeviceSpec:
    """`lookup_spec`, or an error; a `type:` that is a catalog type must be the device's own
    (`type: h100_sxm` on an L40S would give everyone the wrong facts)."""
    by_type = catalog.by_type(device.type) if device.type else None
    by_model = catalog.resolve(device.vendor, device.model)
    matches_type = by_type is not None and any(p.search(device.model) for p in by_type.patterns)
    if by_type is not None and (by_type.vendor != device.vendor or (by_model and not matches_type)):
        where = f"node {node}: " if node else ""
        own = f"type {by_model.type!r} (this model's) or " if by_model else ""
        raise InventoryError(
            f"{where}{device.vendor} device {device.index}: type {device.type!r} is the catalog's "
            f"{by_type.name} ({by_type.vendor}), not this {device.model!r}; use {own}a site name the "
            "catalog does not use"
        )
    spec = by_type or by_model
    if spec is None:
        raise unknown_device(device, node)
    return spec


def gres_order(devices: Sequence[Device], include_unhealthy: bool = False) -> list[Device]:
    """The devices Slurm will see on a node, in gres.conf order (unhealthy ones left out)."""
    keep = [d for d in devices if include_unhealthy or d.health == Health.OK]
    return sorted(keep, key=lambda d: (d.vendor, d.index))


def node_features(node: NodeInventory, devices: Sequence[SlurmDevice]) -> tuple[str, ...]:
    """The node's Slurm features, each once, Slurm-safe."""
    labels: dict[str, None] = {}
    done: set[tuple[object, ...]] = set()
    for slurm_device in devices:
        device = slurm_device.device
        key = (
            device.vendor,
            device.type,
            id(slurm_device.spec),
            device.links,
            device.driver_version,
            device.runtime_version,
        )
        if key in done:
            continue
        done.add(key)
        # whole GiB rounded down: `-C gpumemNg` never promises more than `--gres=gpumem:NG` finds
        memory_class = f"gpumem{slurm_device.memory_mib // 1024}g"
        labels.update(dict.fromkeys([device.vendor, device.type, memory_class]))
        labels.update(dict.fromkeys(link.kind for link in device.links))
        if device.driver_version:
            labels[f"{device.vendor}_drv{device.driver_version.split('.')[0]}"] = None
        if device.runtime_version:
            labels[f"{slurm_device.vendor.stack_prefix}{device.runtime_version}"] = None
    labels.update(dict.fromkeys(node.features))
    return tuple(dict.fromkeys(feature(x) for x in labels))


# the devices Slurm sees, those left out, and the features of one node shape
Shape = tuple[tuple[SlurmDevice, ...], tuple[Device, ...], tuple[str, ...]]


class NodeBuilder:
    """Builds `SlurmNode`s, resolving each node shape once."""

    def __init__(
        self, catalog: Catalog, traits: Mapping[str, VendorTraits], include_unhealthy: bool = False
    ) -> None:
        self.catalog, self.traits, self.include_unhealthy = catalog, traits, include_unhealthy
        self._shapes: dict[tuple[object, ...], Shape] = {}
        self._specs: dict[tuple[str, str, str], DeviceSpec] = {}
        self._type_of: dict[str, tuple[DeviceSpec, str]] = {}  # Type= -> (its facts, first node)

    def _device(self, device: Device, node: str) -> SlurmDevice:
        vendor = self.traits.get(device.vendor)
        if vendor is None:
            known = ", ".join(sorted(self.traits))
            raise InventoryError(f"node {node}: unknown vendor {device.vendor!r}; known vendors: {known}")
        spec_key = (device.vendor, device.type, device.model)
        spec = self._specs.get(spec_key)
        if spec is None:
            spec = self._specs[spec_key] = resolve_spec(device, self.catalog, node)
        typed = device if device.type else dataclasses.replace(device, type=spec.type)
        first = self._type_of.setdefault(typed.type, (spec, node))
        if first[0] is not spec:  # Slurm cannot tell two models under one Type= apart
            raise InventoryError(
                f"Type= {typed.type!r} names two device models: {first[0].name} (node {first[1]}) and "
                f"{spec.name} (node {node}); give each model its own type"
            )
        return SlurmDevice(typed, vendor, spec)

    def _shape(self, node: NodeInventory) -> Shape:
        key = (tuple(map(id, node.devices)), node.features)
        shape = self._shapes.get(key)
        if shape is None:
            kept = gres_order(node.devices, self.include_unhealthy)
            devices = tuple(self._device(d, node.name) for d in kept)
            kept_ids = set(map(id, kept))
            left_out = tuple(d for d in node.devices if id(d) not in kept_ids)
            shape = self._shapes[key] = (devices, left_out, node_features(node, devices))
        return shape

    def node(self, node: NodeInventory) -> SlurmNode:
        devices, left_out, features = self._shape(node)
        hosts = hostlist.count(node.name) if "[" in node.name else 1
        return SlurmNode(node, devices, left_out, features, hosts)


def slurm_nodes(
    inventory: ClusterInventory,
    catalog: Catalog,
    include_unhealthy: bool = False,
) -> list[SlurmNode]:
    """Every inventory node as Slurm sees it."""
    builder = NodeBuilder(catalog, vendor_traits(), include_unhealthy)
    return [builder.node(n) for n in inventory.nodes]


def with_site_types(catalog: Catalog, nodes: Sequence[SlurmNode]) -> Catalog:
    """`catalog` that also knows the site type names `nodes` use (`plan --devices a800:8`)."""
    site = {d.type: d.spec for n in nodes for d in n.devices if d.type != d.spec.type}
    return catalog.with_types(site) if site else catalog


def host_records(inventory: ClusterInventory, hosts: Sequence[str]) -> dict[str, NodeInventory]:
    """The inventory record of each host in `hosts` that has one (records may be hostlists)."""
    wanted: set[str] = set(hosts)
    found: dict[str, NodeInventory] = {}
    for node in inventory.nodes:
        for name in hostlist.expand(node.name) if "[" in node.name else [node.name]:
            if name in wanted:
                found.setdefault(name, node)
    return found


def check_shares(shares: Mapping[str, int], nodes: Sequence[SlurmNode]) -> None:
    """Each shard size names a type the nodes have and fits its smallest device (else no shard
    would be rendered, silently)."""
    smallest: dict[str, int] = {}
    for device in (d.device for n in nodes for d in n.devices):
        memory = device.memory_mib or 0
        smallest[device.type] = min(memory, smallest.get(device.type, memory))
    for gres_type, unit in sorted(shares.items()):
        where = f"shard size {gres_type}={format_size(unit)} (sharing.shard_size or --share)"
        if gres_type not in smallest:
            raise ConfigError(f"{where}: no device of type {gres_type}; types: {', '.join(sorted(smallest))}")
        if unit > smallest[gres_type]:
            raise ConfigError(
                f"{where}: larger than a {gres_type} device ({format_size(smallest[gres_type])}), so no "
                f"shard would be rendered; give at most {format_size(smallest[gres_type])}"
            )
