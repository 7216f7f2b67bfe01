"""`slurm-hetero task-prolog`: run by slurmd as TaskProlog; prints `export NAME=value` lines."""

from __future__ import annotations

import os
from pathlib import Path

import click

from slurm_hetero import inventory
from slurm_hetero.catalog import load_catalog
from slurm_hetero.cli import cli
from slurm_hetero.config import load_settings
from slurm_hetero.errors import HeteroError
from slurm_hetero.model import SlurmNode
from slurm_hetero.nodes import NodeBuilder, host_records
from slurm_hetero.slurm.jobenv import read_task_env
from slurm_hetero.taskprolog import SharingLimits, export_lines
from slurm_hetero.vendors import vendor_traits

DEFAULT_INVENTORY = Path("/etc/slurm-hetero/inventory.yaml")
HAMI_CORE = "/usr/local/vgpu/libvgpu.so"


def _find_node(path: Path, name: str, include_unhealthy: bool) -> SlurmNode:
    record = host_records(inventory.load(path), [name]).get(name)
    if record is None:
        raise HeteroError(f"node {name} is not in {path}")
    return NodeBuilder(load_catalog(), vendor_traits(), include_unhealthy).node(record)


@cli.command(name="task-prolog")
@click.option(
    "--inventory",
    "inventory_path",
    type=click.Path(path_type=Path),
    envvar="SLURM_HETERO_INVENTORY",
    default=DEFAULT_INVENTORY,
    show_default=True,
    help="Cluster inventory used to render gres.conf.",
)
@click.option("--include-unhealthy", is_flag=True, help="Match a gres render done with --include-unhealthy.")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="Suite config (sharing.shard_size gives shard limits; default: the usual layers).",
)
@click.option(
    "--hami-core-library",
    default=HAMI_CORE,
    show_default=True,
    help="HAMi-core's library; its limits are exported when the file exists.",
)
@click.option(
    "--strict", is_flag=True, help="Fail the task on errors (default: warn on stderr, export nothing)."
)
def task_prolog(
    inventory_path: Path,
    include_unhealthy: bool,
    config_path: Path | None,
    hami_core_library: str,
    strict: bool,
) -> None:
    """Export the vendor's visible-device variable for this task's GPUs and the limits of a shard
    allocation (Slurm TaskProlog protocol: `export NAME=value` lines)."""
    try:
        task = read_task_env(os.environ)
        if not task.devices.gpu_indexes:
            return  # no GPUs on this node for this task: nothing to export
        if task.node_name is None:
            raise HeteroError("SLURMD_NODENAME is not set (slurmd sets it for a TaskProlog)")
        node = _find_node(inventory_path, task.node_name, include_unhealthy)
        library = hami_core_library if os.path.exists(hami_core_library) else None
        sharing = SharingLimits(load_settings(config_path).shares, library)
        lines = export_lines(task, node, sharing)
    except Exception as e:  # a TaskProlog that fails would fail the user's task
        if strict:
            raise
        click.echo(f"slurm-hetero task-prolog: {e}; no visible-device variable exported", err=True)
        return
    for line in lines:
        click.echo(line)
