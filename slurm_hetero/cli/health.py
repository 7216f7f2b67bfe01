"""`slurm-hetero health`, for slurm.conf `HealthCheckProgram` (or NHC): quiet and exit 0 when
healthy, else one line and exit 1 (docs/admin-guide.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click

from slurm_hetero.cli import TEXT, cli, from_file_option, inventory_option
from slurm_hetero.core.errors import HeteroError, InventoryError
from slurm_hetero.core.journal import audit
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.discover import devices_from_files, probe_each, this_node
from slurm_hetero.inventory.nodes import host_records
from slurm_hetero.node.health import HealthReport, check, drain_reason
from slurm_hetero.slurm.scontrol import show_node
from slurm_hetero.vendors import get_vendor


def _report(report: HealthReport, dry_run: bool, as_json: bool) -> None:
    journal = audit("slurm-hetero-health")  # health.check told the faults
    for action in report.actions:
        journal.info("node %s: %s %s", report.node, "would run" if dry_run else "ran", " ".join(action))
    reason = drain_reason(report.faults)
    if as_json:
        doc = {
            "node": report.node,
            "healthy": not report.faults,
            "faults": [str(f) for f in report.faults],
            "reason": reason if report.faults else None,
            "actions": [list(a) for a in report.actions],
            "dry_run": dry_run,
            "notes": list(report.notes),
        }
        click.echo(json.dumps(doc))
    else:
        for note in report.notes:
            click.echo(f"slurm-hetero: {note}", err=True)
        for action in report.actions:
            click.echo(("would run: " if dry_run else "ran: ") + " ".join(action), err=True)
        if report.faults:
            click.echo(reason, err=True)
    if report.faults:
        raise SystemExit(1)


@cli.command("health")
@inventory_option(
    help="Cluster inventory (the one gres.conf was rendered from).",
    default=inventory.DEFAULT_INVENTORY,
    show_default=True,
)
@click.option("--node", "node_name", help="NodeName (default: $SLURMD_NODENAME, else the short host name).")
@click.option("--vendor", "vendors", multiple=True, help="Only this vendor (repeatable), as discover.")
@from_file_option(help="Check captured tool output instead of running the tool (repeatable).")
@click.option(
    "--model",
    type=TEXT,
    help="With --vendor and --from-file: the model where the captures name none, as discover.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be drained or resumed; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="One JSON line.")
def health(inventory_path: Path, vendors: tuple[str, ...], from_files: tuple[Path, ...], **o: Any) -> None:
    """Compare the node's devices with the inventory; drain it (reason `slurm-hetero: ...`) on a
    missing or unhealthy device or a vendor tool that cannot ask them, resume it when it is
    healthy again (only its own drains)."""
    name = this_node(o["node_name"])
    expected = host_records(inventory.load(inventory_path), [name]).get(name)
    if expected is None:
        raise InventoryError(f"node {name} is not in {inventory_path}; pass --node NAME or re-render")
    present = sorted({d.vendor for d in expected.devices})
    if stray := [get_vendor(v).name for v in vendors if v not in present]:  # an unknown name: its error
        raise InventoryError(
            f"--vendor {stray[0]}: {name} has no {stray[0]} devices in {inventory_path} ({present})"
        )
    wanted = vendors or tuple(present)
    if o["model"] is not None and not from_files:
        raise InventoryError("--model names the model of captured devices; use it with --from-file")
    failed: dict[str, HeteroError] = {}
    if from_files:
        found = devices_from_files(vendors, from_files, load_catalog(), o["model"])
        # captures answer for the vendor they are of (discover's sniff without --vendor)
        if stray := sorted({v.name for v, _ in found} - set(present)):
            raise InventoryError(
                f"the captures are of {stray[0]}; {name} has no {stray[0]} devices ({present})"
            )
        wanted = vendors or tuple(sorted({v.name for v, _ in found}))
    else:
        found, failed = probe_each([get_vendor(v) for v in wanted])
    devices = [d for _, ds in found for d in ds]
    unasked = {v: str(e).removeprefix(f"{v}: ") for v, e in failed.items()}  # the faults name the vendor
    # the node's other vendors were not asked: their devices are not checked, nor is a drain lifted
    expected = dataclasses.replace(expected, devices=tuple(d for d in expected.devices if d.vendor in wanted))
    if from_files and not any(d.links for d in devices):
        # captures without a topology listing (nvidia-smi --query-gpu) show no links: unknown, not down
        expected = dataclasses.replace(
            expected, devices=tuple(dataclasses.replace(d, links=()) for d in expected.devices)
        )
    whole = set(wanted) == set(present)
    report = check(name, expected, devices, show_node, o["dry_run"], unasked, whole)
    _report(report, o["dry_run"], o["as_json"])
