"""The `slurm-hetero` command: a click group, logging set-up and the one error boundary (R6).

A command's module is imported only when it runs, so one command's imports (torch, numpy) cannot
break another on a compute node. Exit codes: 0 ok, 1 user/config/input errors (and `--check`
drift), 2 usage, 3 tool failures, 130 SIGINT.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from slurm_hetero import __version__
from slurm_hetero.core.errors import HeteroError, OutputError

logger = logging.getLogger("slurm_hetero")


COMMAND_MODULES = {
    "calibrate": "calibrate",
    "catalog": "catalog",
    "convert-profile": "calibrate",
    "discover": "discover",
    "fit": "fit",
    "gres": "gres",
    "health": "health",
    "install": "install",
    "inventory": "inventory",
    "job-submit": "submit",
    "launch": "launch",
    "metrics": "metrics",
    "plan": "plan",
    "report": "report",
    "request": "submit",
    "sbatch": "sbatch",
    "task-prolog": "taskprolog",
}


class _Given(click.ParamType):
    """A value that may not be blank (an unset "$LOGDIR"): as a path '' would be the current directory."""

    empty = "names nothing"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail(f"{value!r} {self.empty}.", param, ctx)
        return super().convert(value, param, ctx)


class _GivenPath(_Given, click.Path):
    empty = "names no file or directory (. is the current one)"


class _GivenText(_Given, click.types.StringParamType):
    pass


def path_type(**options: Any) -> click.Path:
    return _GivenPath(**{"path_type": Path, **options})


PATH = path_type()
FILE = path_type(dir_okay=False)
TEXT = _GivenText()  # a name or text option that may not be ''
Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]
# options several commands share, each with its own help=
inventory_option = functools.partial(click.option, "--inventory", "inventory_path", type=PATH)
models_dir_option = functools.partial(click.option, "--models-dir", "models_dirs", multiple=True, type=PATH)
from_file_option = functools.partial(click.option, "--from-file", "from_files", multiple=True, type=PATH)
config_option = functools.partial(click.option, "--config", "config_path", type=PATH)


def checked(option: str, check: Callable[[str], object], value: str) -> None:
    """`check(value)` (a `slurm.syntax` rule), its ValueError as an OutputError naming `option`."""
    try:
        check(value)
    except ValueError as e:
        raise OutputError(f"{option}: {e}") from None


class _Group(click.Group):
    """Imports a command's module when it is asked for; HeteroError -> one line and an exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMAND_MODULES) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            importlib.import_module(f"{__name__}.{COMMAND_MODULES[cmd_name]}")
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HeteroError as e:
            message, cause = str(e), e.__cause__
            if (ctx.obj or {}).get("verbose", 0):
                click.echo(traceback.format_exc(), err=True, nl=False)
                if cause is not None:
                    message += f" (caused by {type(cause).__name__}: {cause})"
            click.echo(f"slurm-hetero: {message}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("slurm-hetero: interrupted", err=True)
            ctx.exit(130)


@click.group(
    cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "SLURM_HETERO"}
)
@click.option(
    "-v",
    "--verbose",
    count=True,
    allow_from_autoenv=False,  # SLURM_HETERO_VERBOSE from a job's environment must not reach the TaskProlog
    help="More logging (-v info and tracebacks, -vv debug).",
)
@click.version_option(__version__, prog_name="slurm-hetero")
@click.pass_context
def cli(ctx: click.Context, verbose: int) -> None:
    """Mixed accelerators as one Slurm pool: discover, render gres.conf, rewrite requests, launch."""
    ctx.obj = {"verbose": verbose}
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logging.basicConfig(
        level=level, format="slurm-hetero %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
