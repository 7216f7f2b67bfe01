"""The training runtime for a layout that `slurm-hetero launch` wrote, on torch's own libraries
(imported inside functions, so the package imports without torch). A training script calls
`init`, `stage_modules`, `parallelize`, then per step `Pipeline.step` on its replica's slice of the
batch (`sample_offset`, `samples`) and `weighted_allreduce_grads`; `examples/train_uneven.py` is a
complete one. Every helper takes the layout as a `RankLayout` (`slurm_hetero.layout.current()`), a
mapping of its keys or an object of its attributes.

- A model is ``Sequential(embed, *blocks, head)``; the layout's `num_layers` counts the blocks.
- A replica's loss is the mean over its own samples; weighting each replica's gradient by
  ``grad_weight = samples / global_batch`` makes the sum the global batch's mean gradient
  whatever the split (an unweighted average is not).
- A group runs on the layout's backend where every member has it, else on gloo (logged, and kept
  in `Distributed.fallbacks`); the default group is gloo (a mixed job shares no device backend).
"""

from __future__ import annotations

import atexit
import datetime
import importlib
import itertools
import logging
import math
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slurm_hetero.engine.layout import even_bounds
from slurm_hetero.layout import LayoutError, RankLayout, current
from slurm_hetero.slurm import syntax

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

__all__ = [
    "Distributed",
    "HierarchicalGroup",
    "Loss",
    "Pipeline",
    "as_dict",
    "backend_unavailable_reason",
    "even_split",
    "global_loss",
    "init",
    "micro_batch_sizes",
    "parallelize",
    "rank_layout",
    "stage_modules",
    "weighted_allreduce_grads",
]

logger = logging.getLogger(__name__)

GroupKey = tuple[str, tuple[int, ...], str]


# -- the layout --------------------------------------------------------------------------------


def as_dict(layout: Any) -> dict[str, Any]:
    if isinstance(layout, RankLayout):
        return layout.to_dict()
    if isinstance(layout, Mapping):
        return dict(layout)
    return dict(vars(layout))


def grad_weight(layout: Any) -> float:
    """The layout's gradient weight, checked: a NaN or negative one would poison every gradient."""
    value = as_dict(layout).get("grad_weight")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1:
        return float(value)  # nan and infinities fail the comparison
    raise LayoutError(f"grad_weight must be a number in [0, 1] (samples / global_batch), got {value!r}")


def _groups(layout: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [as_dict(g) for g in layout["groups"]]


def even_split(layout: Any) -> dict[str, Any]:
    """The same ranks and groups split evenly: what the plan's `even_step_s` times."""
    lay = as_dict(layout)
    bounds = even_bounds(lay["num_layers"], lay["num_stages"])
    q, r = divmod(lay["global_batch"], lay["num_replicas"])
    replica = lay["replica"]
    samples = q + (replica < r)
    lay.update(
        layer_start=bounds[lay["stage"]],
        layer_end=bounds[lay["stage"] + 1],
        samples=samples,
        sample_offset=replica * q + min(replica, r),
        grad_weight=samples / lay["global_batch"],
        micro_batches=-(-samples // lay["micro_batch"]),
        recompute=0,
    )
    return lay


# -- backends and process groups ---------------------------------------------------------------


def backend_unavailable_reason(backend: str, vendor: str | None = None) -> str | None:
    """Why `backend` cannot run on this machine for a rank of `vendor`, or None."""
    import torch
    import torch.distributed as dist

    from slurm_hetero.vendors import vendor_traits

    every = vendor_traits()
    traits = every.get(vendor or "")
    plugin, failure = traits.torch_package if traits else None, None
    try:  # the vendor's torch plugin registers its backend and device
        if plugin:
            importlib.import_module(plugin)
    except Exception as e:  # reported, not fatal
        failure = f"import {plugin}: {e}"
    if not dist.is_backend_available(backend):
        return f"this torch has no {backend!r} backend{f' ({failure})' if failure else ''}"
    ours = {t.torch_device for t in every.values() if t.torch_backend == backend}
    devices = [] if backend == "gloo" else sorted(ours)
    ready = [getattr(getattr(torch, d, None), "is_available", None) for d in devices]
    if devices and not any(callable(f) and f() for f in ready):
        return f"no {'/'.join(devices)} device is available to torch"
    return None


@dataclass
class Distributed:
    """What `init` set up: this rank's layout and its process groups by name (None: one rank)."""

    layout: dict[str, Any]
    groups: dict[str, ProcessGroup | None] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)  # group -> why it runs on gloo
    hierarchical: HierarchicalGroup | None = None  # the dp group's, when it spans vendors

    def group(self, name: str) -> ProcessGroup | None:
        return self.groups.get(name)

    def gradient_group(self) -> ProcessGroup | HierarchicalGroup | None:
        """What `weighted_allreduce_grads` reduces over."""
        return self.hierarchical or self.group("dp")


@dataclass(frozen=True)
class Piece:
    """A stretch of the padded gradient, in units of ``1 / unit`` of it; `group` joins its owners,
    one rank per vendor (None where this rank is not one)."""

    start: int
    end: int
    owners: tuple[int, ...]
    group: ProcessGroup | None = None


@dataclass(frozen=True)
class HierarchicalGroup:
    """This rank's side of a data-parallel group that spans vendors: reduce-scatter inside the
    vendor (`local`), all-reduce each piece among its owners across vendors (the slow path carries
    one shard), all-gather inside the vendor. Padding to a multiple of `unit` (the lcm of the
    vendors' sizes) fixes every piece's owners before the tensor is known."""

    local: ProcessGroup | None
    local_ranks: tuple[int, ...]
    index: int
    unit: int
    pieces: tuple[Piece, ...]


def _fallback_reason(key: GroupKey, gathered: Sequence[tuple[Any, ...]]) -> str | None:
    """Why a group cannot use its backend (the first member that lacks it), or None."""
    _name, ranks, backend = key
    return next((f"rank {r}: {gathered[r][1][backend]}" for r in ranks if gathered[r][1].get(backend)), None)


def init(layout: Any = None, timeout: float = 600.0) -> Distributed:
    """Start torch.distributed (gloo default group, env:// rendezvous) and make every layout group;
    `layout` defaults to `slurm_hetero.layout.current()`. One all-gather shares every rank's groups
    (new_group needs all ranks, in one order) and document, so a bad one stops every rank alike."""
    import torch.distributed as dist

    lay: dict[str, Any] | None
    problem: str | None
    try:
        lay, problem = rank_layout(layout).to_dict(), None
    except LayoutError as e:
        lay, problem = None, str(e)
    rank, world = _rendezvous(lay, problem)
    if lay is not None and lay["world_size"] != world:
        problem = f"world_size {lay['world_size']} but WORLD_SIZE is {world}"
    wait = datetime.timedelta(seconds=timeout)
    _use_libuv_if_built()
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=wait)
    # left to the interpreter's teardown, gloo's threads may abort the finished rank (SIGABRT)
    atexit.register(_destroy_groups)
    claims = _claims(lay) if lay is not None and problem is None else None
    available = (
        {b: backend_unavailable_reason(b, claims["vendor"]) for *_, b in claims["groups"]} if claims else {}
    )
    shared = claims if claims is not None else f"rank {rank}: {problem}"
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (shared, available, os.environ.get("SLURM_HETERO_PLAN_ID")))
    if len({g[2] for g in gathered}) > 1:
        plans = {r: g[2] for r, g in enumerate(gathered)}
        raise LayoutError(f"ranks run different plans (SLURM_HETERO_PLAN_ID by rank: {plans})")
    check_agreement([g[0] for g in gathered])
    assert lay is not None  # check_agreement refused every problem
    out = Distributed(lay)
    keys = sorted({key for claims, *_ in gathered for key in claims["groups"]})
    for key in keys:
        _make_group(out, key, _fallback_reason(key, gathered), rank, wait)
    for dp, parts in _spanning_groups(keys):
        _make_hierarchy(out, dp, parts, gathered, wait)
    return out


def _claims(lay: Mapping[str, Any]) -> dict[str, Any]:
    """What the other ranks check of this rank's document."""
    groups = [(g["name"], tuple(sorted(g["ranks"])), g["backend"]) for g in _groups(lay)]
    return {**{k: lay[k] for k in CLAIMED_KEYS}, "groups": sorted(groups)}


# What all ranks, adjacent stages, dp and tp groups say alike: a rank that disagrees would wait
# forever for a transfer or collective its peers never make.
SHARED_KEYS = ("kind", "model", "global_batch", "num_layers", "world_size", "num_replicas", "num_stages")
PEER_KEYS = ("replica", "tp_rank", "samples", "sample_offset", "micro_batch", "micro_batches")
DP_KEYS = ("stage", "layer_start", "layer_end")  # the replicas of a stage average the same parameters
TP_KEYS = tuple("replica stage tp_size layer_start layer_end samples micro_batch micro_batches".split())
CLAIMED_KEYS = (*SHARED_KEYS, *PEER_KEYS, *TP_KEYS, "rank", "prev_rank", "next_rank", "vendor")


def check_agreement(claims: Sequence[Mapping[str, Any] | str]) -> None:
    """The ranks' documents (`claims[r]`: rank r's `_claims`, or why it has none) fit together,
    else a LayoutError naming the first disagreement (every rank reaches the same verdict)."""
    if problems := [c for c in claims if isinstance(c, str)]:
        raise LayoutError(problems[0])
    docs = [c for c in claims if not isinstance(c, str)]
    first = docs[0]
    for c in docs:
        if differing := [k for k in SHARED_KEYS if c[k] != first[k]]:
            key = differing[0]
            raise LayoutError(f"rank {c['rank']}: {key} {c[key]!r} but rank 0's is {first[key]!r}")
    if (stages := sorted({c["stage"] for c in docs})) != list(range(first["num_stages"])):
        raise LayoutError(f"the ranks hold stages {stages} of num_stages {first['num_stages']}")
    for c in docs:
        for name, ranks, backend in c["groups"]:
            for m in ranks:
                if (name, ranks, backend) not in docs[m]["groups"]:
                    theirs = [(g[1], g[2]) for g in docs[m]["groups"] if g[0] == name]
                    raise LayoutError(
                        f"rank {c['rank']}'s {name} group is {list(ranks)} ({backend}); rank {m}'s: "
                        f"{', '.join(f'{list(r)} ({b})' for r, b in theirs) or 'none'}"
                    )
            alike = {"tp": TP_KEYS, "dp": DP_KEYS}.get(name, ())
            if differing := [k for k in alike if any(docs[m][k] != c[k] for m in ranks)]:
                raise LayoutError(f"the {name} group {list(ranks)} differs in {differing[0]}")
    sends = {(c["rank"], c["next_rank"]) for c in docs if c["next_rank"] is not None}
    receives = {(c["prev_rank"], c["rank"]) for c in docs if c["prev_rank"] is not None}
    if sends != receives:
        a, b = min(sends ^ receives)
        raise LayoutError(f"rank {a} and rank {b} disagree on being adjacent stages (next_rank/prev_rank)")
    for a, b in sorted(sends):
        if differing := [k for k in PEER_KEYS if docs[a][k] != docs[b][k]]:
            raise LayoutError(f"ranks {a} and {b}, adjacent stages, differ in {differing[0]}")
        if (docs[b]["stage"], docs[b]["layer_start"]) != (docs[a]["stage"] + 1, docs[a]["layer_end"]):
            raise LayoutError(
                f"rank {a} (stage {docs[a]['stage']}, layers to {docs[a]['layer_end']}) names rank {b} "
                f"(stage {docs[b]['stage']}, layers from {docs[b]['layer_start']}) as its next stage"
            )
    last = first["num_stages"] - 1
    for c in docs:
        if (c["stage"] == 0 and c["layer_start"] != 0) or (
            c["stage"] == last and c["layer_end"] != first["num_layers"]
        ):
            raise LayoutError(
                f"rank {c['rank']}: stage {c['stage']} holds layers {c['layer_start']}-{c['layer_end']}, "
                f"but the first stage starts at 0 and the last ends at num_layers {first['num_layers']}"
            )
    heads = [c for c in docs if c["stage"] == 0 and c["tp_rank"] == 0]  # one per replica
    replicas = sorted(c["replica"] for c in heads)
    if replicas != list(range(first["num_replicas"])):
        raise LayoutError(
            f"the first stage holds replicas {replicas} of num_replicas {first['num_replicas']}"
        )
    shares = sorted((c["sample_offset"], c["samples"]) for c in heads)
    offsets = list(itertools.accumulate([0, *(n for _, n in shares[:-1])]))
    if [o for o, _ in shares] != offsets or sum(n for _, n in shares) != first["global_batch"]:
        raise LayoutError(
            f"the replicas' (sample_offset, samples) {shares} do not cover the global batch once"
        )


def _use_libuv_if_built() -> None:
    """USE_LIBUV=0 (unless set) where torch lacks libuv, which torch >= 2.4's TCPStore asks for."""
    import torch.distributed as dist

    if "USE_LIBUV" in os.environ:
        return
    try:
        probe = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
    except TypeError:
        return  # a torch before use_libuv: no libuv to ask for
    except RuntimeError as e:
        if "libuv" in str(e):
            os.environ["USE_LIBUV"] = "0"
        return
    del probe


def _destroy_groups() -> None:
    """At exit: freed by the interpreter's teardown, gloo's threads may need the GIL it no longer
    gives (pytorch#190489)."""
    import gc

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def _spanning_groups(keys: Sequence[GroupKey]) -> list[tuple[GroupKey, list[tuple[int, ...]]]]:
    """Each dp group that its `dp_local` groups split into two or more parts, with the parts."""
    local = [ranks for name, ranks, _ in keys if name == "dp_local"]
    out = []
    for key in keys:
        if key[0] == "dp":
            parts = sorted(r for r in local if set(r) <= set(key[1]))
            if len(parts) > 1 and sorted(itertools.chain(*parts)) == list(key[1]):
                out.append((key, parts))
    return out


def shard_pieces(sizes: Sequence[int]) -> tuple[int, list[tuple[int, int, tuple[int, ...]]]]:
    """`unit` (the lcm of `sizes`) and the pieces (start, end, owner index in each group), in units
    of ``1 / unit`` of the gradient, that groups of `sizes` ranks reduce-scatter into equal shards."""
    unit = math.lcm(*sizes)
    edges = sorted({i * unit // n for n in sizes for i in range(n + 1)})
    return unit, [(a, b, tuple(a * n // unit for n in sizes)) for a, b in zip(edges, edges[1:])]


def _make_hierarchy(
    out: Distributed,
    dp: GroupKey,
    parts: Sequence[tuple[int, ...]],
    gathered: Sequence[tuple[Any, ...]],
    wait: datetime.timedelta,
) -> None:
    """The owners' groups of a dp group that spans vendors and, on its members, its `HierarchicalGroup`."""
    import torch.distributed as dist

    rank = out.layout["rank"]
    unit, spans = shard_pieces([len(p) for p in parts])
    pieces = []
    for start, end, index in spans:
        owners = tuple(p[i] for p, i in zip(parts, index))
        backend = "gloo" if _fallback_reason(("dp", owners, dp[2]), gathered) else dp[2]
        group = dist.new_group(list(owners), timeout=wait, backend=backend)
        pieces.append(Piece(start, end, owners, group if rank in owners else None))
    mine = next((p for p in parts if rank in p), None)
    if mine is not None:
        local = out.groups.get("dp_local")
        out.hierarchical = HierarchicalGroup(local, mine, mine.index(rank), unit, tuple(pieces))


def rank_layout(layout: Any = None) -> RankLayout:
    """`layout` as a validated `RankLayout` (a `LayoutError` names what is wrong); None: `current()`."""
    if layout is None:
        return current()
    return RankLayout.from_dict(as_dict(layout), "the layout passed to init")


def _rendezvous(lay: Mapping[str, Any] | None, problem: str | None) -> tuple[int, int]:
    """This process's (RANK, WORLD_SIZE), else the document's; a LayoutError before torch would wait
    on a rendezvous that cannot happen."""
    env = os.environ
    if lay is None:
        if "RANK" not in env or "WORLD_SIZE" not in env:  # no rank to meet the others as
            raise LayoutError(str(problem))
        given = (env["RANK"], env["WORLD_SIZE"])
    else:
        given = (env.get("RANK", str(lay["rank"])), env.get("WORLD_SIZE", str(lay["world_size"])))
    port = env.get("MASTER_PORT", "")
    if not env.get("MASTER_ADDR") or not (port.isdigit() and 0 < int(port) < 65536):
        raise LayoutError(
            f"MASTER_ADDR/MASTER_PORT {env.get('MASTER_ADDR')}/{port or None} name no rendezvous; "
            "start the ranks with slurm-hetero launch"
        )
    try:  # torch would retry a name that does not resolve until its timeout
        socket.getaddrinfo(env["MASTER_ADDR"], int(port), type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise LayoutError(
            f"MASTER_ADDR {syntax.text(env['MASTER_ADDR'])} does not resolve ({e}); "
            "start the ranks with slurm-hetero launch"
        ) from None
    if not all(v.isdigit() for v in given) or int(given[0]) >= int(given[1]):
        raise LayoutError(
            f"RANK/WORLD_SIZE {given[0]}/{given[1]} name no rank; start the ranks with slurm-hetero launch"
        )
    if lay is not None and given[0] != str(lay["rank"]):
        raise LayoutError(
            f"RANK/WORLD_SIZE {given[0]}/{given[1]} disagree with the layout's rank {lay['rank']}; "
            "start the ranks with slurm-hetero launch"
        )
    return int(given[0]), int(given[1])


def _make_group(
    out: Distributed, key: GroupKey, reason: str | None, rank: int, wait: datetime.timedelta
) -> None:
    """Create one group (not one of one rank); every rank calls this for every group, in one order."""
    import torch.distributed as dist

    name, ranks, chosen = key
    backend, member = "gloo" if reason else chosen, rank in ranks
    if member and reason:
        logger.warning("group %s %s: %s unavailable (%s); using gloo", name, list(ranks), chosen, reason)
    group = dist.new_group(list(ranks), timeout=wait, backend=backend) if len(ranks) > 1 else None
    if member:
        out.groups[name] = group
        if reason:
            out.fallbacks[name] = reason


# -- the model's stage -------------------------------------------------------------------------


def stage_modules(
    sequential: torch.nn.Sequential, layout: Any, recompute: bool = True
) -> torch.nn.Sequential:
    """This rank's slice of ``Sequential(embed, *blocks, head)``: blocks ``[layer_start, layer_end)``,
    the embedding on stage 0, the head on the last stage, sharing the model's modules; with
    `recompute`, the first `recompute` blocks keep only their input and recompute in backward."""
    import torch

    lay = as_dict(layout)
    if not lay["num_layers"]:
        raise LayoutError("the layout plans no model (launch ran without --model): give launch --model M")
    if len(sequential) != lay["num_layers"] + 2:
        raise LayoutError(f"the model has {len(sequential) - 2} blocks, the layout {lay['num_layers']}")
    blocks = [sequential[1 + i] for i in range(lay["layer_start"], lay["layer_end"])]
    for i in range(min(lay.get("recompute", 0), len(blocks)) if recompute else 0):
        blocks[i] = _Recompute(blocks[i])
    first = [sequential[0]] if lay["stage"] == 0 else []
    last = [sequential[-1]] if lay["stage"] == lay["num_stages"] - 1 else []
    return torch.nn.Sequential(*first, *blocks, *last)


def _Recompute(block: torch.nn.Module) -> torch.nn.Module:  # noqa: N802 - a class factory
    import torch
    from torch.utils.checkpoint import checkpoint

    class Recompute(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.inner, x, use_reentrant=False)

    return Recompute(block)


# -- gradients and losses ----------------------------------------------------------------------


def _on_comm_device(tensor: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
    """`tensor` where `group` can use it: gloo relays device tensors through host memory."""
    import torch.distributed as dist

    return tensor.cpu() if dist.get_backend(group) == "gloo" and tensor.device.type != "cpu" else tensor


def weighted_allreduce_grads(
    module: torch.nn.Module, layout: Any, group: ProcessGroup | HierarchicalGroup | None
) -> None:
    """Replace each gradient by the sum of ``grad_weight * grad`` over `group`
    (`Distributed.gradient_group`; None: one replica, only scaled)."""
    import torch
    import torch.distributed as dist

    grads = [_grad(p) for p in module.parameters() if p.requires_grad]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads]) * grad_weight(layout)
    if isinstance(group, HierarchicalGroup):
        flat = _hierarchical_sum(flat, group)
    elif group is not None and dist.get_world_size(group) > 1:
        flat = _all_reduce(flat, group)
    for g, reduced in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(reduced.view_as(g))


def _all_reduce(tensor: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    import torch.distributed as dist

    comm = _on_comm_device(tensor, group)
    dist.all_reduce(comm, op=dist.ReduceOp.SUM, group=group)
    return comm.to(tensor.device)


def _hierarchical_sum(flat: torch.Tensor, h: HierarchicalGroup) -> torch.Tensor:
    """`HierarchicalGroup`'s sum; pieces go in one order on every rank, so no two owner groups wait
    on each other."""
    import torch
    import torch.distributed as dist

    size, n = flat.numel(), len(h.local_ranks)
    step = -(-max(size, 1) // h.unit)  # elements per unit
    padded = torch.zeros(step * h.unit, dtype=flat.dtype, device=flat.device)
    padded[:size] = flat
    if h.local is not None:
        padded = _on_comm_device(padded, h.local)
    chunks = list(padded.chunk(n))
    mine = torch.empty_like(chunks[h.index])
    if h.local is None:
        mine.copy_(chunks[h.index])
    else:
        _reduce_scatter(mine, padded, chunks, h.local, h.index)
    offset = h.index * mine.numel()
    for piece in h.pieces:
        if piece.group is not None:
            part = mine[piece.start * step - offset : piece.end * step - offset]
            part.copy_(_all_reduce(part.contiguous(), piece.group))
    if h.local is None:
        return mine[:size].to(flat.device)
    dist.all_gather(chunks, mine, group=h.local)
    return torch.cat(chunks)[:size].to(flat.device)


def _reduce_scatter(
    mine: torch.Tensor, padded: torch.Tensor, chunks: list[torch.Tensor], group: ProcessGroup, index: int
) -> None:
    """`mine` = the sum over `group` of chunk `index` of `padded`; where the backend has no
    reduce-scatter (some gloo builds; it raises on every rank before anything is sent), an
    all-reduce of which each rank keeps its chunk."""
    import torch.distributed as dist

    try:
        dist.reduce_scatter(mine, chunks, op=dist.ReduceOp.SUM, group=group)
    except RuntimeError as e:
        if "does not support reduce_scatter" not in str(e):
            raise
        dist.all_reduce(padded, op=dist.ReduceOp.SUM, group=group)
        mine.copy_(padded.chunk(len(chunks))[index])


def _grad(param: torch.Tensor) -> torch.Tensor:
    """`param`'s gradient (a DTensor's local shard); zeros if none: a replica without samples joins too."""
    import torch

    if param.grad is None:
        param.grad = torch.zeros_like(param)
    grad = param.grad
    return grad.to_local() if hasattr(grad, "to_local") else grad


def global_loss(layout: Any, replica_loss: float | None) -> float:
    """The global batch's mean loss on every rank (each replica's last stage's, weighted)."""
    import torch
    import torch.distributed as dist

    lay = as_dict(layout)
    weight = grad_weight(lay)
    mine = lay["stage"] == lay["num_stages"] - 1 and lay["tp_rank"] == 0
    share = weight * replica_loss if mine and replica_loss is not None else 0.0
    value = torch.tensor([share], dtype=torch.float64)
    dist.all_reduce(value)
    return float(value.item())


from slurm_hetero.training.pipeline import Loss, Pipeline, micro_batch_sizes  # noqa: E402
from slurm_hetero.training.tensor import parallelize  # noqa: E402
