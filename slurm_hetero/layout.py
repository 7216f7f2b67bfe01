"""This rank's place in the training layout: the one typed SLURM_HETERO_LAYOUT document.

`slurm-hetero launch` writes each rank's `RankLayout.to_json()` to the file SLURM_HETERO_LAYOUT
names; training code reads it back with `current()`. JSON, version 1: the keys are the fields of
`RankLayout` and, under `groups`, of `GroupSpec` (docs/launch.md explains each). Reading ignores
unknown keys, so later versions can add keys; a missing, mistyped or out-of-range key is a
`LayoutError` naming the file and the key.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from slurm_hetero.core.errors import LayoutError
from slurm_hetero.core.readfile import MiB, read_text

ENV = "SLURM_HETERO_LAYOUT"
VERSION = 1


@dataclass(frozen=True)
class GroupSpec:
    """A process group this rank is in: tp, dp, pp or dp_local; its ranks (sorted), torch backend, the
    communicator kind (vendor-ccl, rdma-direct, cpu-relay) and the network variables it needs."""

    name: str
    ranks: tuple[int, ...]
    backend: str
    comm: str
    env: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**vars(self), "ranks": list(self.ranks), "env": dict(self.env)}

    @classmethod
    def from_dict(cls, raw: Any, where: str = "layout") -> GroupSpec:
        if not isinstance(raw, Mapping) or not all(
            isinstance(raw.get(k), str) and raw[k].strip() for k in _GROUP_TEXT
        ):
            raise LayoutError(
                f"{where}: each group needs name, ranks, backend and comm (non-empty text) and env; "
                f"got {raw!r}"
            )
        ranks, env = raw.get("ranks"), raw.get("env", {})
        if not isinstance(ranks, list) or not all(_is_int(r) for r in ranks):
            raise LayoutError(
                f"{where}: group {raw['name']!r}: ranks must be a list of integers, got {ranks!r}"
            )
        if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
            raise LayoutError(f"{where}: group {raw['name']!r}: env must map names to strings, got {env!r}")
        return cls(
            raw["name"], tuple(ranks), raw["backend"], raw["comm"], {str(k): v for k, v in env.items()}
        )


_GROUP_TEXT = ("name", "backend", "comm")
GROUP_NAMES = ("tp", "pp", "dp", "dp_local")


@dataclass(frozen=True)
class RankLayout:
    """One rank's layout: what the launcher planned for it (the SLURM_HETERO_LAYOUT document)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: str
    type: str
    vendor: str
    kind: str  # pipeline | data
    model: str
    global_batch: int
    num_layers: int
    stage: int
    num_stages: int
    replica: int
    num_replicas: int
    tp_rank: int
    tp_size: int
    layer_start: int
    layer_end: int  # exclusive
    micro_batch: int
    micro_batches: int
    samples: int  # this replica's per step
    sample_offset: int
    grad_weight: float  # samples / global_batch
    recompute: int
    prev_rank: int | None
    next_rank: int | None
    groups: tuple[GroupSpec, ...]
    predicted_step_s: float
    even_step_s: float | None
    bound_step_s: float
    efficiency: float
    # the cost settings the plan was made with (older documents lack them: defaults)
    dtype: str = "bf16"
    zero_stage: int = 1
    attention: str = "flash"
    recompute_mode: str = "auto"
    version: int = VERSION

    def group(self, name: str) -> GroupSpec:
        """The group named `name` (tp, dp, pp or dp_local)."""
        for group in self.groups:
            if group.name == name:
                return group
        raise LayoutError(f"rank {self.rank} is in no {name!r} group (has {[g.name for g in self.groups]})")

    def to_dict(self, groups: bool = True) -> dict[str, Any]:
        """The JSON document, `version` first (without `groups`: for a caller listing them once)."""
        out: dict[str, Any] = {"version": self.version}
        for f in fields(self):
            if f.name == "groups" and groups:
                out["groups"] = [g.to_dict() for g in self.groups]
            elif f.name not in ("version", "groups"):
                out[f.name] = getattr(self, f.name)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, data: Any, where: str = "layout") -> RankLayout:
        if not isinstance(data, Mapping):
            raise LayoutError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if data.get("version") != VERSION:
            raise LayoutError(
                f"{where}: layout version {data.get('version')!r}; this slurm-hetero reads {VERSION}"
            )
        hints = {f.name: str(f.type) for f in fields(cls)}
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                if f.default is not MISSING:
                    continue
                raise LayoutError(f"{where}: missing key {f.name!r}")
            value = data[f.name]
            if f.name == "groups":
                if not isinstance(value, list):
                    raise LayoutError(f"{where}: groups must be a list, got {value!r}")
                values["groups"] = tuple(GroupSpec.from_dict(g, where) for g in value)
            elif not _accepts(hints[f.name], value):
                kinds = " or ".join(
                    "null" if p.strip() == "None" else p.strip() for p in hints[f.name].split("|")
                )
                raise LayoutError(f"{where}: {f.name} must be {kinds}, got {value!r}")
            else:
                values[f.name] = float(value) if hints[f.name] == "float" else value
        layout = cls(**values)
        _check_ranges(layout, where)
        return layout

    @classmethod
    def from_json(cls, text: str, where: str = "layout") -> RankLayout:
        try:
            data = json.loads(text, parse_constant=_no_constant)
        except json.JSONDecodeError as e:
            raise LayoutError(f"{where}: not JSON ({e})") from e
        except RecursionError:
            raise LayoutError(f"{where}: not a layout (nested too deeply)") from None
        except ValueError as e:  # NaN, Infinity: not JSON, though Python's json reads them
            raise LayoutError(f"{where}: {e}") from e
        return cls.from_dict(data, where)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON has")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_ACCEPTS: dict[str, Callable[[Any], bool]] = {
    "int": _is_int,
    "float": lambda value: isinstance(value, (int, float)) and not isinstance(value, bool),
    "str": lambda value: isinstance(value, str),
    "None": lambda value: value is None,
}


def _accepts(hint: str, value: Any) -> bool:
    """Does `value` fit the annotation text `hint` (`get_type_hints` cannot read `X | None` on 3.9)?"""
    return any(_ACCEPTS.get(part.strip(), lambda _: False)(value) for part in hint.split("|"))


KINDS = ("pipeline", "data")


def _check_ranges(lay: RankLayout, where: str) -> None:
    if lay.global_batch < 1:
        raise LayoutError(f"{where}: global_batch must be >= 1")
    checks = [
        (0 <= lay.rank < lay.world_size, "rank must be in [0, world_size)"),
        (0 <= lay.local_rank < lay.local_world_size, "local_rank must be in [0, local_world_size)"),
        (0 <= lay.stage < lay.num_stages, "stage must be in [0, num_stages)"),
        (0 <= lay.replica < lay.num_replicas, "replica must be in [0, num_replicas)"),
        (0 <= lay.tp_rank < lay.tp_size, "tp_rank must be in [0, tp_size)"),
        (0 <= lay.layer_start <= lay.layer_end <= lay.num_layers, "layers must lie in [0, num_layers]"),
        (
            0 <= lay.sample_offset and 0 <= lay.samples <= lay.global_batch - lay.sample_offset,
            "samples from sample_offset must lie in [0, global_batch]",
        ),
        (
            all(r is None or 0 <= r < lay.world_size for r in (lay.prev_rank, lay.next_rank)),
            "prev_rank and next_rank must be null or in [0, world_size)",
        ),
        (
            lay.micro_batch >= 1
            and (
                lay.samples == 0
                or 0 < lay.samples - lay.micro_batch * (lay.micro_batches - 1) <= lay.micro_batch
            ),
            "micro_batches of micro_batch must hold samples, only the last one short",
        ),
        (lay.kind in KINDS, f"kind must be {' or '.join(KINDS)} (the families launch runs)"),
        (0 <= lay.recompute <= lay.layer_end - lay.layer_start, "recompute must be 0 to the stage's layers"),
        (
            math.isclose(lay.grad_weight, lay.samples / lay.global_batch, rel_tol=1e-9, abs_tol=1e-12),
            f"grad_weight must be samples / global_batch ({lay.samples} / {lay.global_batch}), "
            f"got {lay.grad_weight!r}",
        ),
        (
            all(
                math.isfinite(v) and v >= 0 for v in (lay.predicted_step_s, lay.bound_step_s, lay.efficiency)
            ),
            "predicted_step_s, bound_step_s and efficiency must be finite and >= 0",
        ),
        (
            lay.even_step_s is None or (math.isfinite(lay.even_step_s) and lay.even_step_s >= 0),
            "even_step_s must be null or finite and >= 0",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise LayoutError(f"{where}: {message}")
    for group in lay.groups:
        if lay.rank not in group.ranks or not all(0 <= r < lay.world_size for r in group.ranks):
            raise LayoutError(
                f"{where}: group {group.name!r} ranks {list(group.ranks)} must include rank {lay.rank} "
                f"and lie in [0, {lay.world_size})"
            )
    if problem := _groups_problem(lay):
        raise LayoutError(f"{where}: {problem}")


def _groups_problem(lay: RankLayout) -> str | None:
    """Why this rank's groups and neighbours cannot be its place in the plan (it would wait for a
    peer, or train apart from its replicas), or None."""
    groups = {g.name: list(g.ranks) for g in lay.groups}
    if missing := [n for n in ("tp", "pp", "dp") if n not in groups]:
        return f"no {missing[0]} group: every rank is in a tp, a pp and a dp group (one rank each at least)"
    if len(groups) < len(lay.groups) or not set(groups) <= set(GROUP_NAMES):
        names = [g.name for g in lay.groups]
        return f"groups {names}: a rank is in one group of each of {', '.join(GROUP_NAMES)}"
    if odd := next((n for n, ranks in groups.items() if ranks != sorted(set(ranks))), None):
        return f"group {odd!r} ranks {groups[odd]} must be sorted, each rank once"
    tp, dp = groups["tp"], groups["dp"]
    if not set(groups.get("dp_local", dp)) <= set(dp):
        return f"dp_local group {groups['dp_local']} is not within its dp group {dp}"
    if tp.index(lay.rank) != lay.tp_rank or len(tp) != lay.tp_size:
        return f"tp_rank {lay.tp_rank} of tp_size {lay.tp_size} is not its place in its tp group {tp}"
    if lay.tp_rank == 0 and len(dp) != lay.num_replicas:
        n = lay.num_replicas
        return f"num_replicas {n} but its dp group is {dp}: the replicas would not average gradients"
    neighbours = [r for r in (lay.prev_rank, lay.next_rank) if r is not None]
    if (
        (lay.stage == 0 and lay.prev_rank is not None)
        or (lay.stage == lay.num_stages - 1 and lay.next_rank is not None)
        or not all(r != lay.rank and r in groups["pp"] for r in neighbours)
    ):
        return (
            f"stage {lay.stage} of {lay.num_stages} cannot have the neighbours prev_rank "
            f"{lay.prev_rank}, next_rank {lay.next_rank} (its pp group: {groups['pp']})"
        )
    return None


MAX_LAYOUT_BYTES = 64 * MiB  # a rank's document of 65,536 ranks: its groups' rank lists, about 2 MB


def from_file(path: str | Path) -> RankLayout:
    """The layout in the JSON file at `path` (bounded: a FIFO or /dev/zero is refused, not read)."""
    return RankLayout.from_json(read_text(path, MAX_LAYOUT_BYTES, "layout document", LayoutError), str(path))


def current(environ: Mapping[str, str] | None = None) -> RankLayout:
    """This process's layout, from the file named by SLURM_HETERO_LAYOUT (in `environ`)."""
    path = (os.environ if environ is None else environ).get(ENV)
    if not path:
        raise LayoutError(
            f"{ENV} is not set: not started by slurm-hetero launch "
            "(run: srun slurm-hetero launch --model M ... -- python train.py)"
        )
    return from_file(path)
