"""Device facts (memory, bandwidth, throughput, links, power, price) from the bundled data file
`data/models.yaml`, extended by site files in `/etc/slurm-hetero/models.d/*.yaml` (or the
directories in `SLURM_HETERO_MODELS_DIR`, colon-separated). The only reader of those files."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from slurm_hetero.core.devicespec import Catalog, DeviceSpec
from slurm_hetero.core.errors import ConfigError
from slurm_hetero.core.readfile import MAX_CONFIG_BYTES, read_text
from slurm_hetero.inventory.document import config_yaml

SITE_MODELS_DIR = Path("/etc/slurm-hetero/models.d")

_REQUIRED = ("type", "vendor", "name", "match", "memory_gib", "source")
_NUMERIC = tuple(f.name for f in dataclasses.fields(DeviceSpec) if f.type in ("float", "float | None"))
Raw = Mapping[str, Any]


def _check_keys(raw: Raw, path: str, key: str) -> None:
    if missing := [k for k in _REQUIRED if k not in raw]:
        where = f"{key}.{raw.get('type', '?')}"
        raise ConfigError(f"missing required keys: {', '.join(missing)}", path, where)
    known = set(DeviceSpec.__dataclass_fields__) - {"patterns"}
    if unknown := sorted(set(raw) - known):
        raise ConfigError(f"unknown keys {unknown}; valid keys: {', '.join(sorted(known))}", path, key)
    if raw.get("estimate") and not raw.get("derivation"):
        raise ConfigError("estimate: true needs a `derivation` saying how the figures were got", path, key)


def _spec_from_mapping(raw: Raw, path: str, key: str) -> DeviceSpec:
    values = dict(raw)
    for name in _NUMERIC:
        value = values.get(name)
        if value is None:
            continue
        number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        if not number or value < 0 or (name == "memory_gib" and value == 0):
            least = "> 0" if name == "memory_gib" else ">= 0"
            raise ConfigError(f"{name} must be a finite number {least}, got {value!r}", path, f"{key}.{name}")
    for name in ("match", "aliases", "capabilities"):
        values[name] = tuple(str(v) for v in (values.get(name) or ()))
    try:
        patterns = tuple(re.compile(p, re.IGNORECASE) for p in values["match"])
    except re.error as e:
        raise ConfigError(f"bad match pattern: {e}", path, f"{key}.match") from e
    if not re.fullmatch(r"[a-z0-9][a-z0-9_\-.]*", str(values["type"])):
        raise ConfigError(f"type {values['type']!r} must be lower case [a-z0-9_-.]", path, f"{key}.type")
    return DeviceSpec(**values, patterns=patterns)


def _raw_models(text: str, path: str) -> list[Raw]:
    data = config_yaml(text, path, "models file")
    if not isinstance(data, Mapping) or not isinstance(data.get("models"), list):
        raise ConfigError("expected a mapping with a 'models' list", path)
    for i, raw in enumerate(data["models"]):
        if not isinstance(raw, Mapping) or "type" not in raw:
            raise ConfigError("each model must be a mapping with a `type`", path, f"models[{i}]")
    return list(data["models"])


def parse_catalog_text(text: str, path: str) -> list[DeviceSpec]:
    """Parse one complete models YAML document (`{version: 1, models: [...]}`), as the bundled one."""
    specs = []
    for i, raw in enumerate(_raw_models(text, path)):
        _check_keys(raw, path, f"models[{i}]")
        specs.append(_spec_from_mapping(raw, path, f"models[{i}]"))
    return specs


def merge_site_text(base: dict[str, Raw], text: str, path: str) -> None:
    """Apply one site file onto `base` (raw entries by type): an entry naming a known type or alias
    overrides only the keys it gives; a new type needs vendor, name, match and memory_gib."""
    aliases = {a: t for t, raw in base.items() for a in raw.get("aliases") or ()}
    for i, raw in enumerate(_raw_models(text, path)):
        key = f"models[{i}]"
        known = aliases.get(str(raw["type"]), str(raw["type"]))
        if known in base:
            merged = {**base[known], **raw, "type": known}
        else:
            merged = {"source": f"site file {path}", **raw}
        _check_keys(merged, path, key)
        _spec_from_mapping(merged, path, key)  # fail on this file, not later
        base[known] = merged


@cache
def _load(dirs: tuple[Path, ...]) -> Catalog:
    bundled = resources.files("slurm_hetero.data").joinpath("models.yaml").read_text(encoding="utf-8")
    name = "slurm_hetero/data/models.yaml"
    parse_catalog_text(bundled, name)  # the bundled file is complete on its own
    by_type: dict[str, Raw] = {str(raw["type"]): raw for raw in _raw_models(bundled, name)}
    for directory in dirs:
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.yaml")):
            text = read_text(path, MAX_CONFIG_BYTES, "site catalog file", ConfigError)  # bounded, regular
            merge_site_text(by_type, text, str(path))
    return Catalog(_spec_from_mapping(raw, name, raw["type"]) for raw in by_type.values())


def load_catalog(extra_dirs: Iterable[Path] = ()) -> Catalog:
    """The bundled catalog, then site directories and `extra_dirs`, each overriding the earlier (cached)."""
    env = os.environ.get("SLURM_HETERO_MODELS_DIR", "")
    return _load(tuple([SITE_MODELS_DIR, *(Path(p) for p in env.split(":") if p), *extra_dirs]))
