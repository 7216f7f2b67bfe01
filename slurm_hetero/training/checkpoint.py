"""Checkpoints that outlive the layout: `save` and `load` through `torch.distributed.checkpoint`
(DCP), keyed by global layer (``embed``, ``layers.<global index>``, ``head``; DCP reshards DTensors),
so a checkpoint one layout wrote loads into any other (stages, parallel degrees, device types).

DIR (the same on every node) holds ``step-NNNNNNNN/`` (DCP files and meta.json) and ``latest``, the
name of the last complete step: a save writes ``step-N.partial`` and renames it once every rank is
done, then replaces ``latest``, so a crash leaves the previous one named (docs/user-guide.md).
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import socket
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_hetero.core.errors import HeteroError
from slurm_hetero.core.readfile import MAX_CONFIG_BYTES, MAX_INVENTORY_BYTES, read_bytes, read_text
from slurm_hetero.core.writefile import fsync_dir, write_bytes_atomic

if TYPE_CHECKING:
    import torch

__all__ = ["ENV", "CheckpointError", "check_resume", "global_name", "load", "save"]

ENV = "SLURM_HETERO_CHECKPOINT"  # `launch --resume DIR` exports DIR to every rank

LATEST = "latest"
META = "meta.json"
_OTHER_ARCHITECTURE = ("Missing key in checkpoint state_dict", "Size mismatch between saved")  # DCP's words
MAX_LATEST_BYTES = 4 << 10  # one step name; a symlink to /dev/zero or a FIFO is refused, not read
_STEP = re.compile(r"step-[0-9]{8}")


class CheckpointError(HeteroError):
    """A checkpoint that cannot be written or read: names the directory and what to do."""


def global_name(local: str, layout: Mapping[str, Any]) -> str:
    """A stage's parameter name (``2.self_attn.q_proj.weight``) as its key (``layers.5.self_attn....``)."""
    head, _, rest = local.partition(".")
    index = int(head)
    if layout["stage"] == 0:
        if index == 0:
            return f"embed.{rest}"
        index -= 1
    blocks = layout["layer_end"] - layout["layer_start"]
    if index == blocks:
        return f"head.{rest}"
    rest = rest[len("inner.") :] if rest.startswith("inner.") else rest  # a recomputed block
    return f"layers.{layout['layer_start'] + index}.{rest}"


def _renamed(model: Mapping[str, Any], optim: Any, names: Mapping[str, str]) -> dict[str, Any]:
    """Model and optimizer (None: no optimizer) state dicts with parameter names mapped by `names`."""
    out: dict[str, Any] = {"model": {names.get(k, k): v for k, v in model.items()}}
    if optim is not None:
        for group in optim["param_groups"]:
            group["params"] = [names.get(p, p) for p in group["params"]]
        state = {names.get(k, k): v for k, v in optim["state"].items()}
        out["optim"] = {"state": state, "param_groups": optim["param_groups"]}
    return out


def _names(stage: torch.nn.Module, layout: Mapping[str, Any]) -> dict[str, str]:
    local = [n for n, _ in stage.named_parameters()] + [n for n, _ in stage.named_buffers()]
    return {n: global_name(n, layout) for n in local}


def _state(
    stage: torch.nn.Module, optimizer: torch.optim.Optimizer | None, layout: Mapping[str, Any]
) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optim = get_state_dict(stage, [optimizer] if optimizer is not None else [])
    return _renamed(model, optim if optimizer is not None else None, _names(stage, layout))


def save(
    directory: str | os.PathLike[str],
    stage: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    layout: Mapping[str, Any],
    step: int,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Save this rank's stage (and optimizer) as step `step`; every rank calls it. `extra` (the
    data position, ...) is stored as JSON in meta.json. Returns the step directory."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    root = Path(directory)
    final, partial = root / f"step-{step:08d}", root / f"step-{step:08d}.partial"
    first = not dist.is_initialized() or dist.get_rank() == 0
    if first:
        _prepare(root, partial)
    _barrier()
    try:
        dcp.save(_state(stage, optimizer, layout), storage_writer=dcp.FileSystemWriter(str(partial)))
        _barrier()
        if first:
            meta = {
                "model": layout["model"],
                "num_layers": layout["num_layers"],
                "step": step,
                "extra": extra or {},
            }
            (partial / META).write_text(json.dumps(meta), encoding="utf-8")
            fsync_dir(partial)
            if final.exists():
                shutil.rmtree(final)
            os.replace(partial, final)
            write_bytes_atomic(root / LATEST, f"{final.name}\n".encode(), replace_link=True)
    except (Exception, CheckpointException) as e:  # a full disk: OSError, torch's RuntimeError
        if first:  # the half-written step would only fill the disk further
            shutil.rmtree(partial, ignore_errors=True)
        full = getattr(e.__cause__ or e, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
        raise CheckpointError(
            f"cannot save step {step} in {root} ({_first_line(e)}); the last complete checkpoint is "
            f"kept: {'free space there' if full else 'mend that'} or give another directory"
        ) from None
    _barrier()
    return final


def _prepare(root: Path, partial: Path | None = None) -> None:
    """`root` made when missing and proved writable; a crashed save's `partial` removed."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".probe-{socket.gethostname()}-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        if partial is not None and partial.exists():
            shutil.rmtree(partial)  # a save that crashed before
    except OSError as e:  # `e.filename`: the directory, or what is in the way in it
        raise CheckpointError(
            f"cannot write checkpoints in {root} ({e.filename}: {e.strerror}); give a directory this job's "
            "user can write"
        ) from None


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def check_resume(directory: str | os.PathLike[str], num_layers: int | None) -> None:
    """What `launch --resume DIR` checks before any rank starts (no torch needed). Model names are
    not compared (`gpt2` and a path to its config are one model): `load` checks the shapes."""
    root = Path(directory)
    _prepare(root)
    if not os.path.lexists(root / LATEST):
        if (found := _newest_complete(root, None)) is not None:  # a fresh start would overwrite it
            raise CheckpointError(
                f"{root}: {LATEST} is missing but {found.name} is complete: write its name into "
                f"{root / LATEST} to resume from it, or give an empty directory to start afresh"
            )
        return  # a first run: training starts afresh and saves here
    _checked(root, num_layers, root)


def _checked(root: Path, num_layers: int | None, named: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """`root`'s latest checkpoint and its meta.json, checked before DCP opens its files (a FIFO would
    block it); errors name `named`, else the step."""
    path = latest(root)
    meta = _meta(path)
    if (problem := _files_problem(path)) is not None:
        raise CheckpointError(f"{path}: {problem}; {_earlier(root, path)}")
    if num_layers is not None and meta.get("num_layers") != num_layers:
        raise CheckpointError(
            f"{named or path} holds {meta.get('model')!r} of {meta.get('num_layers')} layers; this job's "
            f"model has {num_layers}: give the checkpoint directory of this model"
        )
    return path, meta


def latest(directory: str | os.PathLike[str]) -> Path:
    """The last complete checkpoint in `directory`, or a `CheckpointError` saying why there is none."""
    root = Path(directory)
    if not os.path.lexists(root / LATEST):
        raise CheckpointError(
            f"{root}: no checkpoint ({LATEST} is missing); resume from a directory `save` wrote"
        )
    name = read_text(root / LATEST, MAX_LATEST_BYTES, "checkpoint pointer", CheckpointError).strip()
    if not _STEP.fullmatch(name) or not (root / name / META).is_file():
        raise CheckpointError(
            f"{root}: {LATEST} names {name!r}, which is not a complete checkpoint; {_earlier(root, None)}"
        )
    return root / name


def _earlier(root: Path, bad: Path | None) -> str:
    """What to do when `latest` (or the step `bad` it names) cannot be loaded."""
    if (step := _newest_complete(root, bad)) is not None:
        return f"{step.name} is complete: write its name into {root / LATEST} to resume from it"
    return f"no complete checkpoint is left: remove {root / LATEST} to start afresh"


def _newest_complete(root: Path, bad: Path | None) -> Path | None:
    steps = sorted((p for p in root.glob("step-*") if _STEP.fullmatch(p.name) and p != bad), reverse=True)
    return next((s for s in steps if stat.S_ISREG(_mode(s / META)) and _files_problem(s) is None), None)


def _mode(path: Path) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def _files_problem(path: Path) -> str | None:
    """Why the DCP files of step directory `path` cannot be loaded, or None. Without torch (a
    launcher's environment may lack it) only .metadata's presence is checked."""
    try:
        data = read_bytes(path / ".metadata", MAX_INVENTORY_BYTES, "file", CheckpointError)
    except CheckpointError as e:
        return str(e).replace(f"{path}/", "", 1)
    if not data:
        return ".metadata is empty"
    try:
        metadata = pickle.loads(data)  # what DCP's FileSystemReader reads; torch's classes inside
    except ImportError:
        return None  # no torch here: the ranks' load checks the shards
    except Exception as e:  # a truncated pickle raises many kinds
        return f".metadata is unreadable ({_first_line(e)})"
    need: dict[str, int] = {}
    for info in getattr(metadata, "storage_data", {}).values():
        end = int(info.offset) + int(info.length)
        need[info.relative_path] = max(need.get(info.relative_path, 0), end)
    for name, size in sorted(need.items()):
        try:
            fd = os.open(path / name, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            return f"shard {name}: {e.strerror}"
        try:
            info = os.fstat(fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(info.st_mode):
            return f"shard {name} is not a regular file"
        if info.st_size < size:
            return f"shard {name} is {info.st_size} bytes, less than the {size} .metadata names"
    return None


def load(
    directory: str | os.PathLike[str],
    stage: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    layout: Mapping[str, Any],
) -> dict[str, Any]:
    """Load the last complete checkpoint of `directory` into this rank's stage (and optimizer),
    whatever layout wrote it; every rank calls it. Returns meta.json (step, extra)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path, meta = _checked(Path(directory), layout["num_layers"])
    state = _state(stage, optimizer, layout)
    # The file holds one rank's param_groups (its names, its stage): take the hyperparameters from
    # it and keep this rank's own parameter names, or a re-split stage matches none of them.
    groups = state["optim"]["param_groups"] if optimizer is not None else []
    own_params = [group.pop("params") for group in groups]
    try:
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)))
    except (Exception, CheckpointException) as e:  # many kinds on bad files (DCP's: a BaseException)
        cause = _first_line(e)
        if any(m in cause for m in _OTHER_ARCHITECTURE):  # the files are fine: earlier ones match no better
            raise CheckpointError(
                f"{path}: holds another architecture of {layout['model']!r} ({cause}); give the "
                "checkpoint directory of this model and architecture"
            ) from None
        raise CheckpointError(
            f"{path}: unreadable checkpoint ({cause}); {_earlier(path.parent, path)}"
        ) from None
    for group, params in zip(groups, own_params):
        group["params"] = params
    back = _renamed(state["model"], state.get("optim"), {v: k for k, v in _names(stage, layout).items()})
    optimizers = [optimizer] if optimizer is not None else []
    set_state_dict(stage, optimizers, model_state_dict=back["model"], optim_state_dict=back.get("optim", {}))
    return meta


def _meta(path: Path) -> dict[str, Any]:
    text = read_text(path / META, MAX_CONFIG_BYTES, f"checkpoint {META}", CheckpointError)
    try:
        meta = json.loads(text)
    except ValueError as e:
        raise CheckpointError(f"{path}: unreadable {META} ({e}); {_earlier(path.parent, path)}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: {META} is not an object; {_earlier(path.parent, path)}")
    return meta


def _first_line(error: BaseException) -> str:
    """`error`'s type and first line (for DCP's CheckpointException, the first failing rank's)."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        cause = next(iter(failures.values()))
        return _first_line(cause[0] if isinstance(cause, tuple) else cause)
    if isinstance(error, OSError) and error.strerror and error.filename is not None:
        return f"{error.filename}: {error.strerror}"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
