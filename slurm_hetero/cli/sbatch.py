"""`slurm-hetero sbatch`: size the request from the fit engine, then hand over to the real sbatch.

    slurm-hetero sbatch --model llama-3-8b --mode train --seq 4096 --micro-batch 2 --gpus=4 train.sh

adds `--gres=gpumem:<per-device GiB>G` (merged into an existing `--gres`), prints the decision,
and execs `sbatch` with every other argument untouched; `--dry-run` prints the command only.
The job_submit hook then turns gpumem into a concrete device type in slurmctld.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Sequence

import click

from slurm_hetero.cli import cli
from slurm_hetero.cli.fit import BEYOND_CONTEXT_OPTION, POSITIVE, load_model
from slurm_hetero.cli.options import MAX_GIB, FiniteFloat
from slurm_hetero.engine import fit as engine
from slurm_hetero.engine.modelspec import ModelSpec
from slurm_hetero.errors import HeteroError
from slurm_hetero.modelconfigs import DEFAULT_SEQ, sequence_length

GIB = 1024**3
_COUNT_FLAGS = ("--gpus", "-G", "--gpus-per-node")


def device_count(args: Sequence[str]) -> int:
    """Devices the sbatch arguments ask for (`--gpus=N`, `-G N`, `--gpus-per-node=TYPE:N`); default 1."""
    for i, arg in enumerate(args):
        flag, sep, value = arg.partition("=")
        if flag in _COUNT_FLAGS:
            value = value if sep else (args[i + 1] if i + 1 < len(args) else "")
            m = re.fullmatch(r"(?:[A-Za-z0-9_\-.]+:)?(\d+)", value)
            if m is None or int(m.group(1)) < 1:
                raise HeteroError(f"{flag} {value!r}: expected a device count such as 4 or a100_80g:4")
            return int(m.group(1))
    return 1


def per_device_bytes(spec: ModelSpec, mode: str, devices: int, o: dict[str, int | str]) -> float:
    """Memory per device for this model on `devices` devices (data parallel for training, tensor
    parallel for inference unless --tp is given)."""
    tp, pp = int(o["tp"]), int(o["pp"])
    if mode == "infer":
        return engine.inference_memory(
            spec, str(o["dtype"]), int(o["batch"]), int(o["seq"]), tp=tp if tp > 1 else devices
        ).total
    if devices % (tp * pp):
        raise HeteroError(f"{devices} devices are not a multiple of tp x pp = {tp * pp}")
    return engine.training_memory(
        spec,
        str(o["dtype"]),
        micro_batch=int(o["micro_batch"]),
        seq=int(o["seq"]),
        zero_stage=int(o["zero"]),
        dp=devices // (tp * pp),
        tp=tp,
        pp=pp,
        recompute=str(o["recompute"]),
    ).total


def with_gpumem(args: Sequence[str], gib: int) -> list[str]:
    """The sbatch arguments with gpumem:<gib>G merged into --gres (added in front if absent)."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg.startswith("--gres="):
            if "gpumem" in arg:
                raise HeteroError("--gres already has gpumem: drop it or drop --model")
            out[i] = f"{arg},gpumem:{gib}G"
            return out
    return [f"--gres=gpumem:{gib}G", *out]


@cli.command(
    name="sbatch", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@click.option("--model", required=True, help="Bundled model name or a Hugging Face config.json.")
@click.option("--mode", type=click.Choice(["train", "infer"]), default="train", show_default=True)
@click.option("--dtype", default="bf16", show_default=True)
@click.option(
    "--seq",
    type=POSITIVE,
    help=f"Tokens per sequence [default: {DEFAULT_SEQ}, or the model's context if shorter].",
)
@BEYOND_CONTEXT_OPTION
@click.option(
    "--micro-batch", type=POSITIVE, default=1, show_default=True, help="Training micro-batch per device."
)
@click.option("--batch", type=POSITIVE, default=1, show_default=True, help="Inference batch (sequences).")
@click.option("--zero", type=click.IntRange(0, 3), default=0, show_default=True)
@click.option("--tp", type=POSITIVE, default=1, show_default=True)
@click.option("--pp", type=POSITIVE, default=1, show_default=True)
@click.option(
    "--recompute",
    type=click.Choice(["none", "selective", "full"]),
    default="selective",
    show_default=True,
    help="Activation recomputation (selective ~ flash attention).",
)
@click.option(
    "--headroom-gib",
    type=FiniteFloat(0, MAX_GIB),
    default=0.0,
    show_default=True,
    help="Extra GiB per device.",
)
@click.option("--dry-run", is_flag=True, help="Print the sbatch command; run nothing.")
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
def sbatch_cmd(
    model: str,
    mode: str,
    headroom_gib: float,
    dry_run: bool,
    sbatch_args: tuple[str, ...],
    **options: int | str,
) -> None:
    """Submit with gpumem computed by the fit engine: SBATCH_ARGS... SCRIPT [ARGS...]."""
    if not sbatch_args:
        raise HeteroError("nothing to submit: give sbatch options and a script")
    spec = load_model(model)
    beyond = bool(options.pop("beyond_context"))
    options["seq"] = sequence_length(spec, options["seq"], model, beyond)  # type: ignore[arg-type]
    devices = device_count(sbatch_args)
    need = per_device_bytes(spec, mode, devices, options) + headroom_gib * GIB
    gib = max(1, math.ceil(need / GIB))
    argv = ["sbatch", *with_gpumem(sbatch_args, gib)]
    click.echo(
        f"slurm-hetero: {spec.name} {mode} needs {need / GIB:.1f} GiB per device on {devices} device(s)"
        f" -> --gres=gpumem:{gib}G",
        err=True,
    )
    if dry_run:
        click.echo(shlex.join(argv))
        return
    os.execvp("sbatch", argv)  # hand over; sbatch's exit code is ours
