"""`slurm-hetero report`: what the cluster did in a time window, by device type."""

from __future__ import annotations

import json
import os
import pwd
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import click

from slurm_hetero.accounting import report
from slurm_hetero.cli import PATH, TEXT, cli, inventory_option, plots
from slurm_hetero.cli.catalog import render_table
from slurm_hetero.core.errors import ConfigError, HeteroError, InventoryError
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.nodes import slurm_nodes
from slurm_hetero.slurm import sacct
from slurm_hetero.slurm.scontrol import show_node_gres

_RELATIVE = re.compile(r"now-(\d+)([dhm])")


def parse_when(value: str, now: datetime) -> datetime:
    """`2026-11-01`, `2026-11-01T08:00[:00]` or `now-7d` / `now-12h` / `now-30m` / `now`."""
    if value == "now":
        return now
    if m := _RELATIVE.fullmatch(value):
        unit = {"d": "days", "h": "hours", "m": "minutes"}[m.group(2)]
        try:
            return now - timedelta(**{unit: int(m.group(1))})
        except OverflowError:
            raise HeteroError(f"{value}: too far back; give a date after year 1") from None
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d"):
        try:
            return datetime.strptime(value, fmt)
        except ValueError:
            continue
    raise HeteroError(f"cannot read time {value!r}; give 2026-11-01, 2026-11-01T08:00 or now-7d")


# the admin guide's section on accounting, named by its title (a number moves when sections do)
ACCOUNTING_SECTION = "Accounting by device type, the usage report and metrics"
EPOCH = datetime(1970, 1, 1)  # Slurm keeps times as Unix time: sacct refuses anything before


def window(since: str, until: str, now: datetime) -> tuple[datetime, datetime]:
    """[start, end) of --since/--until; an end past now is clamped to now (capacity after now would
    dilute every share), a start before 1970 or not before the end is refused."""
    start, end = parse_when(since, now), min(parse_when(until, now), now)
    if start < EPOCH:
        raise HeteroError(f"--since {since}: before 1970-01-01, where Slurm's accounting starts")
    if start >= end:
        raise HeteroError(f"--since {since} is not before --until {until} (nor before now)")
    return start, end


def accounting_config() -> dict[str, str]:
    """slurmctld's settings, refused in one line when Slurm keeps no accounting."""
    config = sacct.config()
    storage = config.get("AccountingStorageType", "")
    if not storage or storage.endswith("/none"):
        raise ConfigError(
            "Slurm keeps no job accounting (AccountingStorageType="
            f"{storage or 'unset'}); set AccountingStorageType=accounting_storage/slurmdbd with a running "
            "slurmdbd and the AccountingStorageTRES line of slurm-nodes.conf (docs/admin-guide.md, "
            f'"{ACCOUNTING_SECTION}")'
        )
    return config


def check_tres(config: dict[str, str], types: list[str]) -> None:
    tracked = set(config.get("AccountingStorageTRES", "").split(","))
    if missing := [t for t in types if f"gres/gpu:{t}" not in tracked]:
        raise ConfigError(
            f"AccountingStorageTRES does not name gres/gpu:{missing[0]}"
            + (f" (and {len(missing) - 1} more types)" if len(missing) > 1 else "")
            + ", so Slurm records no usage by type; set in slurm.conf the AccountingStorageTRES line that "
            "gres render writes (commented) into slurm-nodes.conf, merged with yours; scontrol reconfigure"
        )


def sees_every_job(config: dict[str, str]) -> bool:
    """Whether PrivateData lets this user see other users' jobs (root and SlurmUser always do)."""
    if os.geteuid() == 0:
        return True
    me = pwd.getpwuid(os.geteuid()).pw_name
    if config.get("SlurmUser", "").split("(")[0] == me:
        return True
    private = sacct.dbd_config().get("PrivateData", "") + "," + config.get("PrivateData", "")
    return "jobs" not in private.replace(" ", "").split(",")


def refusals(log: str | None, config: dict[str, str]) -> tuple[list[sacct.Refusal] | None, str | None]:
    path = log or config.get("SlurmctldLogFile", "")
    if not path or path == "(null)":
        return None, "slurmctld logs to syslog here; pass --log FILE to count the hook's refusals"
    try:
        return sacct.parse_refusals(sacct.LogTail(path).lines()), None
    except HeteroError as e:
        if log:  # the file the user named: refused, as metrics does
            raise
        return None, f"refusals not counted: {e}"


@cli.command("report")
@inventory_option(
    help="The cluster inventory (device types, vendors, memory).",
    default=inventory.DEFAULT_INVENTORY,
    show_default=True,
)
@click.option("--since", default="now-7d", show_default=True, help="Start: 2026-11-01[T08:00] or now-7d.")
@click.option("--until", default="now", show_default=True, help="End (exclusive), same forms.")
@click.option("--by", type=click.Choice(report.GROUPINGS), default="type", show_default=True)
@click.option(
    "--log",
    "log_path",
    type=TEXT,
    help="slurmctld's log for the hook's refusals (default: SlurmctldLogFile).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--plot", type=PATH, help="Also draw the report into FILE (*.png, *.svg or *.pdf).")
def report_command(since: str, until: str, plot: Path | None, **o: Any) -> None:
    """Device-hours and share of capacity per type, queue wait, stranded gpumem, the hook's rewrites
    and refusals, and jobs off their user's usual type, from sacct and the inventory."""
    now = datetime.now().replace(microsecond=0)
    start, end = window(since, until, now)
    if plot is not None:
        plots.check_path(plot)  # before sacct runs
    doc, notes = gather(o["inventory_path"], start, end, now, o["by"], o["log_path"])
    if end == now and until != "now":
        notes.insert(0, f"--until {until} is past now: the report ends now ({doc['until']})")
    for note in notes:
        click.echo(f"slurm-hetero: {note}", err=True)
    if plot is not None:
        plots.draw(doc, plot)
    click.echo(json.dumps(doc, indent=1) if o["as_json"] else report.render_text(doc, render_table))


def gather(
    inventory_path: Path, start: datetime, end: datetime, now: datetime, by: str, log_path: str | None
) -> tuple[dict, list[str]]:
    nodes = slurm_nodes(inventory.load(inventory_path), load_catalog())
    caps = report.capacity(nodes)
    config = accounting_config()
    check_tres(config, list(caps))
    if differ := report.disagreement(inventory_path, nodes, show_node_gres([])):
        raise InventoryError(differ)
    found, note = refusals(log_path, config)
    notes = [note] if note else []
    private = not sees_every_job(config)
    if private:
        notes.append("Slurm's PrivateData=jobs shows you only your own jobs: the figures cover those")
    jobs = sacct.with_queued_comments(sacct.jobs(start, end))
    doc = report.build(jobs, found, caps, start, end, now, by)
    if not doc["jobs"] and not (doc["refusals"] or {}):
        if private:
            raise HeteroError(
                f"none of your jobs between {doc['since']} and {doc['until']}, and Slurm's PrivateData=jobs "
                "shows you only your own; run as root or SlurmUser to see every job, or widen --since/--until"
            )
        raise HeteroError(f"no jobs between {doc['since']} and {doc['until']}; widen --since/--until")
    return doc, notes
