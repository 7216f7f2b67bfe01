"""`slurm-hetero launch`: under srun, one task per device; the manual is `slurm_hetero.launch.run`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from slurm_hetero.cli import FILE, PATH, cli, inventory_option
from slurm_hetero.cli.options import (
    MAX_GBS,
    MIN_GBS,
    Count,
    FiniteFloat,
    cost_options,
    cost_settings,
    model_options,
)
from slurm_hetero.core.errors import RequestError
from slurm_hetero.data import bundled
from slurm_hetero.engine.layout import DEFAULT_TP_SIZES, Layout, LayoutKind
from slurm_hetero.inventory.document import DEFAULT_INVENTORY
from slurm_hetero.launch.calibrate import load_profile
from slurm_hetero.launch.plan import LaunchOptions
from slurm_hetero.launch.run import RunOptions, launch
from slurm_hetero.slurm import syntax

_BACKEND = re.compile(r"^[a-z][a-z0-9_]*$")


def parse_tp_sizes(text: str) -> tuple[int, ...]:
    """`1,2,4` -> (1, 2, 4): ASCII digits only (`syntax.whole_number`)."""
    numbers = [syntax.whole_number(v.strip()) for v in text.split(",")]
    sizes = tuple(sorted({n for n in numbers if n is not None}))
    if None in numbers or not sizes or sizes[0] < 1:
        raise RequestError(f"--tp-sizes {text}", "expected positive integers, e.g. 1,2,4,8")
    return sizes


def launch_options(model: str | None, measured: Path | None, opts: dict[str, Any]) -> LaunchOptions:
    """The planner's options from the command line."""
    backend = opts["backend_override"]
    if backend is not None and not _BACKEND.match(backend):
        raise RequestError(
            f"--backend-override {backend}", "expected a torch backend name such as gloo or nccl"
        )
    profile = load_profile(measured)
    given = ("global_batch", "seq", "micro_batch", "even", "master_addr", "master_port", "network_gbs")
    return LaunchOptions(
        model=model,
        costs=cost_settings(opts),
        measured=profile.tflops,
        gemm_half=profile.gemm_half,
        shapes=profile.shapes,
        network=profile.network,
        backend_override=backend,
        tp_sizes=parse_tp_sizes(opts["tp_sizes"]),
        kinds=tuple(LayoutKind(k) for k in opts["kinds"]),
        **{name: opts[name] for name in given},
    )


def layout_view(model: str | None, plan_options: LaunchOptions) -> Any:
    """How `plan` shows a layout (table, JSON document), for `--dry-run`."""
    from slurm_hetero.cli.plan import catalog_estimates, layout_document, render_layout, with_measured_notes
    from slurm_hetero.inventory.catalog import load_catalog
    from slurm_hetero.launch.plan import sequence_length

    if model is None:
        return None
    seq, costs, measured = sequence_length(plan_options), plan_options.costs, plan_options.measured

    def view(layout: Layout) -> tuple[str, dict[str, Any]]:
        layout = with_measured_notes(layout)
        devices = ",".join(f"{g.type}:{g.count}" for g in layout.groups)
        notes = [catalog_estimates(devices, load_catalog(), measured, unrated=u) for u in (False, True)]
        return (
            render_layout(layout, model, seq, costs, notes[0]),
            layout_document(layout, model, seq, costs, notes[1]),
        )

    return view


def _print_manual(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """The launcher manual, docs/launch.md (packaged in the wheel as slurm_hetero/data/launch.md)."""
    if not value or ctx.resilient_parsing:
        return
    click.echo(bundled("launch.md", "docs/launch.md"), nl=False)
    ctx.exit(0)


@cli.command("launch", context_settings={"allow_interspersed_args": False})
@click.option(
    "--manual",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_manual,
    help="Print the launcher manual (docs/launch.md) and exit.",
)
@model_options(required=False)
@cost_options(solver=True)
@inventory_option(
    type=FILE,
    envvar="SLURM_HETERO_INVENTORY",
    help=f"Cluster inventory (the same file on every node) [default: {DEFAULT_INVENTORY} when "
    "installed, else the device types Slurm reports for the nodes].",
)
@click.option(
    "--measured",
    type=FILE,
    help="Measured throughput (what `calibrate` writes, or TYPE: TFLOPS lines).",
)
@click.option("--even", is_flag=True, help="Equal layers and samples on the chosen shape (for comparisons).")
@click.option("--backend-override", help="Use this torch backend for every group (gloo on CPUs).")
@click.option(
    "--tp-sizes",
    default=",".join(map(str, DEFAULT_TP_SIZES)),
    show_default=True,
    help="Tensor-parallel degrees the solver may use inside nodes (as `plan` searches).",
)
@click.option(
    "--network-gbs",
    type=FiniteFloat(MIN_GBS, MAX_GBS),
    help="Per-device GB/s between nodes [default: a --measured type's network_gbs, else the nodes' "
    "NICs: InfiniBand or RoCE 25, else 12.5].",
)
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    type=click.Choice([str(k) for k in LayoutKind]),
    help="Layout family to consider (repeatable) [default: what `plan` searches: pipeline, data].",
)
@click.option("--master-addr", help="MASTER_ADDR [default: the step's first node].")
@click.option("--master-port", type=Count(1, 65535), help="MASTER_PORT [default: from job and step id].")
@click.option("--log-dir", type=PATH, help="Write DIR/rank-R.out and .err.")
@click.option(
    "--resume",
    type=PATH,
    metavar="DIR",
    help="Checkpoint directory: checked (writable, this model's), exported as SLURM_HETERO_CHECKPOINT; "
    "training resumes from its last checkpoint on whatever layout this step plans.",
)
@click.option(
    "--exec", "exec_command", is_flag=True, help="Replace the launcher with the command (no supervision)."
)
@click.option("--dry-run", is_flag=True, help="Print every rank's layout and environment; start nothing.")
@click.option(
    "--simulate",
    metavar="NODE:TYPE:N[,...]",
    help="With --dry-run: the allocation, outside Slurm; NODE may be a hostlist (gn[0001-1000]:a100_80g:8).",
)
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: print JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def launch_command(
    ctx: click.Context, /, model: str | None, measured: Path | None, command: tuple[str, ...], **opts: Any
) -> None:
    """Run COMMAND on every task of the step with the torch.distributed environment and this rank's
    layout (SLURM_HETERO_LAYOUT): srun slurm-hetero launch [--model M ...] -- python train.py

    The manual (environment, layout document, supervision, failure modes, exit codes) is
    docs/launch.md; --manual prints it."""
    from slurm_hetero.launch import early, supervise

    supervise.KEEP_HANDLERS_WHEN_ENDING = True  # this process ends with the rank
    if not opts["dry_run"] and not opts["exec_command"]:
        early.catch_early()  # a peer's failure or srun's SIGTERM while this rank still plans
    try:
        plan_options = launch_options(model, measured, opts)
        modes = {k: opts[k] for k in ("log_dir", "exec_command", "dry_run", "simulate", "as_json", "resume")}
        view = layout_view(model, plan_options)
        code = launch(plan_options, RunOptions(command, opts["inventory_path"], layout_view=view, **modes))
    finally:
        early.stop_catching()
    ctx.exit(code)
