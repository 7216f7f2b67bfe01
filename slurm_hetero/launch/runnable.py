"""What `slurm_hetero.training` can run, and so what `plan` and `launch` both search. Pure.

`plan` and `launch` build their `LayoutSpec` with the same families (`search_kinds`) and the same
`MIXED_TP`, so for the same allocation and options the layout `plan` prints is the one `launch`
runs. A layout the runtime cannot express is left out of the default search, and asked for by
name (`--kind staged`) it is planned by `plan` with a note and refused by `launch` in one line
(`unrunnable_reason`), naming the torch API that cannot express it:

- the staged family: a data-parallel degree per stage re-splits each micro-batch's activations
  between stages of different degrees; `torch.distributed.pipelining.PipelineStage` sends a stage's
  output to one rank of the next stage, so the re-split has no place in its schedules;
- data-parallel replicas whose tensor-parallel degree differs by type (`LayoutSpec.mixed_tp`):
  DTensor shards a replica's weights by its own degree, and the gradient all-reduce across
  replicas needs shards that line up, so every type trains at one degree.

Pipelines whose stages differ in tensor-parallel degree run: only tp rank 0 of a stage talks to
the neighbour stages and hands activations and gradients to its tp group (`training`).
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_hetero.engine.layout import Layout, LayoutKind, kinds_for_micro_batch

RUNNABLE_KINDS = (LayoutKind.PIPELINE, LayoutKind.DATA)
MIXED_TP = False  # data family: one tensor-parallel degree for every type (see the docstring)
STAGED_REASON = (
    "the staged family gives each stage its own data-parallel degree, so activations are re-split "
    "between stages; torch.distributed.pipelining's PipelineStage sends a stage's output to one "
    "rank of the next stage and cannot express that"
)


def search_kinds(asked: Sequence[LayoutKind], micro_batch: int | None) -> tuple[LayoutKind, ...]:
    """The families to search: those asked for by name (`--kind`, any family: `plan` plans what it
    is asked), else the ones the runtime runs; `kinds_for_micro_batch` drops staged with a given
    micro-batch size."""
    kinds = tuple(asked) or RUNNABLE_KINDS
    return kinds_for_micro_batch(kinds, bool(asked), micro_batch)


def unrunnable_reason(layout: Layout) -> str | None:
    """Why `slurm_hetero.training` cannot run `layout`, or None."""
    if layout.kind == LayoutKind.STAGED:
        return STAGED_REASON
    if layout.kind == LayoutKind.DATA and len({s.tp for p in layout.pipelines for s in p.stages}) > 1:
        return (
            "its data-parallel replicas differ in tensor-parallel degree; DTensor shards each "
            "replica's weights by its own degree and their gradients cannot be all-reduced shard by shard"
        )
    return None


def plan_note(layout: Layout) -> str | None:
    """What `plan` adds under a layout that `launch` would refuse."""
    reason = unrunnable_reason(layout)
    return None if reason is None else f"launch refuses this layout: {reason}"
