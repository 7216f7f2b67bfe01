"""The `slurm-hetero` program: `launch` starts keeping its early signals (`launch.early`) before
the CLI's slow imports."""

from __future__ import annotations

import sys


def main() -> None:
    """Console-script entry point (and `python -m slurm_hetero`)."""
    from slurm_hetero.launch import early

    if early.supervised_launch(sys.argv[1:]):
        early.catch_early()
    from slurm_hetero.cli import cli

    cli(prog_name="slurm-hetero")
