"""`slurm-hetero install`: the node install (`node.install`; docs/admin-guide.md)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from slurm_hetero.cli import PATH, TEXT, cli
from slurm_hetero.core.errors import HeteroError
from slurm_hetero.node.install import Layout, default_source, install, slurm_conf_value, uninstall


@cli.command("install")
@click.option(
    "--python", type=PATH, default=sys.executable, show_default="this Python", help="Interpreter of the venv."
)
@click.option(
    "--source", type=PATH, help="Checkout or wheel to install (default: the checkout this runs from)."
)
@click.option(
    "--inventory", "inventory_file", type=PATH, help="Install this inventory as SITE/inventory.yaml (0644)."
)
@click.option("--config", "config", type=TEXT, help="Suite config the TaskProlog reads (a path on the node).")
@click.option("--pip-option", "pip_options", multiple=True, help="Pass to pip (repeatable): --no-index, ...")
@click.option("--upgrade", is_flag=True, help="Replace an install: a new venv, the scripts then name it.")
@click.option(
    "--uninstall",
    "remove",
    is_flag=True,
    help="Remove what install wrote (once slurm.conf names none of it).",
)
@click.option(
    "--slurm-conf", "slurm_confs", type=PATH, multiple=True, help="slurm.conf(s) --uninstall checks."
)
@click.option("--prefix", type=PATH, default=Layout.prefix, show_default=True)
@click.option("--slurm-etc", type=PATH, default=Layout.etc, show_default=True, help="Where the scripts go.")
@click.option("--bin-dir", type=PATH, default=Layout.bin_dir, show_default=True)
@click.option(
    "--site-dir", type=PATH, default=Layout.site, show_default=True, help="Where the inventory goes."
)
@click.option("--json", "as_json", is_flag=True)
def install_command(
    python: Path, source: Path | None, upgrade: bool, remove: bool, as_json: bool, **o: Any
) -> None:
    """Install slurm-hetero for Slurm on this node: a venv under PREFIX/venvs, the TaskProlog and
    HealthCheckProgram scripts in SLURM_ETC and the command in BIN_DIR, all naming that venv."""
    layout = Layout(*(o[k].absolute() for k in ("prefix", "slurm_etc", "bin_dir", "site_dir")))
    if remove and upgrade:
        raise click.UsageError("--upgrade and --uninstall exclude each other; pass one")
    if remove:
        confs = list(o["slurm_confs"]) or [Path(os.environ.get("SLURM_CONF") or layout.etc / "slurm.conf")]
        lines = uninstall(layout, confs)
        click.echo(json.dumps({"uninstalled": lines}) if as_json else "\n".join(lines))
        return
    source = source or default_source()
    if source is None:
        raise HeteroError("this slurm-hetero does not run from a checkout; pass --source WHEEL_OR_CHECKOUT")
    manifest = install(
        layout,
        python.absolute(),
        source.absolute(),
        o["inventory_file"],
        o["config"],
        o["pip_options"],
        upgrade,
    )
    if as_json:
        click.echo(json.dumps(manifest))
        return
    click.echo(
        f"{'upgraded' if upgrade else 'installed'} slurm-hetero {manifest['version']} in {manifest['venv']}"
    )
    scripts = manifest["scripts"]
    click.echo(f"slurm.conf: TaskProlog={slurm_conf_value(Path(scripts['taskprolog']))}")
    click.echo(f"slurm.conf: HealthCheckProgram={slurm_conf_value(Path(scripts['health']))}")
