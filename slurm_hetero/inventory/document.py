"""Cluster inventory <-> YAML/JSON (schema-validated, versioned), and merging node inventories."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

import fastjsonschema
import orjson
import yaml

from slurm_hetero.core import hostlist
from slurm_hetero.core.errors import ConfigError, InventoryError
from slurm_hetero.core.model import ClusterInventory, Device, Health, Link, Nic, NodeInventory
from slurm_hetero.core.readfile import MAX_INVENTORY_BYTES, read_text
from slurm_hetero.inventory.check import check_device_syntax, check_hosts, check_node
from slurm_hetero.slurm import syntax

DEFAULT_INVENTORY = Path("/etc/slurm-hetero/inventory.yaml")  # where install puts it; every node reads it

try:  # the C loader: big YAML inventories
    _BaseLoader: Any = yaml.CSafeLoader
    _BaseDumper: Any = yaml.CSafeDumper
except AttributeError:  # pragma: no cover - PyYAML built without libyaml
    _BaseLoader, _BaseDumper = yaml.SafeLoader, yaml.SafeDumper

# PyYAML reads YAML 1.1 (`010` is 8, `yes` true), most other tools YAML 1.2 (`010` is 10, `yes`
# text): a plain scalar that is not text in both is refused unless both read it alike. The dumper
# quotes such strings, so `dumps` output loads back.
_STR, _AMBIGUOUS = "tag:yaml.org,2002:str", "tag:slurm-hetero,2024:ambiguous"
_FLOAT = "tag:yaml.org,2002:float"  # no inventory field takes one: refused (`cpus: 8.0`)
_CORE = (  # read alike by YAML 1.1 and 1.2
    ("tag:yaml.org,2002:null", re.compile(r"(?:~|null|Null|NULL|)\Z")),
    ("tag:yaml.org,2002:bool", re.compile(r"(?:true|True|TRUE|false|False|FALSE)\Z")),
    ("tag:yaml.org,2002:int", re.compile(r"[-+]?(?:0|[1-9][0-9]*)\Z")),
    (
        "tag:yaml.org,2002:float",
        re.compile(
            r"(?:[-+]?[0-9]+\.[0-9]*(?:[eE][-+][0-9]+)?|\.[0-9]+(?:[eE][-+][0-9]+)?"
            r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))\Z"
        ),
    ),
)
_YAML12_ONLY = re.compile(  # not text in YAML 1.2's core schema (numbers 1.1 reads as text)
    r"(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|0o[0-7]+|0x[0-9a-fA-F]+"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))\Z"
)
_KEEP_11 = {"tag:yaml.org,2002:merge"}  # `<<`: a mapping merge, read alike
_RESOLVED: dict[str, str] = {}  # plain scalar -> tag (a pure function of the text: cached)


def _strict_tag(resolver: Any, value: str) -> str:
    tag = _RESOLVED.get(value)
    if tag is not None:
        return tag
    for core_tag, pattern in _CORE:
        if pattern.match(value):
            tag = core_tag
            break
    else:
        yaml11 = yaml.resolver.Resolver.resolve(resolver, yaml.ScalarNode, value, (True, False))
        if yaml11 in _KEEP_11:
            tag = yaml11
        else:
            tag = _AMBIGUOUS if yaml11 != _STR or _YAML12_ONLY.match(value) else _STR
    if len(value) <= 64 and len(_RESOLVED) < 100_000:
        _RESOLVED[value] = tag
    return tag


class _StrictResolver:
    """`resolve` of plain scalars by `_strict_tag` (the loader's and the dumper's)."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0]:
            return _strict_tag(self, value)
        return super().resolve(kind, value, implicit)  # type: ignore[misc]


def _yaml12(text: str) -> Any:
    """What YAML 1.2's core schema reads a plain scalar as."""
    for _tag, pattern in _CORE:
        if pattern.match(text):
            return yaml.load(text, Loader=yaml.SafeLoader)
    if re.fullmatch(r"[-+]?[0-9]+", text):
        return int(text, 10)
    if re.fullmatch(r"0o[0-7]+|0x[0-9a-fA-F]+", text):
        return int(text[2:], 8 if text[1] == "o" else 16)
    if _YAML12_ONLY.match(text):
        return float(text)
    return text


def _reading(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return f"the text {value!r}"
    return f"a {type(value).__name__}"


def _plain(value: Any) -> str:
    """A reading as both versions read it (YAML 1.1 reads `1e-09`, without a point, as text)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    if isinstance(value, float) and "e" in (text := repr(value)) and "." not in text:
        return text.replace("e", ".0e")
    return _reading(value)


def _out_of_float(value: Any, text: str) -> bool:
    """A float reading that lost the number written: an overflow (inf) or an underflow (0)."""
    if not isinstance(value, float):
        return False
    mantissa = re.split(r"[eE]", text, maxsplit=1)[0]
    return not math.isfinite(value) or (value == 0 and re.search(r"[1-9]", mantissa) is not None)


def ambiguity(text: str, key: str | None = None) -> str:
    """Why a plain scalar is refused, naming both readings and what to write instead."""
    try:
        yaml11 = yaml.load(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        yaml11 = text
    yaml12 = _yaml12(text)
    where = f"{key}: " if key is not None else ""
    readings = [v for v in (yaml11, yaml12) if isinstance(v, (bool, int, float))]
    numbers = list(dict.fromkeys(_plain(v) for v in readings))
    quoted = f"'{text}'"
    if any(_out_of_float(v, text) for v in readings):  # 1e400, 1e-400: "write inf" or "write 0" misleads
        advice = f"write a number a float holds, or {quoted} for text"
    elif len(numbers) == 2:
        advice = f"write {numbers[0]} or {numbers[1]}"
    elif numbers:
        advice = f"write {numbers[0]}, or {quoted} for text"
    else:
        advice = f"write {quoted}"
    if type(yaml11) is type(yaml12) and yaml11 == yaml12:  # 0x10: alike, but not plain decimal
        return f"{where}{text} is {_reading(yaml11)} written in a form slurm-hetero does not read; {advice}"
    return (
        f"{where}{text} is ambiguous ({_reading(yaml11)} in YAML 1.1, {_reading(yaml12)} in YAML 1.2); "
        f"{advice}"
    )


class AmbiguousScalar(yaml.constructor.ConstructorError):
    """A plain scalar that YAML 1.1 and 1.2 read differently."""


class DuplicateKey(yaml.constructor.ConstructorError):
    """A key given twice in one YAML mapping; `problem_mark` is its second place."""


def _labelled(node: Any) -> Iterator[tuple[str, Any]]:
    """(`key` or `key[i]`, value node) of every value of a mapping node, sequences' items one by one."""
    for key_node, value_node in node.value:
        key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "<key>"
        items = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        for i, item in enumerate(items):
            yield (key if item is value_node else f"{key}[{i}]"), item


class StrictLoader(_StrictResolver, _BaseLoader):  # type: ignore[misc, valid-type]
    """Refuses a key given twice (YAML keeps the last one silently) and ambiguous plain scalars."""

    # tag -> why a scalar of it is refused (`text`, key label), checked in this order
    refused: ClassVar[dict[str, Callable[[str, str | None], str]]] = {_AMBIGUOUS: ambiguity}

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        for tag, why in self.refused.items():
            for label, item in _labelled(node):
                if item.tag == tag:
                    raise AmbiguousScalar(None, None, why(item.value, label), item.start_mark)
        for key_node, _ in node.value:
            if key_node.tag == _AMBIGUOUS:
                raise AmbiguousScalar(None, None, ambiguity(key_node.value), key_node.start_mark)
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.value in seen:
                    message = f"key {key_node.value!r} given twice in one mapping"
                    raise DuplicateKey(None, None, message, key_node.start_mark)
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)

    def construct_refused(self, node: Any) -> Any:
        raise AmbiguousScalar(None, None, self.refused[node.tag](node.value, None), node.start_mark)


StrictLoader.add_constructor(_AMBIGUOUS, StrictLoader.construct_refused)


MAX_YAML_DEPTH = 1000
_FLOW = re.compile(r"[\[\]{}]")
_BLOCK_PREFIX = re.compile(rf"^[ \t?:\-]{{{MAX_YAML_DEPTH},}}", re.MULTILINE)


def too_deep(text: str) -> bool:
    """Whether `text` could nest deeper than MAX_YAML_DEPTH: libyaml's C composer recurses without
    a limit and crashes the process. Quoted brackets count too."""
    depth = 0
    for m in _FLOW.finditer(text):
        depth += 1 if m.group() in "[{" else -1
        if depth > MAX_YAML_DEPTH:
            return True
    return bool(_BLOCK_PREFIX.search(text))


def strict_yaml(text: str, path: str, what: str) -> Any:
    """YAML by `StrictLoader`; ConfigError for an ambiguous scalar or deep nesting, not other YAMLErrors."""
    if too_deep(text):
        raise ConfigError(f"nested too deeply to be a {what}", path)
    try:
        return yaml.load(text, Loader=StrictLoader)
    except RecursionError:
        raise ConfigError(f"nested too deeply to be a {what}", path) from None
    except AmbiguousScalar as e:
        raise ConfigError(_refusal(e), path) from None


def _refusal(error: AmbiguousScalar) -> str:
    """A refused scalar in one line: `line N: why`."""
    return (
        f"line {error.problem_mark.line + 1}: {error.problem}" if error.problem_mark else str(error.problem)
    )


def config_yaml(text: str, path: str, what: str) -> Any:
    """`strict_yaml`, with a malformed file a ConfigError too."""
    try:
        return strict_yaml(text, path, what)
    except yaml.YAMLError as e:
        raise ConfigError(yaml_problem(e), path) from e


def not_whole(text: str, key: str | None = None) -> str:
    """Why a number with a point or an exponent is refused: Slurm's config lines take whole numbers."""
    where = f"{key}: " if key is not None else ""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    number = f"write {int(value)}" if value.is_integer() else "write a whole number"
    whole = "is not a whole number, and inventory numbers are whole"
    return f"{where}{text} {whole}: {number}, or '{text}' for text"


class _YamlLoader(StrictLoader):
    """Inventories: strict, and no number with a point or an exponent (no field takes one)."""

    refused = {_FLOAT: not_whole, **StrictLoader.refused}


_YamlLoader.add_constructor(_FLOAT, _YamlLoader.construct_refused)


def _json_float(text: str) -> Any:
    raise ValueError(not_whole(text))


class _YamlDumper(_StrictResolver, _BaseDumper):  # type: ignore[misc, valid-type]
    """Safe dumping that quotes every string the loader would not read back as text."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`'s object_pairs_hook refusing a key given twice (json keeps the last silently)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        twice = sorted({k for k, _ in pairs if sum(1 for j, _ in pairs if j == k) > 1})
        raise ValueError(f"key {twice[0]!r} given twice in one object")
    return obj


def device_to_dict(device: Device) -> dict[str, Any]:
    """A device as inventory YAML keys, in field order, with unset optional fields left out."""
    out: dict[str, Any] = {}
    for key, value in asdict(device).items():
        if value is None or value == () or value == [] or value == "":
            continue
        if key == "health":
            if value == Health.OK:
                continue
            value = str(value)
        out[key] = list(value) if key == "links" else value  # each link a mapping: peer, kind, count
    return out


NODE_FACTS = ("cpus", "sockets", "cores_per_socket", "threads_per_core", "real_memory_mib")  # as slurmd -C


def node_to_dict(node: NodeInventory) -> dict[str, Any]:
    out: dict[str, Any] = {"name": node.name}
    out.update((key, value) for key in NODE_FACTS if (value := getattr(node, key)) is not None)
    if node.features:
        out["features"] = list(node.features)
    if node.nics:
        out["nics"] = [{k: v for k, v in asdict(n).items() if v is not None} for n in node.nics]
    out["devices"] = [device_to_dict(d) for d in node.devices]
    return out


def inventory_to_dict(inventory: ClusterInventory) -> dict[str, Any]:
    return {"version": inventory.version, "nodes": [node_to_dict(n) for n in inventory.nodes]}


def shipped_schema() -> dict[str, Any]:
    """`schemas/inventory.schema.json` as shipped."""
    text = resources.files("slurm_hetero.schemas").joinpath("inventory.schema.json").read_text()
    return dict(json.loads(text))


# Device keys that differ between the devices of one node; the rest is validated once per shape.
_PER_DEVICE = ("index", "file", "uuid", "pci_bus_id", "tool_id")


@cache
def _validators() -> tuple[Callable[[Any], Any], ...]:
    """Compiled validators: the file without devices, one device, and the per-device keys."""
    schema = shipped_schema()
    outer = copy.deepcopy(schema)
    outer["definitions"]["node"]["properties"]["devices"] = {"type": "array", "items": {"type": "object"}}
    device = {
        "$schema": schema["$schema"],
        "definitions": schema["definitions"],
        "$ref": "#/definitions/device",
    }
    properties = schema["definitions"]["device"]["properties"]
    per_device = {
        "$schema": schema["$schema"],
        "type": "object",
        "required": ["index", "file"],
        "properties": {k: properties[k] for k in _PER_DEVICE},
    }
    return tuple(fastjsonschema.compile(s) for s in (outer, device, per_device))


def _schema_error(
    source: str, error: fastjsonschema.JsonSchemaValueException, prefix: str = ""
) -> InventoryError:
    path = prefix + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in error.path[1:])
    message = error.message.removeprefix(error.name or "").strip()
    return InventoryError(f"{source}: invalid inventory at {path.lstrip('.') or '<top>'}: {message}")


_IDENTITY_KEYS = ("uuid",)
_ABSENT = object()


def _device_key(raw: Mapping[str, Any]) -> bytes | None:
    """A cheap exact key of a parsed JSON/YAML device record (orjson serializes in C)."""
    try:
        return orjson.dumps(raw)
    except TypeError:  # YAML dates and other non-JSON values: validation will reject or keep them
        return None


class _DeviceInterner:
    """Validates and builds each distinct device record once (a big inventory holds few distinct
    ones); devices that differ only in their per-device keys share the validation of the rest."""

    def __init__(self, source: str, keep_identity: bool) -> None:
        self.source, self.keep_identity = source, keep_identity
        self.seen: dict[tuple[bytes, tuple[Any, ...]], Device] = {}
        self.id_keys = tuple(k for k in _PER_DEVICE if keep_identity or k not in _IDENTITY_KEYS)
        self.absent = (_ABSENT,) * len(self.id_keys)  # a missing key is not a null one
        self.shapes: dict[bytes, dict[str, Any]] = {}  # shape -> field values of a validated device

    def device(self, raw: Any, node_pos: int, device_pos: int) -> Device:
        shape = (
            _device_key({k: v for k, v in raw.items() if k not in _PER_DEVICE}) if type(raw) is dict else None
        )
        if shape is None:  # not a mapping, or values JSON cannot hold: the schema says what is wrong
            return self._validated(raw, f"nodes[{node_pos}].devices[{device_pos}]", None)
        key = (shape, tuple(map(raw.get, self.id_keys, self.absent)))
        try:
            device = self.seen.get(key)
        except TypeError:  # an unhashable per-device value: the schema says what is wrong
            return self._validated(raw, f"nodes[{node_pos}].devices[{device_pos}]", shape)
        if device is not None:
            return device
        where = f"nodes[{node_pos}].devices[{device_pos}]"
        template = self.shapes.get(shape)
        device = self._validated(raw, where, shape) if template is None else self._like(template, raw, where)
        self.seen[key] = device
        return device

    def _validated(self, raw: Any, where: str, shape: bytes | None) -> Device:
        try:
            _validators()[1](raw)
        except fastjsonschema.JsonSchemaValueException as e:
            raise _schema_error(self.source, e, where) from None
        check_device_syntax(raw, f"{self.source}: {where}")
        values = {k: v for k, v in raw.items() if self.keep_identity or k not in _IDENTITY_KEYS}
        values["links"] = tuple(Link(**link) for link in values.get("links", ()))
        if "health" in values:
            values["health"] = Health(values["health"])
        device = Device(**values)
        if shape is not None:
            self.shapes.setdefault(shape, dict(vars(device)))
        return device

    def _like(self, template: dict[str, Any], raw: dict[str, Any], where: str) -> Device:
        """A device like `template` (validated): only its per-device keys are checked."""
        per_device = {k: raw[k] for k in _PER_DEVICE if k in raw}
        try:
            _validators()[2](per_device)
            syntax.device_file(raw["file"])
        except fastjsonschema.JsonSchemaValueException as e:
            raise _schema_error(self.source, e, where) from None
        except ValueError as e:
            raise InventoryError(f"{self.source}: {where}: {e}") from None
        values = {**template, "uuid": None, "pci_bus_id": None, "tool_id": None, **per_device}
        if not self.keep_identity:
            values["uuid"] = None
        device = Device.__new__(Device)  # every field set below, all validated: skip __init__'s cost
        device.__dict__.update(values)
        return device


def inventory_from_dict(
    data: Any, source: str = "<inventory>", keep_identity: bool = True
) -> ClusterInventory:
    """Validate and convert raw data; without `keep_identity`, identical devices share one record."""
    try:
        _validators()[0](data)
    except fastjsonschema.JsonSchemaValueException as e:
        raise _schema_error(source, e) from None
    interner = _DeviceInterner(source, keep_identity)
    nodes = []
    for i, raw in enumerate(data["nodes"]):
        devices = tuple(interner.device(d, i, j) for j, d in enumerate(raw["devices"]))
        node = NodeInventory(
            name=raw["name"],
            devices=devices,
            features=tuple(raw.get("features", ())),
            nics=tuple(Nic(**n) for n in raw.get("nics", ())),
            **{key: raw.get(key) for key in NODE_FACTS},
        )
        check_node(node, source)
        nodes.append(node)
    check_hosts(nodes, source)
    return ClusterInventory(nodes=tuple(nodes), version=data["version"])


def yaml_problem(error: yaml.YAMLError) -> str:
    """A YAMLError in one line, without PyYAML's marks ("<unicode string>")."""
    mark = getattr(error, "problem_mark", None)
    context, problem = getattr(error, "context", None), getattr(error, "problem", None)
    what = " ".join(filter(None, [context, problem])) or str(error).splitlines()[0]
    if isinstance(error, yaml.reader.ReaderError):  # a byte YAML refuses: no line, its offset
        return f"malformed YAML at character {error.position + 1}: {what}"
    return (
        f"malformed YAML at line {mark.line + 1} column {mark.column + 1}: {what}"
        if mark
        else f"malformed YAML: {what}"
    )


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Parsing a big inventory builds millions of acyclic objects; the cyclic GC only slows it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# YAML inventories this package writes open with HEADER and close with FOOTER: a copy cut short
# (a full disk, an interrupted scp) parses as a smaller cluster, which nothing in YAML tells apart.
HEADER = "# slurm-hetero inventory: a copy without the closing line below was cut short\n"
FOOTER = "# end of slurm-hetero inventory\n"


def _parsed(text: str, source: str, as_json: bool, documents: bool = False) -> Any:
    """JSON, one YAML document or (`documents`) all of them; InventoryError where malformed."""
    if not as_json:
        if text.startswith(HEADER) and not text.rstrip().endswith(FOOTER.strip()):
            raise InventoryError(
                f"{source}: cut short or added to: it does not end with its closing line "
                f"{FOOTER.strip()!r}; copy it again, or write it anew (inventory merge)"
            )
        if too_deep(text):
            raise InventoryError(f"{source}: nested too deeply to be an inventory")
    try:
        if as_json:
            return json.loads(
                text, object_pairs_hook=unique_keys, parse_float=_json_float, parse_constant=_json_float
            )
        if documents:
            return list(yaml.load_all(text, Loader=_YamlLoader))
        return yaml.load(text, Loader=_YamlLoader)
    except RecursionError:
        raise InventoryError(f"{source}: nested too deeply to be an inventory") from None
    except json.JSONDecodeError as e:
        raise InventoryError(f"{source}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from e
    except ValueError as e:  # a key given twice, a number that is not whole
        raise InventoryError(f"{source}: {e}") from e
    except AmbiguousScalar as e:
        raise InventoryError(f"{source}: {_refusal(e)}") from e
    except yaml.YAMLError as e:
        raise InventoryError(f"{source}: {yaml_problem(e)}") from e


@_gc_paused()
def loads(text: str, source: str, as_json: bool = False, keep_identity: bool = True) -> ClusterInventory:
    return inventory_from_dict(_parsed(text, source, as_json), source, keep_identity)


def load(path: str | Path, keep_identity: bool = True) -> ClusterInventory:
    """Read an inventory file; JSON when its name ends in `.json`, else YAML."""
    path = Path(path)
    text = read_text(path, MAX_INVENTORY_BYTES, "inventory file", InventoryError)
    return loads(text, str(path), as_json=path.suffix.lower() == ".json", keep_identity=keep_identity)


def dumps(inventory: ClusterInventory, as_json: bool = False) -> str:
    """Serialize an inventory (stable key order: reviewable diffs)."""
    data = inventory_to_dict(inventory)
    if as_json:
        return json.dumps(data, indent=1) + "\n"
    return (
        HEADER + str(yaml.dump(data, Dumper=_YamlDumper, sort_keys=False, default_flow_style=False)) + FOOTER
    )


def load_many(path: str | Path) -> list[tuple[str, ClusterInventory]]:
    """One inventory, several YAML documents, or JSON lines (`srun ... discover --json`)."""
    path = Path(path)
    text = read_text(path, MAX_INVENTORY_BYTES, "inventory file", InventoryError)
    stripped = text.lstrip()
    if stripped.startswith("{") and "\n{" in stripped.rstrip():
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return [(f"{path}:{i}", loads(ln, f"{path}:{i}", as_json=True)) for i, ln in enumerate(lines, 1)]
    if path.suffix.lower() == ".json" or stripped.startswith("{"):
        return [(str(path), loads(text, str(path), as_json=True))]
    docs = [d for d in _parsed(text, str(path), as_json=False, documents=True) if d is not None]
    if not docs:
        raise InventoryError(f"{path}: empty inventory")
    labels = [str(path)] if len(docs) == 1 else [f"{path}[doc {i}]" for i in range(1, len(docs) + 1)]
    return [(label, inventory_from_dict(d, label)) for label, d in zip(labels, docs)]


def _shape(node: NodeInventory) -> NodeInventory:
    """The node without its name and per-unit identities (UUIDs): what identical nodes share."""
    devices = tuple(dataclasses.replace(d, uuid=None) for d in node.devices)
    return dataclasses.replace(node, name="", devices=devices)


def merge(
    inventories: Iterable[tuple[str, ClusterInventory]], fold_identical: bool = True
) -> ClusterInventory:
    """Merge node inventories (a host named twice is an error); with `fold_identical`, nodes that
    differ only in name and device UUIDs become one hostlist record."""
    seen: dict[str, str] = {}
    nodes: list[NodeInventory] = []
    for source, inventory in inventories:
        for node in inventory.nodes:
            for host in hostlist.expand(node.name):
                if host in seen:
                    raise InventoryError(
                        f"node {host} appears in {seen[host]} and in {source}; keep one record per node "
                        "(rerun discover on that node if they conflict)"
                    )
                seen[host] = source
            nodes.append(node)
    if not fold_identical:
        return ClusterInventory(nodes=tuple(nodes))
    groups: dict[NodeInventory, list[NodeInventory]] = {}
    for node in nodes:
        groups.setdefault(_shape(node), []).append(node)
    folded = (
        same[0] if len(same) == 1 else dataclasses.replace(shape, name=hostlist.fold(n.name for n in same))
        for shape, same in groups.items()
    )
    return ClusterInventory(nodes=tuple(folded))
