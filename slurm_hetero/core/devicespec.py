"""Device facts (one `DeviceSpec` per model) and their lookup by reported model or Slurm type. Pure:
`slurm_hetero.inventory.catalog` reads them from the bundled and site models files."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# as vendor tools print models: letters and digits first and last
_MODEL_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9 ._()/+-]{0,126}[A-Za-z0-9)])?")


@dataclass(frozen=True)
class DeviceSpec:
    """Public facts about one device model. Throughputs are dense (no sparsity), in TFLOPS/TOPS."""

    type: str
    vendor: str
    name: str
    match: tuple[str, ...]
    memory_gib: float
    source: str
    aliases: tuple[str, ...] = ()
    memory_bandwidth_gbs: float | None = None
    fp16_tflops: float | None = None
    bf16_tflops: float | None = None
    fp32_tflops: float | None = None
    int8_tops: float | None = None
    fp8_tflops: float | None = None
    interconnect: str | None = None
    interconnect_gbs: float | None = None
    tdp_w: float | None = None
    capabilities: tuple[str, ...] = ()
    price_per_hour_usd: float | None = None
    family: str | None = None
    notes: str | None = None
    compare_only: bool = False
    estimate: bool = False  # some figures are derived or third-party: `derivation` says how
    derivation: str | None = None
    patterns: tuple[re.Pattern[str], ...] = field(default=(), compare=False, repr=False)

    @property
    def memory_mib(self) -> int:
        return int(round(self.memory_gib * 1024))

    def has(self, capability: str) -> bool:
        return capability in self.capabilities


class Catalog:
    """All known device models, looked up by reported model name or by Slurm type."""

    def __init__(self, specs: Iterable[DeviceSpec]) -> None:
        self.specs: list[DeviceSpec] = list(specs)
        self._by_type = {key: spec for spec in self.specs for key in (spec.type, *spec.aliases)}

    def resolve(self, vendor: str, model: str) -> DeviceSpec | None:
        """The most specific entry of `vendor` whose pattern matches `model` (longest match wins)."""
        best: tuple[int, DeviceSpec] | None = None
        for spec in self.specs:
            if spec.vendor != vendor:
                continue
            for pattern in spec.patterns:
                m = pattern.search(model)
                if m and (best is None or len(pattern.pattern) > best[0]):
                    best = (len(pattern.pattern), spec)
        return best[1] if best else None

    def named_model(self, vendor: str, model: str) -> DeviceSpec | None:
        """The entry an admin's model name (`--model`) names: one of its patterns matching whole
        words (`XK100_AI` names no K100_AI), and no other model's beside them (`L4 L40S` names two)."""
        if not _MODEL_NAME.fullmatch(model):
            return None
        spans = [
            (m.start(), m.end(), spec)
            for spec in self.specs
            if spec.vendor == vendor
            for p in spec.patterns
            if (m := re.search(rf"(?<!\w)(?:{p.pattern})(?!\w)", model, re.IGNORECASE))
        ]
        chosen = self.resolve(vendor, model)
        named = [(start, end) for start, end, spec in spans if spec is chosen]
        if not named:
            return None
        start, end = min(s for s, _ in named), max(e for _, e in named)
        return None if any(e <= start or s >= end for s, e, _ in spans) else chosen

    def by_type(self, gres_type: str) -> DeviceSpec | None:
        """The entry whose Slurm type (or alias) is `gres_type`."""
        return self._by_type.get(gres_type)

    def with_types(self, site_types: Mapping[str, DeviceSpec]) -> Catalog:
        """This catalog plus site type names, each with the facts of the model it stands for."""
        extra = [dataclasses.replace(spec, type=name, aliases=()) for name, spec in site_types.items()]
        return Catalog([*self.specs, *extra])

    def types(self) -> list[str]:
        return [s.type for s in self.specs]

    def named(self, name: str) -> list[DeviceSpec]:
        """What a name means: the entry of that type or alias, else every entry of that family
        (`ascend910b`: its SKUs), in catalog order."""
        spec = self.by_type(name)
        return [spec] if spec is not None else [s for s in self.specs if s.family == name]
