"""One replica's step on `torch.distributed.pipelining`: this rank's stage as a `PipelineStage`
driven by torch's 1F1B schedule (as the planner prices the step) or GPipe.

torch's schedules split a batch into equal chunks: the last micro-batch is padded with copies of
the first sample, and the loss counts the real rows only, weighted by their share of the replica's
samples. Under tensor parallelism tp rank 0 is the stage the schedule sees; it replays each
forward's input and backward's gradient to its tp group, so the sharded layers' collectives meet.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

    from slurm_hetero.training import Distributed

__all__ = ["SCHEDULES", "Loss", "Pipeline", "micro_batch_sizes"]

Loss = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]  # (output, targets) -> mean loss
SCHEDULES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe"}
_FORWARD, _BACKWARD, _DONE, _RESET = 1, 2, 3, 4
_HEADER = 8  # op, id, dtype code, ndim, up to 4 dims


def micro_batch_sizes(layout: Any) -> list[int]:
    """This replica's micro-batch sizes: `micro_batches` of `micro_batch`, the last the rest."""
    from slurm_hetero.training import as_dict

    lay = as_dict(layout)
    samples, size, count = lay["samples"], lay["micro_batch"], lay["micro_batches"]
    if samples == 0:
        return []
    last = samples - size * (count - 1)
    if count < 1 or not 0 < last <= size:
        raise ValueError(f"{samples} samples do not make {count} micro-batches of at most {size}")
    return [size] * (count - 1) + [last]


class Pipeline:
    """This rank's stage of its replica: `step(inputs, targets)` runs the replica's samples
    (inputs on the first stage, targets on the last; the others may pass None) and returns the
    replica's mean loss on the last stage's tp rank 0, None elsewhere. Gradients accumulate into
    `stage`'s parameters; reduce them with `weighted_allreduce_grads`."""

    def __init__(
        self, stage: torch.nn.Module, dist: Distributed, loss_fn: Loss, schedule: str = "1f1b"
    ) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(
                f"schedule {schedule!r}: the layout runs {', '.join(SCHEDULES)}; interleaved and "
                "zero-bubble schedules need several stages per rank, the plan gives each one"
            )
        lay = dist.layout
        if lay["num_stages"] > 1:
            require_torch_module("torch.distributed.pipelining", "pipeline stages")
        self.lay, self.stage, self.loss_fn, self.schedule = lay, stage, loss_fn, schedule
        self.tp: ProcessGroup | None = dist.group("tp")
        self.tp_root = min(next(g["ranks"] for g in lay["groups"] if g["name"] == "tp"))
        self.first, self.last = lay["stage"] == 0, lay["stage"] == lay["num_stages"] - 1
        self.lead = lay["tp_rank"] == 0
        self.pp = dist.group("pp")
        self.made: Any = None  # the schedule, made on the first step
        self.targets: torch.Tensor | None = None  # this step's, for `_loss`

    def step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> float | None:
        sizes = micro_batch_sizes(self.lay)
        if not sizes:
            return None
        if self.lay["num_stages"] == 1:
            return self._local_step(_checked(inputs, "inputs"), _checked(targets, "targets"), sizes)
        if not self.lead:
            _follow(self.stage, self.tp, self.tp_root)
            return None
        return self._scheduled_step(inputs, targets, sizes)

    def _loss(self, output: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The loss of a micro-batch's real rows (`rows`: places in this step's targets), weighted."""
        assert self.targets is not None
        samples = self.lay["samples"]
        real = rows < samples
        count = int(real.sum())
        return self.loss_fn(output[real], self.targets[rows[real]]) * (count / samples)

    def _local_step(self, inputs: torch.Tensor, targets: torch.Tensor, sizes: list[int]) -> float | None:
        import torch

        self.targets, total, start = targets, 0.0, 0
        for size in sizes:
            rows = torch.arange(start, start + size)
            loss = self._loss(self.stage(inputs[start : start + size]), rows)
            loss.backward()
            total += float(loss.detach())
            start += size
        return total if self.lead else None

    def _scheduled_step(
        self, inputs: torch.Tensor | None, targets: torch.Tensor | None, sizes: list[int]
    ) -> float | None:
        import torch

        padded = sizes[0] * len(sizes)
        self.targets = _checked(targets, "targets") if self.last else None
        args = (_pad(_checked(inputs, "inputs"), padded),) if self.first else ()
        losses: list[torch.Tensor] = []
        kwargs: dict[str, Any] = {"target": torch.arange(padded), "losses": losses} if self.last else {}
        self._schedule(len(sizes)).step(*args, **kwargs)
        if self.tp is not None:
            _command(self.tp, self.tp_root, _DONE)
        return float(sum(float(x.detach()) for x in losses)) if self.last else None

    def _schedule(self, count: int) -> Any:
        """torch's schedule over this rank's `PipelineStage`, made once (its first step infers shapes)."""
        if self.made is None:
            from torch.distributed import pipelining

            kind, module = pipelining.PipelineStage, self.stage
            if self.tp is not None:
                kind, module = _LeadStage(self.tp, self.tp_root), _Lead(self.stage, self.tp, self.tp_root)
            if self.last and not self.first:
                module = _Owned(module)
            stage = kind(
                module, self.lay["stage"], self.lay["num_stages"], module_device(self.stage), group=self.pp
            )
            stage.stage_index_to_group_rank = _group_ranks(self.lay)
            # torch 2.6 sends its first step's shapes to the next rank of the group, not of the
            # stage order: point it at the layout's neighbours (later torch reads the mapping)
            for side in ("prev_rank", "next_rank"):
                if hasattr(stage, side) and self.lay[side] is not None:
                    setattr(stage, side, self.lay[side])
            # 1F1B with fewer micro-batches than stages is GPipe's order (as the planner prices
            # it), which torch's Schedule1F1B refuses. Every stage gets the loss (without one a
            # schedule runs forward only); losses are weighted already, so gradients are summed
            name = "gpipe" if count < self.lay["num_stages"] else self.schedule
            kind = getattr(pipelining, SCHEDULES[name])
            _wait_every_p2p_op()
            unscaled = {"scale_grads": False} if "scale_grads" in inspect.signature(kind).parameters else {}
            self.made = kind(stage, n_microbatches=count, loss_fn=self._loss, **unscaled)
        return self.made


def require_torch_module(module: str, what: str) -> None:
    """One line naming the torch in this environment when it lacks what the layout needs."""
    import importlib.util

    import torch

    if importlib.util.find_spec(module) is None:
        raise RuntimeError(
            f"{what} need {module}, which torch {torch.__version__} here lacks; install torch >= 2.6"
        )


def _checked(tensor: torch.Tensor | None, name: str) -> torch.Tensor:
    if tensor is None:
        raise ValueError(f"this stage needs the replica's {name}")
    return tensor


def module_device(module: torch.nn.Module) -> torch.device:
    """Where `module`'s parameters are (the CPU for a module without any)."""
    import torch

    param = next(module.parameters(), None)
    return torch.device("cpu") if param is None else param.device


def _pad(batch: torch.Tensor, rows: int) -> torch.Tensor:
    """`batch` with copies of its first row up to `rows` rows, contiguous (torch 2.6's
    PipelineStage refuses a strided slice: PipeliningShapeError)."""
    import torch

    extra = rows - batch.shape[0]
    return torch.cat([batch, batch[:1].expand(extra, *batch.shape[1:])]) if extra else batch.contiguous()


def _wait_every_p2p_op() -> None:
    """torch before 2.8 waits only the last op of each batch of sends and receives it posts, which
    deadlocks 1F1B on gloo, where each op is its own work (pytorch#132644): wait them all."""
    import torch.distributed as dist
    from torch.distributed.pipelining import schedules

    if hasattr(schedules, "_wait_batch_p2p"):  # the fixed torch
        return

    class Every:
        def __init__(self, works: list[Any]) -> None:
            self.works = works

        def wait(self) -> None:
            for work in self.works:
                work.wait()

    def batch_p2p(ops: list[Any], desc: str | None = None) -> Every | None:
        return Every(dist.batch_isend_irecv(ops)) if ops else None

    schedules._batch_p2p = batch_p2p  # type: ignore[assignment]  # the old torch's signature


def _group_ranks(lay: dict[str, Any]) -> dict[int, int]:
    """This stage and its neighbours -> their ranks in the pp group (stages need not follow rank order)."""
    pp = sorted(next(g["ranks"] for g in lay["groups"] if g["name"] == "pp"))
    stage, out = lay["stage"], {lay["stage"]: pp.index(lay["rank"])}
    for neighbour, rank in ((stage - 1, lay["prev_rank"]), (stage + 1, lay["next_rank"])):
        if rank is not None:
            out[neighbour] = pp.index(rank)
    return out


# -- tensor-parallel followers -----------------------------------------------------------------

_DTYPES = ("float64", "float32", "bfloat16", "float16", "int64", "int32")


def _command(group: ProcessGroup, root: int, op: int, ident: int = 0, tensor: Any = None) -> None:
    import torch
    import torch.distributed as dist

    header = torch.zeros(_HEADER, dtype=torch.int64)
    header[0], header[1] = op, ident
    if tensor is not None:
        header[2], header[3] = _DTYPES.index(str(tensor.dtype).split(".")[-1]), tensor.dim()
        header[4 : 4 + tensor.dim()] = torch.tensor(tensor.shape)
    dist.broadcast(header, src=root, group=group)
    if tensor is not None:
        dist.broadcast(tensor.detach().contiguous(), src=root, group=group)


def _receive(group: ProcessGroup, root: int) -> tuple[int, int, Any]:
    import torch
    import torch.distributed as dist

    header = torch.empty(_HEADER, dtype=torch.int64)
    dist.broadcast(header, src=root, group=group)
    op, ident, code, ndim = (int(v) for v in header[:4])
    if op in (_DONE, _RESET):
        return op, ident, None
    tensor = torch.empty(tuple(int(v) for v in header[4 : 4 + ndim]), dtype=getattr(torch, _DTYPES[code]))
    dist.broadcast(tensor, src=root, group=group)
    return op, ident, tensor


def _follow(stage: torch.nn.Module, group: ProcessGroup | None, root: int) -> None:
    """A tp rank other than 0: run the forwards and backwards tp rank 0 announces, until done."""
    assert group is not None
    outputs: dict[int, torch.Tensor] = {}
    while True:
        op, ident, tensor = _receive(group, root)
        if op == _DONE:
            return
        if op == _RESET:  # the shape inference is over: forget its forwards and gradients
            outputs.clear()
            for param in stage.parameters():
                param.grad = None
        elif op == _FORWARD:
            x = tensor.requires_grad_() if tensor.is_floating_point() else tensor
            outputs[ident] = stage(x)
        else:
            outputs.pop(ident).backward(tensor)


def _LeadStage(group: ProcessGroup, root: int) -> Any:  # noqa: N802 - a class factory
    """tp rank 0's `PipelineStage`: the followers run torch's shape inference too (the sharded
    layers' collectives must meet), then drop what it left before the first real micro-batch."""
    from torch.distributed.pipelining import PipelineStage

    class LeadStage(PipelineStage):
        started = False

        def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
            if not self.started:
                self.started = True
                _command(group, root, _RESET)
            return super().forward_one_chunk(*args, **kwargs)

    return LeadStage


def _Owned(stage: torch.nn.Module) -> torch.nn.Module:  # noqa: N802 - a class factory
    """The last stage for the schedule, its output never a view: torch 2.6 detaches it in place
    after its backward, which raises for a view."""
    import torch

    class Owned(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.inner(x)
            return out.clone() if out._is_view() else out

    return Owned(stage)


def _Lead(stage: torch.nn.Module, group: ProcessGroup, root: int) -> torch.nn.Module:  # noqa: N802
    """tp rank 0's stage: each forward hands its input to the followers, each backward its gradient."""
    import torch

    class Announce(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, output: torch.Tensor, ident: int) -> torch.Tensor:
            ctx.ident = ident
            return output.view_as(output)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
            _command(group, root, _BACKWARD, ctx.ident, grad)
            return grad, None

    class Lead(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner, self.count = inner, 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            ident, self.count = self.count, self.count + 1
            _command(group, root, _FORWARD, ident, x)
            return Announce.apply(self.inner(x), ident)

    return Lead(stage)
