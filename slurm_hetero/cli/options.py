"""Command-line options several commands share: the model (`plan`, `launch`) and how it is
trained (`fit`, `plan`, `launch`)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import click

from slurm_hetero.cli import TEXT, Decorator
from slurm_hetero.engine.limits import MAX_DEVICES, MAX_GLOBAL_BATCH, MAX_SEQ, NETWORK_GBS_RANGE
from slurm_hetero.engine.modelcost import (
    AUTO,
    BYTES_PER_VALUE,
    GIB,
    SOLVER_SETTINGS,
    Attention,
    CostSettings,
    Optimizer,
    Recompute,
)
from slurm_hetero.slurm import syntax

# Float options' bounds: wide enough for any real cluster, narrow enough that no product or
# quotient of them underflows to 0 or overflows.
MAX_GIB = 1e6  # --overhead-gib, --headroom-gib
MIN_GBS, MAX_GBS = NETWORK_GBS_RANGE  # --network-gbs, as a profile's network_gbs
MIN_MFU = 1e-3  # --mfu


class Count(click.IntRange):
    """An integer in a range, in ASCII digits (click's int() also reads '٢' and underscores)."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        # a sign is let through, and any count of digits: the range's message names the bounds
        if isinstance(value, str) and syntax.whole_number(value.strip().lstrip("+-"), 4000) is None:
            self.fail(f"{syntax.text(value)} is not a whole number in ASCII digits.", param, ctx)
        return super().convert(value, param, ctx)


class FiniteFloat(click.FloatRange):
    """A float in a range, not nan or infinite (click's FloatRange lets nan through)."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not (value.isascii() and "_" not in value):  # as Count
            self.fail(f"{syntax.text(value)} is not a number in ASCII digits.", param, ctx)
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


# Bounded counts (docs/plan.md, "Sizes"): a value past them is click's usage error, before any work.
SEQ = Count(1, MAX_SEQ)  # --seq, even with --beyond-context
BATCH = Count(1, MAX_GLOBAL_BATCH)  # fit's --batch, --micro-batch
DEGREE = Count(1, MAX_DEVICES)  # fit's --dp, --tp, --pp; plan's --per-node


def stacked(*options: Decorator) -> Decorator:
    """One decorator applying `options` as if stacked in that order."""
    return lambda command: functools.reduce(lambda c, option: option(c), reversed(options), command)


def model_options(required: bool = True) -> Decorator:
    """--model, --global-batch and --seq, as plan and launch (--model optional) take them."""
    extra = " Without it: torchrun-like, even data parallel." if not required else ""
    return stacked(
        click.option(
            "--model",
            required=required,
            type=TEXT,
            help=f"Bundled model (slurm-hetero fit --list-models) or a Hugging Face config.json.{extra}",
        ),
        click.option(
            "--global-batch",
            type=Count(min=1),
            default=512,
            show_default=True,
            help="Sequences per step.",
        ),
        click.option("--seq", type=SEQ, help="Sequence length [default: the model's context]."),
    )


def cost_options(solver: bool) -> Decorator:
    """The model-cost options; `solver` (plan, launch) adds ``--recompute auto`` and its defaults."""
    defaults = SOLVER_SETTINGS if solver else CostSettings()
    recompute = [r.value for r in Recompute] + ([AUTO] if solver else [])
    auto = " auto (plan, launch): none, or whole layers where memory is short." if solver else ""
    return stacked(
        click.option(
            "--micro-batch",
            "--micro-batch-size",
            "micro_batch",
            type=BATCH,
            default=None if solver else 1,
            show_default=not solver,
            help="Sequences per micro-batch on each device."
            + (" [default: searched, 1, 2, 4 or 8]" if solver else ""),
        ),
        click.option(
            "--dtype",
            type=click.Choice(list(BYTES_PER_VALUE)),
            default=defaults.dtype,
            show_default=True,
            help="Weights: training bf16/fp16 (mixed precision) or fp32; inference also fp8/int8/int4.",
        ),
        click.option(
            "--optimizer",
            type=click.Choice([o.value for o in Optimizer]),
            default=str(defaults.optimizer),
            show_default=True,
        ),
        click.option(
            "--zero",
            type=Count(0, 3),
            default=defaults.zero_stage,
            show_default=True,
            help="ZeRO stage 0-3: shard optimizer states (1), gradients (2), weights (3) over dp.",
        ),
        click.option(
            "--recompute",
            type=click.Choice(recompute),
            default=str(defaults.recompute),
            show_default=True,
            help="Activation recomputation (Korthikanti et al. 2022): none, selective (attention "
            f"core), full (keep each layer's input).{auto}",
        ),
        click.option(
            "--attention",
            type=click.Choice([a.value for a in Attention]),
            default=str(defaults.attention),
            show_default=True,
            help="Attention implementation: flash (fused, no s^2 scores kept; FlashAttention, torch "
            "SDPA, what current training uses) or eager (scores kept, Korthikanti's formula).",
        ),
        click.option(
            "--overhead-gib",
            type=FiniteFloat(0, MAX_GIB),
            default=defaults.overhead_bytes / GIB,
            show_default=True,
            help="Fixed runtime overhead per device (context, workspaces).",
        ),
    )


def cost_settings(options: Mapping[str, Any]) -> CostSettings:
    """The `CostSettings` of the parsed `cost_options`."""
    return CostSettings(
        dtype=options["dtype"],
        optimizer=options["optimizer"],
        zero_stage=options["zero"],
        recompute=options["recompute"],
        attention=options["attention"],
        overhead_bytes=options["overhead_gib"] * GIB,
    )


def describe(settings: CostSettings) -> str:
    """One line of the settings, as fit and plan print them."""
    return (
        f"{settings.dtype} {settings.optimizer}, ZeRO-{settings.zero_stage}, recompute "
        f"{settings.recompute}, {settings.attention} attention"
    )
