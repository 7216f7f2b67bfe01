"""`slurm-hetero fit`: memory a model needs per device, for training or inference, and which
device types of an inventory hold it; the numbers come from `engine.fit` (docs/fit.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click

from slurm_hetero.cli import TEXT, Decorator, cli, inventory_option
from slurm_hetero.cli.catalog import Column, render_table
from slurm_hetero.cli.options import BATCH, DEGREE, SEQ, cost_options, cost_settings, stacked
from slurm_hetero.core.errors import ConfigError, RequestError
from slurm_hetero.engine import fit as engine
from slurm_hetero.engine.limits import MAX_DEVICES
from slurm_hetero.engine.modelcost import BYTES_PER_VALUE, GIB, usable_tp_sizes
from slurm_hetero.engine.modelspec import ModelSpec
from slurm_hetero.inventory import document as inventory_io
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.modelconfigs import (
    BEYOND_CONTEXT,
    DEFAULT_SEQ,
    bundled_names,
    load_model,
    sequence_length,
)
from slurm_hetero.inventory.nodes import slurm_nodes


def breakdown(spec: ModelSpec, o: dict[str, Any], devices: int | None = None) -> engine.Breakdown | None:
    """With `devices`: inference tp = devices, training dp = devices / (tp x pp); None if that is no
    layout."""
    if o["mode"] == "infer":
        tp = o["tp"] if devices is None else devices
        if devices is not None and tp not in usable_tp_sizes(spec, (1, tp)):
            return None
        overhead = o["overhead_gib"] * GIB
        return engine.inference_memory(spec, o["dtype"], o["batch"], o["seq"], o["kv_dtype"], tp, overhead)
    dp, rest = (o["dp"], 0) if devices is None else divmod(devices, o["tp"] * o["pp"])
    if rest:
        return None
    settings = dataclasses.replace(cost_settings(o), sequence_parallel=not o["no_sequence_parallel"])
    return engine.training_memory(spec, settings, o["micro_batch"], o["seq"], dp, o["tp"], o["pp"])


def deepspeed_estimate(spec: ModelSpec, o: dict[str, Any]) -> int | None:
    """DeepSpeed estimates ZeRO 1-3 of 16-bit training without tp/pp; else None."""
    if o["mode"] != "train" or o["zero"] == 0 or o["tp"] * o["pp"] > 1 or o["dtype"] == "fp32":
        return None
    p = spec.params
    return engine.deepspeed_model_states(p.total, p.largest_module, o["zero"], o["dp"])


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.2f}"


def model_row(spec: ModelSpec) -> dict[str, Any]:
    p = spec.params
    return {
        "name": spec.name,
        "family": spec.family,
        "model_type": spec.model_type,
        "params": p.total,
        "active_params": p.active,
        "layers": spec.total_layers,
        "hidden": spec.hidden,
        "heads": spec.heads,
        "kv_heads": spec.kv_heads,
        "vocab": spec.vocab,
        "experts": spec.num_experts,
        "largest_module_params": p.largest_module,
    }


def option_row(option: engine.DeviceOption) -> dict[str, Any]:
    row = dataclasses.asdict(option)
    reason = row.pop("reason")
    return {**row, "fits": option.fits, "reason": None if reason is None else str(reason)}


def result(spec: ModelSpec, o: dict[str, Any], inventory_path: Path | None) -> dict[str, Any]:
    """Everything `fit` prints, as JSON-ready data (bytes)."""
    estimate = breakdown(spec, o)
    assert estimate is not None
    out: dict[str, Any] = {
        "model": model_row(spec),
        "mode": o["mode"],
        "settings": {k: v for k, v in o.items() if k != "mode"},
        "breakdown_bytes": estimate.components(),
        "total_bytes": estimate.total,
        "total_gib": round(estimate.total / GIB, 3),
        "devices": estimate.devices,
        "model_states_bytes": estimate.model_states if o["mode"] == "train" else None,
        "deepspeed_model_states_bytes": deepspeed_estimate(spec, o),
    }
    if inventory_path is not None:
        inventory = inventory_io.load(inventory_path, keep_identity=False)
        nodes = slurm_nodes(inventory, load_catalog())
        options = engine.device_options(nodes, lambda n: breakdown(spec, o, n))
        out["device_options"] = [option_row(x) for x in options]
    return out


OPTION_COLUMNS: list[Column] = [
    ("TYPE", lambda r: r["type"], str, False),
    ("VENDOR", lambda r: r["vendor"], str, False),
    ("MEM_GIB", lambda r: r["memory_bytes"], _gib, True),
    ("AVAILABLE", lambda r: r["available"], str, True),
    ("NEEDED", lambda r: r["needed"], lambda v: "-" if v is None else str(v), True),
    ("PER_DEVICE_GIB", lambda r: r["per_device_bytes"], _gib, True),
    ("FITS", lambda r: "yes" if r["fits"] else r["reason"], str, False),
]


def _headline(data: dict[str, Any]) -> str:
    m, s = data["model"], data["settings"]
    active = f", {m['active_params'] / 1e9:.2f}B active" if m["experts"] > 1 else ""
    what = f"{m['name']} ({m['model_type']}, {m['params'] / 1e9:.2f}B params{active}, {m['layers']} layers)"
    if data["mode"] == "infer":
        return f"{what}: inference {s['dtype']}, batch {s['batch']} x seq {s['seq']}, tp={s['tp']}"
    layout = f"ZeRO-{s['zero']} dp={s['dp']} tp={s['tp']} pp={s['pp']}, recompute {s['recompute']}"
    return (
        f"{what}: training {s['dtype']} {s['optimizer']}, micro-batch {s['micro_batch']} x seq "
        f"{s['seq']}, {layout}, {s['attention']} attention"
    )


def render_text(data: dict[str, Any]) -> str:
    rows = [{"c": name, "v": value} for name, value in data["breakdown_bytes"].items()]
    rows.append({"c": f"total per device ({data['devices']} devices)", "v": data["total_bytes"]})
    lines = [
        _headline(data),
        render_table(
            rows, [("COMPONENT", lambda r: r["c"], str, False), ("GIB", lambda r: r["v"], _gib, True)]
        ),
    ]
    if data["deepspeed_model_states_bytes"] is not None:
        lines.append(
            f"model states: {_gib(data['model_states_bytes'])} GiB (ZeRO paper); DeepSpeed 0.19 "
            f"estimator: {_gib(data['deepspeed_model_states_bytes'])} GiB (see docs/fit.md)"
        )
    if "device_options" in data:
        lines += ["", render_table(data["device_options"], OPTION_COLUMNS)]
    return "\n".join(lines)


def fit_options(layout: bool = True) -> Decorator:
    """`layout` False (the sbatch wrapper) leaves out --dp: the job's device count decides it."""
    dp = click.option("--dp", type=DEGREE, default=1, show_default=True, help="Data-parallel degree.")
    return stacked(
        click.option("--mode", type=click.Choice(["infer", "train"]), default="infer", show_default=True),
        click.option(
            "--kv-dtype",
            type=click.Choice(list(BYTES_PER_VALUE)),
            default=None,
            help="KV cache dtype (default: the weights' dtype, bf16 for int8/int4).",
        ),
        click.option(
            "--batch", type=BATCH, default=1, show_default=True, help="Inference: sequences at once."
        ),
        click.option(
            "--seq",
            type=SEQ,
            help=f"Tokens per sequence, at most the model's context [default: {DEFAULT_SEQ}, or the "
            "context if shorter].",
        ),
        click.option(
            BEYOND_CONTEXT,
            "beyond_context",
            is_flag=True,
            help="Allow --seq beyond the model's context length (models with relative positions such "
            "as T5, or RoPE scaling).",
        ),
        cost_options(solver=False),
        *([dp] if layout else []),
        click.option("--tp", type=DEGREE, default=1, show_default=True, help="Tensor-parallel degree."),
        click.option("--pp", type=DEGREE, default=1, show_default=True, help="Pipeline-parallel degree."),
        click.option(
            "--no-sequence-parallel", is_flag=True, help="Tensor parallel without sequence parallel."
        ),
    )


@cli.command("fit")
@click.option(
    "--model", "model_ref", metavar="NAME|PATH", type=TEXT, help="Bundled model name or a config.json path."
)
@fit_options()
@inventory_option(help="Inventory (YAML or JSON): list its device types that hold the job.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (bytes).")
@click.option("--list-models", is_flag=True, help="List the bundled model names.")
def fit(
    model_ref: str | None, inventory_path: Path | None, as_json: bool, list_models: bool, **kwargs: Any
) -> None:
    """Memory per device for training or inference of a model, and the device types that hold it."""
    if list_models:
        click.echo(json.dumps(bundled_names()) if as_json else "\n".join(bundled_names()))
        return
    if not model_ref:
        raise ConfigError(f"--model is required (a config.json path or one of: {', '.join(bundled_names())})")
    devices = kwargs.get("dp", 1) * kwargs["tp"] * kwargs["pp"]
    if devices > MAX_DEVICES:
        raise RequestError(
            f"--dp {kwargs.get('dp', 1)} --tp {kwargs['tp']} --pp {kwargs['pp']}",
            f"a layout of {devices:,} devices; at most {MAX_DEVICES:,}, as plan takes",
        )
    spec = load_model(model_ref)
    kwargs["seq"] = sequence_length(spec, kwargs["seq"], model_ref, kwargs.pop("beyond_context"))
    data = result(spec, kwargs, inventory_path)
    click.echo(json.dumps(data, indent=2) if as_json else render_text(data))
