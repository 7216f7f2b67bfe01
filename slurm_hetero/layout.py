"""This rank's place in the training layout, as `slurm-hetero launch` planned it (for training code).

    from slurm_hetero import layout
    me = layout.current()          # reads the file named by SLURM_HETERO_LAYOUT
    me.stage, me.layer_start, me.layer_end, me.grad_weight, me.group("dp").ranks, ...

The file is JSON, version 1; its keys are the fields of `RankLayout` (the launcher manual,
`slurm_hetero.launch.run`, explains each). Unknown keys are ignored, so later versions can add
keys; a missing or mistyped key is an error naming it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from slurm_hetero.errors import HeteroError

ENV = "SLURM_HETERO_LAYOUT"
VERSION = 1


class LayoutError(HeteroError):
    """No layout for this process, or a layout file that is not version 1 of the contract."""


@dataclass(frozen=True)
class GroupSpec:
    """A process group this rank is in: tp, dp or pp; its ranks (sorted), torch backend, the
    communicator kind (vendor-ccl, rdma-direct, cpu-relay) and the network variables it needs."""

    name: str
    ranks: tuple[int, ...]
    backend: str
    comm: str
    env: Mapping[str, str]


@dataclass(frozen=True)
class RankLayout:
    """One rank's layout: a mirror of the SLURM_HETERO_LAYOUT document."""

    version: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: str
    type: str
    vendor: str
    kind: str
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
    layer_end: int
    micro_batch: int
    micro_batches: int
    samples: int
    sample_offset: int
    grad_weight: float
    recompute: int
    prev_rank: int | None
    next_rank: int | None
    groups: tuple[GroupSpec, ...]
    predicted_step_s: float
    even_step_s: float | None
    bound_step_s: float
    efficiency: float

    def group(self, name: str) -> GroupSpec:
        """The group named `name` (tp, dp or pp)."""
        for group in self.groups:
            if group.name == name:
                return group
        raise LayoutError(f"rank {self.rank} is in no {name!r} group (has {[g.name for g in self.groups]})")


_BUILTIN = {"int": int, "float": float, "str": str, "None": type(None)}


def _accepts(hint: str, value: Any) -> bool:
    """Does `value` fit the field annotation `hint` ("int", "float | None", ...)? Read from the
    annotation text, as `typing.get_type_hints` cannot evaluate `X | None` on Python 3.9."""
    options = [_BUILTIN.get(part.strip()) for part in hint.split("|")]
    for option in options:
        if option is type(None) and value is None:
            return True
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if option in (int, str) and isinstance(value, option) and not isinstance(value, bool):
            return True
    return False


def _group(raw: Any, where: str) -> GroupSpec:
    ok = (
        isinstance(raw, Mapping)
        and isinstance(raw.get("ranks"), list)
        and isinstance(raw.get("env", {}), Mapping)
    )
    if not ok or not all(isinstance(raw.get(k), str) for k in ("name", "backend", "comm")):
        raise LayoutError(f"{where}: each group needs name, ranks, backend, comm and env")
    env = {str(k): str(v) for k, v in raw.get("env", {}).items()}
    return GroupSpec(raw["name"], tuple(int(r) for r in raw["ranks"]), raw["backend"], raw["comm"], env)


def from_dict(data: Any, where: str = "layout") -> RankLayout:
    """Validate a layout document and build its `RankLayout`."""
    if not isinstance(data, Mapping):
        raise LayoutError(f"{where}: expected a JSON object")
    if data.get("version") != VERSION:
        raise LayoutError(
            f"{where}: layout version {data.get('version')!r}; this slurm-hetero reads {VERSION}"
        )
    hints = {f.name: str(f.type) for f in fields(RankLayout)}
    values: dict[str, Any] = {}
    for f in fields(RankLayout):
        if f.name not in data:
            raise LayoutError(f"{where}: missing key {f.name!r}")
        if f.name == "groups":
            if not isinstance(data["groups"], list):
                raise LayoutError(f"{where}: groups must be a list")
            values["groups"] = tuple(_group(g, where) for g in data["groups"])
        elif not _accepts(hints[f.name], data[f.name]):
            raise LayoutError(f"{where}: {f.name} must be {hints[f.name]}, got {data[f.name]!r}")
        else:
            values[f.name] = data[f.name]
    return RankLayout(**values)


def from_file(path: str | Path) -> RankLayout:
    """The layout in the JSON file at `path`."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise LayoutError(f"cannot read layout {path}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise LayoutError(f"{path}: not JSON ({e})") from e
    return from_dict(data, str(path))


def current() -> RankLayout:
    """This process's layout, from the file named by SLURM_HETERO_LAYOUT."""
    path = os.environ.get(ENV)
    if not path:
        raise LayoutError(
            f"{ENV} is not set: not started by slurm-hetero launch "
            "(run: srun slurm-hetero launch --model M ... -- python train.py)"
        )
    return from_file(path)
