"""The sizes a layout may have: far beyond any real job, small enough that the planner's arrays and
loops stay bounded. `engine.layout.solve` checks them all; `plan` and `launch` check the batch first.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_hetero.core.errors import RequestError
from slurm_hetero.engine.shapes import MAX_TYPES
from slurm_hetero.engine.stagecost import DeviceGroup

MAX_DEVICES = 65_536
MAX_GLOBAL_BATCH = 2**24  # sequences per step
MAX_SEQ = 2**24  # tokens per sequence, even --beyond-context (the longest published contexts: ~10M)
# a device's network figure, GB/s: past either end a product or quotient of it under- or overflows
NETWORK_GBS_RANGE = (1e-3, 1e6)


def check_size(groups: Sequence[DeviceGroup]) -> None:
    """A RequestError when the allocation is beyond what the planner takes."""
    devices = sum(g.count for g in groups)
    if devices > MAX_DEVICES or len(groups) > MAX_TYPES:
        raise RequestError(
            f"{devices} devices of {len(groups)} types",
            f"the planner takes at most {MAX_DEVICES:,} devices of at most {MAX_TYPES} types",
        )


def check_batch(global_batch: int, micro_batch: int | None = None, micro_batches: int | None = None) -> None:
    """One RequestError, naming the flags, when the batch options cannot go together."""
    if not 1 <= global_batch <= MAX_GLOBAL_BATCH:
        raise RequestError(f"--global-batch {global_batch}", f"must be 1 to {MAX_GLOBAL_BATCH:,} sequences")
    if micro_batch is not None and micro_batches is not None:
        raise RequestError(
            f"--micro-batch {micro_batch} --micro-batches {micro_batches}",
            "each sets the micro-batch size; give one of them",
        )
    for flag, value in (("--micro-batch", micro_batch), ("--micro-batches", micro_batches)):
        if value is not None and not 1 <= value <= global_batch:
            raise RequestError(f"{flag} {value}", f"must be 1 to the global batch ({global_batch})")


def check_prices(objective: str, groups: Sequence[DeviceGroup]) -> None:
    """`objective` cost needs every type's price (by time instead would answer another question)."""
    unpriced = sorted({g.type for g in groups if g.price_per_hour <= 0})
    if objective == "cost" and unpriced:
        raise RequestError(
            "--objective cost",
            f"no price per hour for {', '.join(unpriced)}; give price_per_hour_usd in a site models "
            "file (/etc/slurm-hetero/models.d/*.yaml) or plan with --objective time",
        )
