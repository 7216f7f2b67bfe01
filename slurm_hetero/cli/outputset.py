"""The last step of both render commands (`gres render`, `job-submit render`): `--check`, or the
set writer, guarded against dropping nodes or devices."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import click

from slurm_hetero.core.journal import audit
from slurm_hetero.core.writefile import diff, ensure_output_dir, pending, read_current, write_atomic
from slurm_hetero.render import removal

allow_removal_option = click.option(
    removal.ALLOW_FLAG,
    "allow_removal",
    is_flag=True,
    help="Write even when the inventory lacks nodes or devices that the files in --out name "
    "(removing them); without it such a render is refused, as a cut-short inventory would cause it.",
)


KEEP_BACKUPS = 10


class _KeepBackups(click.ParamType):
    name = "N|all"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        if value is None or isinstance(value, int):  # the default
            return value
        text = str(value)
        if text.lower() == "all":
            return None
        if text.isascii() and text.isdigit() and len(text) <= 9 and int(text) >= 1:
            return int(text)
        self.fail(
            f"{text!r}: give a whole number from 1 to 999999999, or 'all' to keep every backup", param, ctx
        )


keep_backups_option = click.option(
    "--keep-backups",
    "keep_backups",
    type=_KeepBackups(),
    metavar="N|all",
    default=KEEP_BACKUPS,
    show_default=True,
    help="How many backups (NAME.<stamp>.bak) of each file to leave in --out; older ones are "
    "removed after a write. 'all' keeps every one.",
)


def check_or_write(
    texts: Mapping[str, str], out: Path, check: bool, allow_removal: bool, keep_backups: int | None
) -> list[Path]:
    """Write the set `texts` (file name: text) in `out`, or with `check` print the diff and exit 1
    if anything would change; returns the files written."""
    directory = out if check else ensure_output_dir(out)
    files = {directory / name: text for name, text in texts.items()}
    if check:
        changes = diff(files)
        click.echo(changes, nl=False)
        if pending(out):
            click.echo(
                f"slurm-hetero: {out} holds an interrupted render; render again to finish it", err=True
            )
        if changes and (dropped := removal.removed(read_current(files), files)):
            click.echo(
                f"slurm-hetero: this render removes {dropped}; writing it needs {removal.ALLOW_FLAG}",
                err=True,
            )
        raise SystemExit(1 if changes or pending(out) else 0)
    guard = None if allow_removal else removal.guard(files, out)
    if written := write_atomic(files, guard=guard, keep_backups=keep_backups):
        audit("slurm-hetero-render").info("wrote %s", ", ".join(map(str, written)))
    return written


def echo_summary(summary: Mapping[str, object], as_json: bool, line: str) -> None:
    """A render's summary: JSON on stdout with --json, else `line` on stderr."""
    click.echo(json.dumps(summary) if as_json else line, err=not as_json)
