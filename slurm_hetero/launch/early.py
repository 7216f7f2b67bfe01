"""Signals a launcher receives before its command starts, kept rather than lost: a peer that
fails at once sends PEER_FAILED while the others still import and plan. Imports nothing heavy, so
the entry point (`slurm_hetero.entry`) can set it up before the CLI's imports; the supervisor
(`launch.supervise`) acts on what was recorded when it starts.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from typing import Any

# Signals that ask the command to stop; the supervisor forwards them to the command's whole tree.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# "Another rank failed": what a failing rank's launcher sends the step (`scancel --signal=URG`).
PEER_FAILED = signal.SIGURG
# Slurm delivers these to every process of the step: the launcher neither forwards them (the
# command would see them twice) nor dies of them.
SLURM_DELIVERED = (signal.SIGUSR1, signal.SIGUSR2)

EARLY: list[int] = []  # the signals recorded, in order
CATCHING = [False]  # recording (until a supervisor starts or the launch command returns)


def _record(signum: int, _frame: Any) -> None:
    if CATCHING[0]:
        EARLY.append(signum)


def catch_early() -> None:
    """Record PEER_FAILED and the stop signals from here (what came since an earlier call is kept)."""
    if not CATCHING[0]:
        EARLY.clear()
        CATCHING[0] = True
    for signum in (PEER_FAILED, *STOP_SIGNALS):
        signal.signal(signum, _record)
    for signum in SLURM_DELIVERED:
        signal.signal(signum, let_pass)


def let_pass(_signum: int, _frame: Any) -> None:
    """A Python handler, not SIG_IGN, which a command started from here would inherit."""


def stop_catching() -> None:
    """The handlers record nothing from here (the launch command has returned)."""
    CATCHING[0] = False


def supervised_launch(argv: Sequence[str]) -> bool:
    """Whether `argv` is `launch` that will supervise a command (not --dry-run, nor --exec)."""
    if not argv or argv[0] != "launch":
        return False
    options = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
    return not {"--dry-run", "--exec"} & set(options)
