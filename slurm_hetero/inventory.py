"""Cluster inventory <-> YAML/JSON (schema-validated, versioned), and merging node inventories.
The only module that reads or writes inventory files."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, fields
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from slurm_hetero import hostlist
from slurm_hetero.errors import InventoryError
from slurm_hetero.model import ClusterInventory, Device, Health, Link, Nic, NodeInventory

try:  # the C loader is ~3x faster on big YAML inventories
    _YamlLoader: Any = yaml.CSafeLoader
    _YamlDumper: Any = yaml.CSafeDumper
except AttributeError:  # pragma: no cover - PyYAML built without libyaml
    _YamlLoader, _YamlDumper = yaml.SafeLoader, yaml.SafeDumper

_DEVICE_ORDER = [f.name for f in fields(Device)]


def device_to_dict(device: Device) -> dict[str, Any]:
    """A device as inventory YAML keys, in a stable order, with unset optional fields left out."""
    raw = asdict(device)
    out: dict[str, Any] = {}
    for key in _DEVICE_ORDER:
        value = raw[key]
        if value is None or value == () or value == [] or value == "":
            continue
        if key == "health":
            if device.health == Health.OK:
                continue
            value = str(value)
        if key == "links":
            value = [{"peer": link["peer"], "kind": link["kind"], "count": link["count"]} for link in value]
        out[key] = value
    return out


def device_from_dict(raw: Mapping[str, Any]) -> Device:
    """The inverse of `device_to_dict` (input already schema-validated)."""
    values = dict(raw)
    values["links"] = tuple(Link(**link) for link in values.get("links", ()))
    if "health" in values:
        values["health"] = Health(values["health"])
    return Device(**values)


def node_to_dict(node: NodeInventory) -> dict[str, Any]:
    out: dict[str, Any] = {"name": node.name}
    for key in ("cpus", "sockets", "cores_per_socket", "threads_per_core", "real_memory_mib"):
        if getattr(node, key) is not None:
            out[key] = getattr(node, key)
    if node.features:
        out["features"] = list(node.features)
    if node.nics:
        out["nics"] = [{k: v for k, v in asdict(n).items() if v is not None} for n in node.nics]
    out["devices"] = [device_to_dict(d) for d in node.devices]
    return out


def node_from_dict(raw: Mapping[str, Any]) -> NodeInventory:
    values = dict(raw)
    values["devices"] = tuple(device_from_dict(d) for d in values.get("devices", ()))
    values["features"] = tuple(values.get("features", ()))
    values["nics"] = tuple(Nic(**n) for n in values.get("nics", ()))
    return NodeInventory(**values)


def inventory_to_dict(inventory: ClusterInventory) -> dict[str, Any]:
    return {"version": inventory.version, "nodes": [node_to_dict(n) for n in inventory.nodes]}


@cache
def _schema() -> dict[str, Any]:
    text = resources.files("slurm_hetero.schemas").joinpath("inventory.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


def _error_path(error: jsonschema.ValidationError) -> str:
    parts = []
    for p in error.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else f".{p}")
    return "".join(parts).lstrip(".") or "<top>"


def validate(data: Any, source: str) -> None:
    """Check raw inventory data against the shipped JSON Schema; InventoryError names the path."""
    validator = jsonschema.Draft202012Validator(_schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        raise InventoryError(f"{source}: invalid inventory at {_error_path(error)}: {error.message}")


def inventory_from_dict(data: Any, source: str = "<inventory>") -> ClusterInventory:
    """Validate and convert raw data; device indexes must be unique per node."""
    validate(data, source)
    nodes = tuple(node_from_dict(n) for n in data["nodes"])
    for node in nodes:
        indexes = [d.index for d in node.devices]
        if len(set(indexes)) != len(indexes):
            raise InventoryError(f"{source}: node {node.name}: duplicate device index in {sorted(indexes)}")
    return ClusterInventory(nodes=nodes, version=data["version"])


def loads(text: str, source: str, as_json: bool = False) -> ClusterInventory:
    """Parse inventory text (YAML, or JSON when `as_json`)."""
    try:
        data = json.loads(text) if as_json else yaml.load(text, Loader=_YamlLoader)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        kind = "JSON" if as_json else "YAML"
        raise InventoryError(f"{source}: malformed {kind}: {str(e).splitlines()[0]}") from e
    return inventory_from_dict(data, source)


def load(path: str | Path) -> ClusterInventory:
    """Read an inventory file; JSON when its name ends in `.json`, else YAML."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(f"{path}: no such inventory file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InventoryError(f"{path}: cannot read inventory: {e}") from e
    return loads(text, str(path), as_json=path.suffix.lower() == ".json")


def dumps(inventory: ClusterInventory, as_json: bool = False) -> str:
    """Serialize an inventory (stable key order, for reviewable diffs)."""
    data = inventory_to_dict(inventory)
    if as_json:
        return json.dumps(data, indent=1) + "\n"
    return str(yaml.dump(data, Dumper=_YamlDumper, sort_keys=False, default_flow_style=False))


def dump_devices(devices: Iterable[Device]) -> str:
    """Devices as a YAML list (golden files of parser tests)."""
    return str(yaml.dump([device_to_dict(d) for d in devices], Dumper=_YamlDumper, sort_keys=False))
