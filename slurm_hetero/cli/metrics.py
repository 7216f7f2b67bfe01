"""`slurm-hetero metrics`: Prometheus metrics by device type and vendor (`accounting.metrics`)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import click
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import Metric

from slurm_hetero.accounting import metrics
from slurm_hetero.accounting.report import capacity, disagreement
from slurm_hetero.cli import PATH, TEXT, checked, cli, inventory_option
from slurm_hetero.cli.options import Count
from slurm_hetero.core import proc
from slurm_hetero.core.errors import HeteroError, OutputError
from slurm_hetero.core.model import SlurmNode
from slurm_hetero.core.writefile import write_atomic
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.nodes import slurm_nodes
from slurm_hetero.slurm import sacct, syntax
from slurm_hetero.slurm.scontrol import parse_show_node


class ClusterCollector:
    """Collects one snapshot from scontrol, squeue (and the log) on every scrape. `serving`: a
    failed collection is `slurm_hetero_up 0` (so an alert can fire), not an HTTP 500."""

    def __init__(
        self, inventory_path: Path, nodes: list[SlurmNode], log: str | None, serving: bool = False
    ) -> None:
        self.inventory_path, self.nodes, self.serving = inventory_path, nodes, serving
        self.vendors = {t: c.vendor for t, c in capacity(nodes).items()}
        self.checked = False  # whether the inventory was compared with Slurm's nodes (once)
        self.log = sacct.LogTail(log) if log else None
        self.decisions: Counter[tuple[str, str]] = Counter()  # kept between scrapes: a counter

    def collect(self) -> Iterator[Metric]:
        try:
            snap = metrics.Snapshot()
            text = proc.run(metrics.SCONTROL, timeout=metrics.SLURM_TIMEOUT_S)
            metrics.read_nodes(text, snap)
            if not self.checked:  # a type the inventory lacks is vendor="unknown": say why, once
                self.checked = True
                slurm = {n.name: n for n in parse_show_node(text)}
                if differ := disagreement(self.inventory_path, self.nodes, slurm):
                    print(f"slurm-hetero: warning: {differ}", file=sys.stderr, flush=True)
            metrics.read_pending(proc.run(metrics.SQUEUE, timeout=metrics.SLURM_TIMEOUT_S), snap)
            if self.log:
                metrics.count_decisions(self.log.lines(), self.decisions)
                snap.decisions = self.decisions
        except HeteroError as e:
            if not self.serving:
                raise
            print(f"slurm-hetero: metrics not collected: {e}", file=sys.stderr, flush=True)
            yield metrics.up(False)
            return
        yield metrics.up(True)
        yield from metrics.families(snap, self.vendors)


def registry(inventory_path: Path, log: str | None, serving: bool = False) -> CollectorRegistry:
    nodes = slurm_nodes(inventory.load(inventory_path), load_catalog())
    found = CollectorRegistry()
    found.register(ClusterCollector(inventory_path, nodes, log, serving))  # type: ignore[arg-type]
    return found


@cli.command("metrics")
@inventory_option(
    help="The cluster inventory (vendor of each type).",
    default=inventory.DEFAULT_INVENTORY,
    show_default=True,
)
@click.option(
    "--log", "log_path", type=TEXT, help="slurmctld's log: also count the hook's rewrites and refusals."
)
@click.option("--textfile", type=PATH, help="Write FILE (*.prom) for node_exporter.")
@click.option("--serve", "port", type=Count(1, 65535), help="Serve /metrics on PORT (not with --textfile).")
@click.option("--address", default="0.0.0.0", show_default=True, help="Address --serve listens on.")
def metrics_command(
    inventory_path: Path, log_path: str | None, textfile: Path | None, port: int | None, address: str
) -> None:
    """Devices total, allocated and drained, pending jobs and their gpumem, per type and vendor.
    Prints them once, writes --textfile, or serves them (--serve; not with --textfile)."""
    if textfile is not None and port is not None:
        raise click.UsageError("--serve and --textfile exclude each other; pass one")
    checked("--address", syntax.address, address)
    if textfile is not None and textfile.suffix != ".prom":  # node_exporter reads *.prom only
        raise OutputError(
            f"--textfile {textfile}: node_exporter's textfile collector reads *.prom only; name it so"
        )
    if textfile is not None and not textfile.parent.is_dir():
        raise OutputError(f"--textfile {textfile}: no directory {textfile.parent}; create it or name another")
    if log_path:
        sacct.LogTail(log_path).check()  # unreadable: one line now, not an error on every scrape
    found = registry(inventory_path, log_path, serving=port is not None)
    if port is not None:
        try:
            start_http_server(port, addr=address, registry=found)
        except OSError as e:
            raise OutputError(f"cannot serve on {address}:{port}: {e.strerror or e}") from None
        while True:
            time.sleep(3600)
    text = generate_latest(found).decode()
    if textfile is not None:
        write_atomic({textfile: text}, backup=False)
    else:
        click.echo(text, nl=False)
