"""`slurm-hetero inventory merge|show`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from slurm_hetero.cli import PATH, cli, models_dir_option
from slurm_hetero.core.writefile import write_atomic
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.nodes import slurm_nodes


@cli.group(name="inventory")
def inventory_group() -> None:
    """Merge and check inventories."""


@inventory_group.command()
@click.argument("files", nargs=-1, required=True, type=PATH)
@click.option("-o", "--output", type=PATH, help="Write here (atomically) instead of stdout.")
@click.option("--no-fold", is_flag=True, help="Keep one record per node instead of folding identical nodes.")
@click.option("--json", "as_json", is_flag=True, help="Write JSON (fast to read for big clusters).")
def merge(files: tuple[Path, ...], output: Path | None, no_fold: bool, as_json: bool) -> None:
    """Merge node inventories (YAML, JSON, or JSON lines from `srun ... discover --json`)."""
    parts = [inv for path in files for inv in inventory.load_many(path)]
    merged = inventory.merge(parts, fold_identical=not no_fold)
    text = inventory.dumps(merged, as_json=as_json or (output is not None and output.suffix == ".json"))
    if output is None:
        click.echo(text, nl=False)
    else:
        write_atomic({output: text})
        click.echo(f"wrote {output}: {len(merged.nodes)} records", err=True)


@inventory_group.command()
@click.argument("file", type=PATH)
@models_dir_option(help="Site catalog dir.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def check(file: Path, models_dirs: tuple[Path, ...], as_json: bool) -> None:
    """Validate an inventory as every command reads it (schema, Slurm syntax, one record per
    host, known vendors and catalog types, unhealthy devices too) and print a one-line summary."""
    inv = inventory.load(file)
    slurm_nodes(inv, load_catalog(models_dirs), include_unhealthy=True)
    summary = {
        "file": str(file),
        "ok": True,
        "records": len(inv.nodes),
        "devices": sum(len(n.devices) for n in inv.nodes),
    }
    click.echo(
        json.dumps(summary)
        if as_json
        else f"{file}: ok, {summary['records']} node records, {summary['devices']} device records"
    )
