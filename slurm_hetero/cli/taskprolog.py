"""`slurm-hetero task-prolog`, slurmd's TaskProlog: prints `export NAME=value` lines.

It runs as the job's user, in the job's environment, before every task, so it never fails the
task and never lets that environment steer it. A problem becomes a `print` line and a syslog line;
nothing goes to stderr, which slurmstepd parses with stdout.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path

import click

from slurm_hetero.cli import cli
from slurm_hetero.core.errors import HeteroError
from slurm_hetero.core.journal import syslog_handler
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.config import load_settings
from slurm_hetero.inventory.nodes import NodeBuilder, host_records
from slurm_hetero.node.taskprolog import SharingLimits, export_lines, protocol_lines
from slurm_hetero.slurm import syntax
from slurm_hetero.slurm.jobenv import read_task_env
from slurm_hetero.vendors import vendor_traits

HAMI_CORE = "/usr/local/vgpu/libvgpu.so"
logger = logging.getLogger(__name__)
_option = functools.partial(click.option, allow_from_autoenv=False)  # never the job's environment


def exports(
    env: Mapping[str, str],
    inventory_path: Path,
    include_unhealthy: bool,
    config_path: Path | None,
    hami_core_library: str,
) -> list[str]:
    task = read_task_env(env)
    if not task.devices.gpu_indexes:
        return []
    if task.node_name is None:
        raise HeteroError("SLURMD_NODENAME is not set (slurmd sets it for a TaskProlog)")
    record = host_records(inventory.load(inventory_path), [task.node_name]).get(task.node_name)
    if record is None:
        raise HeteroError(f"node {syntax.text(task.node_name, 60)} is not in {inventory_path}")
    node = NodeBuilder(load_catalog(), vendor_traits(), include_unhealthy).node(record)
    library = hami_core_library if os.path.isfile(hami_core_library) else None
    sharing = SharingLimits(load_settings(config_path, user_layers=False).scoring.shares, library)
    return export_lines(task, node, sharing)


def _quiet_logging() -> None:
    """Every log record to syslog (or nowhere), never stderr."""
    warnings.simplefilter("ignore")
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(syslog_handler("slurm-hetero-task-prolog") or logging.NullHandler())
    root.setLevel(logging.WARNING)
    logging.raiseExceptions = False  # a handler that fails must not print a traceback


@cli.command(name="task-prolog")
@_option(
    "--inventory",
    "inventory_path",
    default=str(inventory.DEFAULT_INVENTORY),
    show_default=True,
    help="Cluster inventory used to render gres.conf.",
)
@_option("--include-unhealthy", is_flag=True, help="Match a gres render done with --include-unhealthy.")
@_option(
    "--config",
    "config_path",
    help="Suite config (sharing.shard_size gives shard limits; default: /etc/slurm-hetero layers).",
)
@_option(
    "--hami-core-library",
    default=HAMI_CORE,
    show_default=True,
    help="HAMi-core's library; its limits are exported when the file exists.",
)
@_option(
    "--strict",
    is_flag=True,
    help="Fail the task on errors (default: warn in the task's output and syslog, export nothing).",
)
def task_prolog(
    inventory_path: str,
    include_unhealthy: bool,
    config_path: str | None,
    hami_core_library: str,
    strict: bool,
) -> None:
    """Export the vendor's visible-device variable for this task's GPUs and the limits of a shard
    allocation (Slurm TaskProlog protocol: `export NAME=value` and `print ...` lines on stdout)."""
    _quiet_logging()
    problems: list[str] = []
    try:
        config = Path(config_path) if config_path else None
        env = dict(os.environ)
        lines = exports(env, Path(inventory_path), include_unhealthy, config, hami_core_library)
    except Exception as e:  # noqa: BLE001 - a TaskProlog that fails would fail the user's task
        if strict:
            raise
        lines = []
        problems.append(
            f"{e if isinstance(e, HeteroError) else type(e).__name__}; no visible-device variable exported"
        )
    out, notes = protocol_lines(lines, problems)
    for note in notes:
        logger.warning("job %s: %s", syntax.text(os.environ.get("SLURM_JOB_ID", "?"), 20), note)
    try:
        sys.stdout.write("".join(f"{line}\n" for line in out))
        sys.stdout.flush()
    except (OSError, ValueError):
        pass  # slurmstepd went away: nobody to tell
