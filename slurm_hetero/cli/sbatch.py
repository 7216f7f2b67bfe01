"""`slurm-hetero sbatch`: sbatch with the job's request checked by the job_submit hook's own
decision, and sized by the fit engine when a model is given; sbatch is exec'd with an argv.

    slurm-hetero sbatch [WRAPPER OPTIONS] [--] [SBATCH OPTIONS] [: SBATCH OPTIONS...] script.sh [ARGS]

`--` ends the wrapper's options (needed before an sbatch option it also has, such as --batch).
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from slurm_hetero.cli import TEXT, cli, inventory_option
from slurm_hetero.cli.fit import breakdown, fit_options
from slurm_hetero.cli.submit import compiled, hook_release, inventory_nodes, settings_hook
from slurm_hetero.core.errors import ConfigError, HeteroError, ToolError
from slurm_hetero.core.model import SlurmNode
from slurm_hetero.core.readfile import MAX_CONFIG_BYTES, read_text
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.config import load_settings
from slurm_hetero.inventory.document import DEFAULT_INVENTORY
from slurm_hetero.inventory.modelconfigs import load_model, sequence_length
from slurm_hetero.launch.slurmnodes import gres_records
from slurm_hetero.slurm import scontrol
from slurm_hetero.slurm.sbatchargs import Option, component_options, script_options, split_command_line
from slurm_hetero.submit.hook import read_hosts
from slurm_hetero.submit.sbatchplan import (
    Decision,
    SbatchPlanError,
    Suggestion,
    check_gpumem,
    component,
    hook_check,
    merged_argv,
    plan_model,
    sent_jobs,
    undecided,
)


def cluster_nodes(inventory_path: Path | None) -> list[SlurmNode]:
    """The cluster's nodes: --inventory (or SLURM_HETERO_INVENTORY), else the installed inventory,
    else Slurm's own view (`scontrol show node`) with the catalog's device facts."""
    path = inventory_path or (DEFAULT_INVENTORY if DEFAULT_INVENTORY.exists() else None)
    if path is not None:
        return inventory_nodes(path)
    try:
        gres = scontrol.show_node_gres(())
    except ToolError as e:
        raise ConfigError(
            f"no inventory installed ({DEFAULT_INVENTORY}) and asking Slurm for its nodes failed ({e}); "
            "pass --inventory FILE"
        ) from e
    return list(gres_records(gres, list(gres), load_catalog(), need_facts=True).values())


def _estimates(
    model: str, options: dict[str, Any], explicit: frozenset[str] = frozenset()
) -> tuple[str, list[Suggestion]]:
    """The model's per-device bytes on n devices as `fit` computes them (and with ZeRO-3 as a second
    suggestion). Inference spreads over all n devices (tp = n) unless the user gave --tp/--pp
    (`explicit`): then tp x pp must divide n and the rest are replicas (fit's inference has no pp)."""
    spec = load_model(model)
    options = dict(options)
    options["seq"] = sequence_length(spec, options["seq"], model, options.pop("beyond_context"))
    fixed = options["mode"] == "infer" and bool(explicit & {"tp", "pp"})
    if fixed and options["pp"] > 1:
        raise HeteroError("--pp applies to training; inference is sized with --tp (tensor parallel) alone")

    def bytes_at(o: dict[str, Any]) -> Any:
        def estimate(devices: int) -> float | None:
            if fixed and devices % (o["tp"] * o["pp"]):
                return None
            b = breakdown(spec, o, None if fixed else devices)
            return None if b is None else b.total

        return estimate

    out = [Suggestion("", bytes_at(options))]
    if options["mode"] == "train" and options["zero"] < 3:
        out.append(Suggestion("with --zero 3", bytes_at({**options, "zero": 3})))
    return spec.name, out


HOST_OPTIONS = {"nodelist": "-w/--nodelist", "exclude": "-x/--exclude"}


def _hosts_read(options: list[Option]) -> list[Option]:
    """The options with a -w/-x host file read as sbatch reads it (the argv keeps the file name)."""
    return [
        replace(o, value=read_hosts(HOST_OPTIONS[o.name], o.value)) if o.name in HOST_OPTIONS else o
        for o in options
    ]


def plan(
    sbatch_args: tuple[str, ...],
    model: str | None,
    options: dict[str, Any],
    nodes: list[SlurmNode],
    release: str = "22.05",
    explicit: frozenset[str] = frozenset(),
) -> tuple[list[str], list[Decision]]:
    """The sbatch argv and each component's decision; `explicit`: the fit options the user gave."""
    line = split_command_line(sbatch_args)
    if line.script is None and not line.wraps:
        raise HeteroError(
            "give the job script as a file (the wrapper reads its #SBATCH lines), or use --wrap"
        )
    script: list[list[Option]] = []
    if line.script is not None:
        text = read_text(Path(line.script), MAX_CONFIG_BYTES, "job script", ConfigError)
        script = script_options(text, line.script)
    parts = [_hosts_read(options) for options in component_options(script, os.environ, line)]
    settings = load_settings(None)  # the model and hook as `request explain` builds them
    cluster = compiled(nodes, settings)
    hook = settings_hook(cluster, settings, release)
    components = [component(k, opts, hook, het=len(parts) > 1) for k, opts in enumerate(parts)]
    tail = [] if line.script is None else (["--"] if line.script.startswith("-") else []) + [line.script]
    given = [c.options.get("gres") for c in components]
    jobs = sent_jobs(components, given, cluster, hook, release)
    if jobs is None:  # sbatch's own refusal: nothing decided
        argv = merged_argv(line.components, [], [*tail, *line.script_args])
        return argv, [undecided(c) for c in components]
    if model is None:
        decisions = [check_gpumem(c, cluster.types) for c in components]
    else:
        name, suggestions = _estimates(model, options, explicit)
        given_layout = " ".join(f"--{k} {options[k]}" for k in ("tp", "pp") if k in explicit)  # for its error
        decisions = plan_model(components, cluster.types, name, suggestions, given_layout)
        gres = [d.gres if d.gres is not None else g for d, g in zip(decisions, given)]
        jobs = sent_jobs(components, gres, cluster, hook, release)  # with the gpumem --model added
    if jobs is not None:
        decisions = hook_check(components, decisions, jobs, hook)
    return merged_argv(line.components, decisions, [*tail, *line.script_args]), decisions


def _rows(decisions: list[Decision]) -> list[dict[str, Any]]:
    """`--json`'s components, the hook's decision as `request explain --json` prints it."""
    return [
        {
            "component": d.index,
            "devices": d.devices,
            "gres": d.gres,
            "per_device_bytes": d.need_bytes,
            "decision": None if d.hook is None else d.hook.as_dict(),
        }
        for d in decisions
    ]


@cli.command(
    name="sbatch",
    # -h only as --help: sbatch options glue values (-Jhello), which click would read as holding -h
    context_settings={
        "ignore_unknown_options": True,
        "allow_interspersed_args": False,
        "help_option_names": ["--help"],
    },
)
@click.option(
    "--model", type=TEXT, help="Bundled model name or a Hugging Face config.json: size the request."
)
@fit_options(layout=False)
@inventory_option(
    help=f"Cluster inventory [default: {DEFAULT_INVENTORY} if installed, else scontrol show node].",
    envvar="SLURM_HETERO_INVENTORY",
)
@click.option(
    "--slurm-release",
    type=TEXT,
    help="The sbatch whose job_desc the hook check models (YY.MM) [default: scontrol --version's].",
)
@click.option("--dry-run", "--print", "dry_run", is_flag=True, help="Print the sbatch command; run nothing.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the sbatch argv and the decisions as JSON; run nothing."
)
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
def sbatch_cmd(
    model: str | None,
    inventory_path: Path | None,
    slurm_release: str | None,
    dry_run: bool,
    as_json: bool,
    sbatch_args: tuple[str, ...],
    **options: Any,
) -> None:
    """Submit SBATCH_ARGS... SCRIPT [ARGS...] after checking (and with --model sizing) its request."""
    context = click.get_current_context()
    explicit = frozenset(
        k for k in options if context.get_parameter_source(k) is not click.core.ParameterSource.DEFAULT
    )
    release = hook_release(slurm_release)
    try:
        argv, decisions = plan(sbatch_args, model, options, cluster_nodes(inventory_path), release, explicit)
    except HeteroError as e:
        if as_json:  # every refusal as JSON too; the error line and its exit code as ever
            rows = _rows(e.decisions) if isinstance(e, SbatchPlanError) else []
            click.echo(json.dumps({"ok": False, "message": str(e), "argv": None, "components": rows}))
        raise
    for d in decisions:
        if d.note:
            click.echo(f"slurm-hetero: {d.note}", err=True)
    if as_json:
        click.echo(json.dumps({"ok": True, "message": "", "argv": argv, "components": _rows(decisions)}))
    elif dry_run:
        click.echo(shlex.join(argv))
    else:
        os.execvp("sbatch", argv)  # hand over; sbatch's exit code is ours
