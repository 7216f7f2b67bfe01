"""`slurm-hetero gres render`: gres.conf + slurm-nodes.conf from a cluster inventory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from slurm_hetero.cli import PATH, TEXT, checked, cli, config_option, inventory_option, models_dir_option
from slurm_hetero.cli.options import Count
from slurm_hetero.cli.outputset import allow_removal_option, check_or_write, echo_summary, keep_backups_option
from slurm_hetero.core import proc
from slurm_hetero.core.errors import RequestError
from slurm_hetero.core.journal import audit
from slurm_hetero.core.units import parse_size
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.config import load_settings
from slurm_hetero.render.context import POLICIES, LocalSlurmd, RenderOptions, build_context
from slurm_hetero.render.templates import DEFAULT_SLURM_RELEASE, release_key, render_configs
from slurm_hetero.slurm import syntax


def parse_shares(specs: tuple[str, ...]) -> dict[str, int]:
    """`l40s=4G` -> {"l40s": 4096} (MiB of one shard)."""
    out = {}
    for spec in specs:
        gres_type, sep, size = spec.partition("=")
        if not sep or not gres_type:
            raise RequestError(spec, "--share wants TYPE=SIZE, e.g. l40s=4G")
        if gres_type in out:
            raise RequestError(f"--share {gres_type}", "given twice; give each type's shard size once")
        out[gres_type] = parse_size(size, f"--share {gres_type}")
    return out


def local_slurm_release() -> str:
    """The release of the Slurm here (`scontrol --version`), else DEFAULT_SLURM_RELEASE."""
    try:
        words = proc.run(["scontrol", "--version"], timeout=10).split()
        major, minor = release_key(words[-1]) if words else (0, 0)
    except Exception:  # no scontrol (ToolError), or an answer it cannot read
        return DEFAULT_SLURM_RELEASE
    return f"{major:02d}.{minor:02d}"


@cli.group()
def gres() -> None:
    """Generate Slurm GRES configuration."""


@gres.command()
@inventory_option(help="Cluster inventory (YAML, or JSON by extension).", required=True)
@click.option("--out", required=True, type=PATH, help="Directory for gres.conf, slurm-nodes.conf.")
@click.option(
    "--check", is_flag=True, help="Print a unified diff and exit 1 if the files would change; write nothing."
)
@click.option(
    "--policy",
    type=click.Choice(POLICIES),
    default="binpack",
    show_default=True,
    help="Node Weight policy: binpack (small, cheap devices first) or spread (LLN).",
)
@click.option(
    "--include-unhealthy", is_flag=True, help="Also render devices the vendor tool reported unhealthy."
)
@click.option(
    "--autodetect",
    is_flag=True,
    help="AutoDetect=nvml on NVIDIA nodes, rsmi on AMD ones: slurmd checks the rendered lines against "
    "what it detects (needs a slurmd built with NVML / ROCm SMI).",
)
@click.option("--template-dir", type=PATH, help="Override templates (same file names).")
@models_dir_option(help="Site catalog dir.")
@click.option("--local-slurmd", "local_host", help="Dev cluster: every node is a slurmd on this host name.")
@click.option(
    "--port-base",
    type=Count(1, 65535),
    default=17001,
    show_default=True,
    help="Dev cluster: first slurmd port.",
)
@click.option(
    "--file-root", default="/dev/fakegpu", show_default=True, help="Dev cluster: fake device directory."
)
@click.option(
    "--share",
    "shares",
    multiple=True,
    metavar="TYPE=SIZE",
    help="Render shard GRES for TYPE, one shard per SIZE of device memory (e.g. l40s=4G); repeatable.",
)
@config_option(help="Suite config file (its sharing.shard_size applies; --share wins).")
@click.option(
    "--slurm-release",
    type=TEXT,
    metavar="YY.MM",
    help="Write for this Slurm release, e.g. 24.11 (default: `scontrol --version` here, else "
    f"{DEFAULT_SLURM_RELEASE}). After 22.05, gres.conf Cores= lists cover whole sockets.",
)
@allow_removal_option
@keep_backups_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def render(
    inventory_path: Path, out: Path, check: bool, local_host: str | None, slurm_release: str | None, **o: Any
) -> None:
    """Render gres.conf and slurm-nodes.conf (GresTypes, NodeName, PartitionName lines)."""
    source = click.get_current_context().get_parameter_source
    defaulted = (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)
    dev_only = [f"--{n.replace('_', '-')}" for n in ("port_base", "file_root") if source(n) not in defaulted]
    if dev_only and local_host is None:
        verb = "applies" if len(dev_only) == 1 else "apply"
        raise click.UsageError(f"{' and '.join(dev_only)} {verb} only with --local-slurmd (the dev cluster)")
    if slurm_release:
        release_key(slurm_release)  # a bad value stops here, before any work
    release = slurm_release or local_slurm_release()
    local = None
    if local_host is not None:  # as slurm.conf and gres.conf may hold them
        checked("--local-slurmd", syntax.host_name, local_host)
        checked("--file-root", syntax.device_file, o["file_root"])
        local = LocalSlurmd(local_host, o["port_base"], file_root=o["file_root"])
    shares = {**load_settings(o["config_path"]).scoring.shares, **parse_shares(o["shares"])}
    options = RenderOptions(o["policy"], o["include_unhealthy"], shares, local, autodetect=o["autodetect"])
    nodes = inventory.load(inventory_path, keep_identity=False)
    context = build_context(nodes, load_catalog(o["models_dirs"]), options)
    context["source"] = inventory_path.name
    journal = audit("slurm-hetero-render")
    for note in context["notes"]:
        click.echo(f"slurm-hetero: warning: {note}", err=True)
        if not check:
            journal.warning("%s: %s", inventory_path, note)
    texts = render_configs(context, o["template_dir"], release)
    written = check_or_write(texts, out, check, o["allow_removal"], o["keep_backups"])
    summary = {
        "nodes": context["node_count"],
        "shapes": context["shape_count"],
        "lines": sum(t.count("\n") for t in texts.values()),
        "written": [str(p) for p in written],
        "slurm_release": release,
    }
    line = f"{out}: {summary['nodes']} nodes in {summary['shapes']} shapes, {len(written)} file(s) changed"
    echo_summary(summary, o["as_json"], line)
