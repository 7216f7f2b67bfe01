"""`slurm-hetero job-submit render` (the hook and its data table) and `slurm-hetero request
explain` (what the hook does with a request: job_submit.lua itself, run through lupa)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from slurm_hetero.cli import PATH, cli, config_option, inventory_option, models_dir_option
from slurm_hetero.cli.gres import local_slurm_release
from slurm_hetero.cli.options import Count, stacked
from slurm_hetero.cli.outputset import allow_removal_option, check_or_write, echo_summary, keep_backups_option
from slurm_hetero.core.errors import ConfigError
from slurm_hetero.core.model import SlurmNode
from slurm_hetero.core.readfile import MAX_CONFIG_BYTES, read_text
from slurm_hetero.engine.score import ClusterModel, compile_model
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.config import MAX_UID, Settings, check_for_cluster, exempt_uids, load_settings
from slurm_hetero.inventory.nodes import slurm_nodes
from slurm_hetero.render import removal
from slurm_hetero.render.templates import release_key
from slurm_hetero.submit.hook import (
    WRITTEN,
    Hook,
    Outcome,
    cluster_hook,
    lua_compile_error,
    read_hosts,
    render_script,
)
from slurm_hetero.submit.sbatch import gres_names, job_from_options
from slurm_hetero.submit.tables import (
    CHAIN_TEMPLATE,
    CHAINED_NAME,
    CLI_FILTER_NAME,
    CLI_SRUN_NAME,
    SCRIPT_NAME,
    TABLE_NAME,
    render_table,
)


def inventory_nodes(inventory_path: Path, models_dirs: tuple[Path, ...] = ()) -> list[SlurmNode]:
    return slurm_nodes(inventory.load(inventory_path, keep_identity=False), load_catalog(models_dirs))


def hook_release(given: str | None) -> str:
    """The sbatch to model (--slurm-release, else the local Slurm's), as one of the two measured:
    22.05 before 24.11, else 24.11."""
    return "24.11" if release_key(given or local_slurm_release()) >= (24, 11) else "22.05"


def compiled(nodes: list[SlurmNode], settings: Settings) -> ClusterModel:
    try:
        return compile_model(nodes, settings.scoring)
    except ValueError as e:
        raise ConfigError(str(e), ", ".join(settings.sources) or None) from e


def settings_hook(model: ClusterModel, settings: Settings, release: str) -> Hook:
    """The job_submit hook slurmctld runs for `model` under these settings (through lupa)."""
    return cluster_hook(model, exempt_uids(settings.exempt_users), settings.fail_policy, release)


_inventory_opt = inventory_option(help="Cluster inventory (YAML, or JSON by extension).", required=True)
_config_opt = config_option(
    help="Settings file on top of the usual layers (see slurm_hetero.inventory.config)."
)
_models_opt = models_dir_option(help="Site catalog directory.")


@cli.group("job-submit")
def job_submit() -> None:
    """The slurmctld job_submit hook (Lua) that rewrites gpumem/gpucore requests."""


@job_submit.command("render")
@_inventory_opt
@click.option("--out", required=True, type=PATH, help="Directory for the four files.")
@_config_opt
@_models_opt
@click.option("--table-path", help="Absolute table path to bake in (default: beside job_submit.lua).")
@click.option(
    "--hook-path",
    help=f"Absolute job_submit.lua path for {CLI_SRUN_NAME} to bake in (default: beside it).",
)
@click.option(
    "--srun-path",
    help=f"Absolute {CLI_SRUN_NAME} path for cli_filter.lua to bake in (default: beside it).",
)
@click.option(
    "--chain",
    "site_hook",
    help=f"The site's own job_submit.lua (absolute path, moved out of the way): job_submit.lua runs it and "
    f"ours ({CHAINED_NAME}); see docs/admin-guide.md.",
)
@click.option(
    "--chain-order",
    type=click.Choice(["site-first", "ours-first"]),
    help="With --chain: which hook sees the request first (default: site-first).",
)
@click.option("--check", is_flag=True, help="Print a unified diff and exit 1 if the files would change.")
@allow_removal_option
@keep_backups_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def render(inventory_path: Path, out: Path, hook_path: str | None, site_hook: str | None, **o: Any) -> None:
    """Write job_submit.lua, slurm_hetero_tables.lua, cli_filter.lua and slurm_hetero_srun.lua
    (install them in slurm.conf's directory, on the controller and on submit hosts;
    CliFilterPlugins=lua enables the last two). The table declares the nodes and device files it
    was compiled from; a render that drops some of them (an inventory cut short) is refused unless
    --allow-removal."""
    if o["chain_order"] is not None and site_hook is None:
        raise click.UsageError("--chain-order needs --chain SITE_HOOK")
    baked = [("--table-path", o["table_path"]), ("--hook-path", hook_path), ("--srun-path", o["srun_path"])]
    for option, path in [*baked, ("--chain", site_hook)]:
        if path is not None and not (path.startswith("/") and path.isprintable()):
            # slurmctld and the clients would resolve a relative path against their own directory
            raise ConfigError(f"{option} {path!r}: give an absolute path of printable characters")
    settings = load_settings(o["config_path"])
    nodes = inventory_nodes(inventory_path, o["models_dirs"])
    model = compiled(nodes, settings)
    check_for_cluster(settings, nodes, model.partitions)
    uids = exempt_uids(settings.exempt_users)
    declared = removal.declaration(nodes)
    table, ident = render_table(model, uids, settings.fail_policy, inventory_path.name, declared)
    script = render_script(
        SCRIPT_NAME, table_id=ident, fail_policy=settings.fail_policy, table_path=o["table_path"]
    )
    hooks = {SCRIPT_NAME: script}
    if site_hook is not None:
        _check_site_hook(Path(site_hook), out)
        hooks = {
            CHAINED_NAME: script,
            SCRIPT_NAME: render_script(
                SCRIPT_NAME,
                CHAIN_TEMPLATE,
                site_path=site_hook,
                ours_path=None,
                site_first=o["chain_order"] != "ours-first",
            ),
        }
        hook_path = hook_path or str((out / CHAINED_NAME).absolute())  # srun's half runs ours alone
    else:
        _check_not_a_site_hook(out / SCRIPT_NAME)
    # one set, renamed in this order: slurmctld reloads when job_submit.lua's mtime moves (the
    # table must be there first), and cli_filter.lua loads slurm_hetero_srun.lua
    files = {
        TABLE_NAME: table,
        **hooks,
        CLI_SRUN_NAME: render_script(CLI_SRUN_NAME, hook_path=hook_path),
        CLI_FILTER_NAME: render_script(CLI_FILTER_NAME, srun_path=o["srun_path"]),
    }
    written = check_or_write(files, out, o["check"], o["allow_removal"], o["keep_backups"])
    summary = {"table_id": ident, "types": len(model.types), "written": [str(p) for p in written]}
    line = f"{out}: table {ident} ({len(model.types)} device types), {len(written)} file(s) changed"
    echo_summary(summary, o["as_json"], line)


_OURS = "slurm_hetero"  # every hook file render writes names it; a site's own hook does not


def _check_site_hook(site_hook: Path, out: Path) -> None:
    if not site_hook.exists():
        raise ConfigError(
            f"--chain {site_hook}: no such file; give the site's job_submit.lua where you moved it"
        )
    for name in (SCRIPT_NAME, CHAINED_NAME, TABLE_NAME, CLI_SRUN_NAME, CLI_FILTER_NAME):
        if site_hook.resolve() == (out / name).resolve():
            raise ConfigError(
                f"--chain {site_hook}: render writes {name} there; move the site's hook first "
                f"(e.g. to {out / 'site_job_submit.lua'}); nothing changed"
            )
    try:  # bounded, and a FIFO or a device is refused, not read
        text = read_text(site_hook, MAX_CONFIG_BYTES, "site hook", ConfigError, errors="replace")
    except ConfigError as e:
        raise ConfigError(f"--chain {e}; nothing changed") from None
    if _OURS in text:
        raise ConfigError(
            f"--chain {site_hook}: that is slurm-hetero's own hook, not the site's; nothing changed"
        )
    if (error := lua_compile_error(site_hook)) is not None:
        # the chain would refuse every job until the site's hook loads: say so now
        raise ConfigError(f"--chain {site_hook}: Lua 5.1 cannot load it: {error}; nothing changed")


def _check_not_a_site_hook(path: Path) -> None:
    """render would replace a site's own job_submit.lua: say how to keep it."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    if _OURS not in text:
        raise ConfigError(
            f"{path} is not slurm-hetero's (the site's own hook?); to run both, move it "
            f"(mv {path} {path.with_name('site_job_submit.lua')}) and pass --chain "
            f"{path.with_name('site_job_submit.lua')}, or remove it; nothing changed"
        )


@cli.group()
def request() -> None:
    """Look at resource requests the way the job_submit hook does."""


def _print(outcome: Outcome, as_json: bool) -> None:
    for kind, line in outcome.log:  # the hook's own failure, which its fail policy then hides
        if kind == "error":
            click.echo(f"slurm-hetero: {line}; report it with this command", err=True)
    if as_json:
        click.echo(json.dumps(outcome.as_dict(), sort_keys=True))
        return
    click.echo(f"{'accept' if outcome.ok else 'reject'} ({outcome.action}): {outcome.message or '-'}")
    shown = [name for name in WRITTEN if name != "admin_comment"]  # the hook's note is not the job's
    for name in shown if outcome.ok else ():
        if getattr(outcome.job, name):
            click.echo(f"  {name} = {getattr(outcome.job, name)}")


# request explain's sbatch options, in --help order: (long name, short flag, help)
SBATCH_OPTIONS = (
    ("gres", None, "As sbatch --gres, e.g. gpumem:20G or gpu:a100_80g:1,gpumem:70G."),
    ("gpus", None, "As sbatch --gpus (a count for the job, optionally TYPE:N)."),
    ("gpus-per-node", None, "As sbatch --gpus-per-node."),
    ("gpus-per-task", None, "As sbatch --gpus-per-task."),
    ("gpus-per-socket", None, "As sbatch --gpus-per-socket (with gpumem/gpucore: refused)."),
    ("sockets-per-node", None, "As sbatch --sockets-per-node (sbatch wants it with --gpus-per-socket)."),
    ("partition", "-p", "As sbatch --partition (its policy and types apply)."),
    ("constraint", "-C", "As sbatch --constraint."),
    ("nodes", "-N", "As sbatch --nodes: N or MIN-MAX (read, and refused, as sbatch does)."),
    ("ntasks", "-n", "As sbatch --ntasks."),
    ("ntasks-per-node", None, "As sbatch --ntasks-per-node."),
    ("cpus-per-task", "-c", "As sbatch --cpus-per-task."),
    ("cpus-per-gpu", None, "As sbatch --cpus-per-gpu."),
    ("mincpus", None, "As sbatch --mincpus (CPUs per node)."),
    ("overcommit", "-O", "As sbatch --overcommit (CPUs for one task a node)."),
    ("mem-per-gpu", None, "As sbatch --mem-per-gpu (MiB, or with M/G/T)."),
    ("mem", None, "As sbatch --mem (per node)."),
    ("mem-per-cpu", None, "As sbatch --mem-per-cpu."),
    ("nodelist", "-w", "As sbatch --nodelist (gpumem/gpucore with it is refused)."),
    ("exclude", "-x", "As sbatch --exclude (gpumem/gpucore decided without those hosts)."),
)


_sbatch_options = stacked(
    *(
        click.option(
            *([f"--{name}", short] if short else [f"--{name}"]),
            is_flag=True if name == "overcommit" else None,  # not False: click then reads "-1" as an option
            help=text,
        )
        for name, short, text in SBATCH_OPTIONS
    )
)


@request.command("explain")
@_inventory_opt
@_sbatch_options
@click.option("--uid", type=Count(0, MAX_UID), help="Submitting user id (exempt users are left alone).")
@click.option(
    "--slurm-release",
    type=click.Choice(["22.05", "24.11"]),
    help="The sbatch whose job_desc to model (TRES forms, counts it derives, options it refuses) "
    "[default: scontrol --version's].",
)
@_config_opt
@_models_opt
@click.option("--json", "as_json", is_flag=True, help='Print {"ok", "tres_per_node", "message", ...}.')
def explain_cmd(
    inventory_path: Path,
    uid: int | None,
    slurm_release: str | None,
    config_path: Path | None,
    models_dirs: tuple[Path, ...],
    as_json: bool,
    **given: Any,
) -> None:
    """What the job_submit hook does with a request (job_submit.lua itself, through lupa); exit 1
    when it refuses it, as when sbatch itself would."""
    settings, release = load_settings(config_path), hook_release(slurm_release)
    model = compiled(inventory_nodes(inventory_path, models_dirs), settings)
    given["overcommit"] = "yes" if given["overcommit"] else None
    # a host file: its hosts, as sbatch sends them
    given["nodelist"] = read_hosts("-w/--nodelist", given["nodelist"])
    given["exclude"] = read_hosts("-x/--exclude", given["exclude"])
    job = job_from_options(**given, uid=uid, slurm_release=release, names=gres_names(model))
    outcome = settings_hook(model, settings, release).submit(job)
    _print(outcome, as_json)
    if not outcome.ok:
        raise SystemExit(1)  # a refused request (docs/admin-guide.md, exit codes)
