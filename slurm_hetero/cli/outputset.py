"""The last step both render commands share (`gres render`, `job-submit render`): `--check` prints
the diff, an interrupted set and what the render would remove, and exits 1 when anything would
change; otherwise the set goes through the one set writer, which refuses to drop nodes or devices
that the files on disk name unless `--allow-removal` (`render.removal`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import click

from slurm_hetero.render import removal
from slurm_hetero.render.write import diff, pending, read_current, write_atomic

allow_removal_option = click.option(
    removal.ALLOW_FLAG,
    "allow_removal",
    is_flag=True,
    help="Write even when the inventory lacks nodes or devices that the files in --out name "
    "(removing them); without it such a render is refused, as a cut-short inventory would cause it.",
)


def check_or_write(files: Mapping[Path, str], out: Path, check: bool, allow_removal: bool) -> list[Path]:
    """With `check`: print the diff (and what it removes) and exit 1 if anything would change.
    Otherwise write the set, guarded unless `allow_removal`; returns the files written."""
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
    return write_atomic(files, guard=None if allow_removal else removal.guard(files, out))
