"""`slurm-hetero calibrate`: measure this device's throughput and store it for plan and launch."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from slurm_hetero.cli import FILE, TEXT, cli
from slurm_hetero.cli.options import SEQ
from slurm_hetero.core.errors import ConfigError, RequestError
from slurm_hetero.core.readfile import read_text, unusable_path
from slurm_hetero.engine.devicegroups import resolve_measured
from slurm_hetero.engine.modelcost import DEFAULT_ATTENTION, Attention, CostSettings
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.modelconfigs import layer_costs_for
from slurm_hetero.launch.calibrate import (
    DEFAULT_OUT,
    Calibration,
    CalibrationError,
    calibrate,
    from_sailor,
    sailor_network,
    store,
    store_entries,
)
from slurm_hetero.slurm import syntax

MAX_PROFILE_BYTES = 16 * 2**20  # SAILOR's profiles_tmp.json is 0.6 MB


def summary(result: Calibration, path: Path) -> str:
    shapes = ""
    if result.model is not None and result.shapes is not None:
        sizes = ",".join(str(s["micro_batch"]) for s in result.shapes)
        shapes = f"; {result.model['name']} layer at micro-batch {sizes} (tp 1)"
    return (
        f"{result.type} on {result.device} ({result.dtype}): matmul {result.tflops:.3f} TFLOPS, "
        f"transformer layer {result.layer_tflops:.3f} TFLOPS ({result.tokens_per_s:,.0f} tokens/s)"
        f"{shapes}; stored in {path}"
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
    type=FILE,
    default=DEFAULT_OUT,
    show_default=True,
    help="YAML file to merge the result into.",
)
@click.option(
    "--model",
    type=TEXT,
    help="Also time one layer of this model (bundled name or config.json) per micro-batch size.",
)
@click.option("--seq", type=SEQ, help="With --model: tokens per sequence [default: the model's context].")
@click.option(
    "--micro-batches", "micro_batches", help="With --model: the micro-batch sizes to time [default: 1,2,4]."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def calibrate_command(
    model: str | None, seq: int | None, micro_batches: str | None, out: Path, **o: Any
) -> None:
    """Measure matmul and transformer-layer throughput with torch and store them so plans use
    measured speed (`--measured FILE`) instead of datasheet numbers; with --model also the
    per-shape profile (seconds of one of its layers per micro-batch size) plan and launch read."""
    if model is None and (seq is not None or micro_batches is not None):
        raise click.UsageError("--seq and --micro-batches time a model's layer: give --model too")
    if (problem := unusable_path(out.expanduser())) is not None:  # before minutes of measuring
        raise CalibrationError(f"--out {syntax.text(out)}: {problem}")
    sizes = _micro_batches("1,2,4" if micro_batches is None else micro_batches)
    shapes = (model, seq) if model is not None else None
    result = calibrate(
        o["device"], o["gres_type"], o["dtype"], catalog=load_catalog(), model=shapes, micro_batches=sizes
    )
    path = store(out, result)
    click.echo(json.dumps({**asdict(result), "file": str(path)}) if o["as_json"] else summary(result, path))


def _micro_batches(text: str) -> tuple[int, ...]:
    items = [item.strip() for item in text.split(",")]
    if not all(item.isdigit() and 1 <= int(item) <= MAX_MICRO_BATCH for item in items):
        raise click.UsageError(
            f"--micro-batches {syntax.text(text)}: expected sizes 1 to {MAX_MICRO_BATCH}, e.g. 1,2,4"
        )
    return tuple(sorted({int(item) for item in items}))


MAX_MICRO_BATCH = 1024


def _sailor_types(text: str) -> dict[str, str]:
    """SAILOR GPU -> our type, each GPU and each type once, every type one `plan --measured` knows."""
    pairs = [item.split("=", 1) for item in text.split(",") if item]
    given = f"--types {syntax.text(text)}"
    if not pairs or any(len(p) != 2 or not p[0] or not p[1] for p in pairs):
        raise RequestError(given, "expected SAILOR_GPU=TYPE[,...], e.g. A100-40=a100_40g")
    for side, twice in ((0, "SAILOR GPU {} is given twice"), (1, "two GPUs are converted to type {}")):
        names = [p[side] for p in pairs]
        if len(set(names)) < len(names):
            raise RequestError(given, twice.format(next(n for n in names if names.count(n) > 1)))
    # as plan reads the keys: an unknown type, or two spellings of one, is refused there too
    resolve_measured(dict.fromkeys((b for _, b in pairs), 1.0), load_catalog(), key_name="--types type")
    return {a: b for a, b in pairs}


def _sailor_json(path: Path, name: str) -> Any:
    text = read_text(path, MAX_PROFILE_BYTES, f"SAILOR {name}", ConfigError)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"not JSON ({e}); give SAILOR's {name}", str(path)) from None


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    try:
        yield
    except ConfigError as e:
        raise ConfigError(str(e), str(path)) from None


@cli.command("convert-profile")
@click.argument("profiles", type=FILE)
@click.option(
    "--sailor-model", required=True, type=TEXT, help="The profiles' model name (OPT-350, GPT-Neo-2.7, ...)."
)
@click.option(
    "--model", required=True, type=TEXT, help="Our model (bundled name or config.json) the profiles measured."
)
@click.option("--seq", type=SEQ, required=True, help="Sequence length the profiles measured.")
@click.option(
    "--types", "types", required=True, help="SAILOR_GPU=TYPE[,...]: which of our types each GPU is."
)
@click.option(
    "--attention",
    type=click.Choice([a.value for a in Attention]),
    default=DEFAULT_ATTENTION.value,
    show_default=True,
    help="The attention the plans use (local layers cost their window only with flash).",
)
@click.option(
    "--network",
    type=FILE,
    help="SAILOR's inter-node bandwidths (its multizone_bandwidths_het.json): store each type's "
    "network_gbs, at one sample's hidden state in fp32.",
)
@click.option("--out", type=FILE, default=DEFAULT_OUT, show_default=True)
def convert_profile(profiles: Path, model: str, seq: int, network: Path | None, **o: Any) -> None:
    """Convert SAILOR's per-GPU profiles (its profiles_tmp.json) into measured shapes that
    `plan --measured` reads: per type, tensor-parallel degree and micro-batch size, the seconds of
    one decoder layer (docs/plan.md, "Measured speeds")."""
    costs = layer_costs_for(model, seq, CostSettings(attention=o["attention"]))
    layer = float(costs.flops.mean()) / 1e9
    info = (model, seq, int(costs.elements_per_sample) // seq, layer)
    pairs = _sailor_types(o["types"])
    source = _sailor_json(profiles, "profiles_tmp.json")
    with _naming(profiles):
        entries = from_sailor(source, o["sailor_model"], pairs, info, costs.layers)
    if network is not None:  # what SAILOR's simulator sends per sample: the hidden state in fp32
        bandwidths = _sailor_json(network, "multizone_bandwidths_het.json")
        with _naming(network):
            for ours, gbs in sailor_network(bandwidths, pairs, 4 * seq * info[2]).items():
                entries[ours]["network_gbs"] = gbs
    path = store_entries(o["out"], entries)
    click.echo(
        f"{', '.join(entries)}: {sum(len(e['shapes']) for e in entries.values())} shapes stored in {path}"
    )
