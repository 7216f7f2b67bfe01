"""`slurm-hetero calibrate`: measure this device's throughput and store it for plan and launch."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from slurm_hetero.catalog import load_catalog
from slurm_hetero.cli import cli
from slurm_hetero.launch.calibrate import DEFAULT_OUT, Calibration, CalibrationError, calibrate, store
from slurm_hetero.readfile import unusable_path
from slurm_hetero.slurm import syntax


def summary(result: Calibration, path: Path) -> str:
    return (
        f"{result.type} on {result.device} ({result.dtype}): matmul {result.tflops:.3f} TFLOPS, "
        f"transformer layer {result.layer_tflops:.3f} TFLOPS ({result.tokens_per_s:,.0f} tokens/s); "
        f"stored in {path}"
    )


@cli.command("calibrate")
@click.option(
    "--device", default="auto", show_default=True, help="torch device: auto, cpu, cuda, cuda:1, npu, ..."
)
@click.option("--type", "gres_type", help="Device type to store it as [default: from the device name].")
@click.option(
    "--dtype", type=click.Choice(["bf16", "fp32"]), help="[default: bf16 on accelerators, fp32 on CPU]"
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_OUT,
    show_default=True,
    help="YAML file to merge the result into.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def calibrate_command(
    device: str, gres_type: str | None, dtype: str | None, out: Path, as_json: bool
) -> None:
    """Measure matmul and transformer-layer throughput with torch and store them so plans use
    measured speed (`--measured FILE`) instead of datasheet numbers."""
    if (problem := unusable_path(out.expanduser())) is not None:  # before minutes of measuring
        raise CalibrationError(f"--out {syntax.text(out)}: {problem}")
    result = calibrate(device, gres_type, dtype, catalog=load_catalog())
    path = store(out, result)
    click.echo(json.dumps({**asdict(result), "file": str(path)}) if as_json else summary(result, path))
