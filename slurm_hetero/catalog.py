"""Device facts (memory, bandwidth, throughput, links, power, price) from the bundled data file
`data/models.yaml`, extended by site files in `/etc/slurm-hetero/models.d/*.yaml` (or the
directories in `SLURM_HETERO_MODELS_DIR`, colon-separated). The only reader of those files."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from slurm_hetero.devicespec import Catalog, DeviceSpec
from slurm_hetero.errors import ConfigError

SITE_MODELS_DIR = Path("/etc/slurm-hetero/models.d")

_REQUIRED = ("type", "vendor", "name", "match", "memory_gib", "source")
_NUMERIC = (
    "memory_gib",
    "memory_bandwidth_gbs",
    "fp16_tflops",
    "bf16_tflops",
    "fp32_tflops",
    "int8_tops",
    "fp8_tflops",
    "interconnect_gbs",
    "tdp_w",
    "price_per_hour_usd",
)


def _spec_from_mapping(raw: Mapping[str, Any], path: str, position: int) -> DeviceSpec:
    key = f"models[{position}]"
    if not isinstance(raw, Mapping):
        raise ConfigError("each model must be a mapping", path, key)
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ConfigError(
            f"missing required keys: {', '.join(missing)}", path, f"{key}.{raw.get('type', '?')}"
        )
    known = set(DeviceSpec.__dataclass_fields__) - {"patterns"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"unknown keys {unknown}; valid keys: {', '.join(sorted(known))}", path, key)
    values = dict(raw)
    for name in _NUMERIC:
        if values.get(name) is not None and not isinstance(values[name], int | float):
            raise ConfigError(f"{name} must be a number, got {values[name]!r}", path, f"{key}.{name}")
    for name in ("match", "aliases", "capabilities"):
        values[name] = tuple(str(v) for v in (values.get(name) or ()))
    try:
        patterns = tuple(re.compile(p, re.IGNORECASE) for p in values["match"])
    except re.error as e:
        raise ConfigError(f"bad match pattern: {e}", path, f"{key}.match") from e
    if not re.fullmatch(r"[a-z0-9][a-z0-9_\-.]*", str(values["type"])):
        raise ConfigError(f"type {values['type']!r} must be lower case [a-z0-9_-.]", path, f"{key}.type")
    return DeviceSpec(**values, patterns=patterns)


def parse_catalog_text(text: str, path: str) -> list[DeviceSpec]:
    """Parse one models YAML document (`{version: 1, models: [...]}`)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"malformed YAML: {e}".replace("\n", " "), path) from e
    if not isinstance(data, Mapping) or not isinstance(data.get("models"), list):
        raise ConfigError("expected a mapping with a 'models' list", path)
    return [_spec_from_mapping(raw, path, i) for i, raw in enumerate(data["models"])]


def site_dirs() -> list[Path]:
    """Site model directories, in precedence order (later entries override earlier types)."""
    env = os.environ.get("SLURM_HETERO_MODELS_DIR")
    extra = [Path(p) for p in env.split(":") if p] if env else []
    return [SITE_MODELS_DIR, *extra]


@cache
def _load(dirs: tuple[Path, ...]) -> Catalog:
    bundled = resources.files("slurm_hetero.data").joinpath("models.yaml").read_text(encoding="utf-8")
    by_type = {s.type: s for s in parse_catalog_text(bundled, "slurm_hetero/data/models.yaml")}
    for directory in dirs:
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.yaml")):
            for spec in parse_catalog_text(path.read_text(encoding="utf-8"), str(path)):
                by_type[spec.type] = spec
    return Catalog(by_type.values())


def load_catalog(extra_dirs: Iterable[Path] = ()) -> Catalog:
    """The bundled catalog plus site directories plus `extra_dirs` (cached per directory set)."""
    return _load(tuple([*site_dirs(), *extra_dirs]))
