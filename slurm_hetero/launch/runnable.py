"""What `slurm_hetero.training` can run, and so what `plan` and `launch` both search: the same
families (`search_kinds`) and `MIXED_TP`, so the layout `plan` prints is the one `launch` runs
(docs/plan.md, "What plan searches is what launch runs"). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_hetero.engine.layout import Layout, LayoutKind, kinds_for_micro_batch

RUNNABLE_KINDS = (LayoutKind.PIPELINE, LayoutKind.DATA)
MIXED_TP = False  # data family: one tensor-parallel degree for every type (DTensor shards line up)
STAGED_REASON = (
    "the staged family gives each stage its own data-parallel degree, so activations are re-split "
    "between stages; torch.distributed.pipelining's PipelineStage sends a stage's output to one "
    "rank of the next stage and cannot express that"
)


def search_kinds(asked: Sequence[LayoutKind], micro_batch: int | None) -> tuple[LayoutKind, ...]:
    """The families to search: those asked for by name (`--kind`), else the ones the runtime runs."""
    return kinds_for_micro_batch(tuple(asked) or RUNNABLE_KINDS, bool(asked), micro_batch)


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
