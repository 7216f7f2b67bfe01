"""`slurm-hetero discover`: one node's inventory, live or from captured tool output."""

from __future__ import annotations

from pathlib import Path

import click

from slurm_hetero import inventory
from slurm_hetero.catalog import load_catalog
from slurm_hetero.cli import cli
from slurm_hetero.discover import discover_node
from slurm_hetero.model import ClusterInventory
from slurm_hetero.vendors import all_vendors


def _list_vendors() -> None:
    for vendor in all_vendors():
        state = vendor.unavailable_reason or ("available" if vendor.affinity() > 0 else "tools not found")
        click.echo(f"{vendor.name:<10} {','.join(vendor.tools) or '-':<24} {state}")


@cli.command()
@click.option(
    "--vendor", "vendors", multiple=True, help="Only this vendor (repeatable); fails if it cannot run."
)
@click.option(
    "--from-file",
    "from_files",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Parse captured tool output instead of running the tool (repeatable).",
)
@click.option(
    "--node",
    "node_name",
    help="NodeName to record (default: $SLURMD_NODENAME under srun, else the short host name).",
)
@click.option(
    "--models-dir",
    "models_dirs",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Extra catalog directory with site models (*.yaml).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON line (safe to collect from many srun tasks).")
@click.option("--list-vendors", is_flag=True, help="List registered vendors and whether they can run here.")
def discover(
    vendors: tuple[str, ...],
    from_files: tuple[Path, ...],
    node_name: str | None,
    models_dirs: tuple[Path, ...],
    as_json: bool,
    list_vendors: bool,
) -> None:
    """Read this node's accelerators and topology into an inventory (YAML, or JSON with --json)."""
    if list_vendors:
        return _list_vendors()
    node = discover_node(load_catalog(models_dirs), vendors, from_files, node_name)
    text = inventory.dumps(ClusterInventory(nodes=(node,)), as_json=as_json)
    click.echo(text.replace("\n", "") if as_json else text, nl=as_json)
