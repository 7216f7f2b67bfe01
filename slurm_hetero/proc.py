"""The only place that spawns processes. Tests patch `run`."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Sequence

from slurm_hetero.errors import ToolError

logger = logging.getLogger(__name__)


def run(argv: Sequence[str], timeout: float = 60.0) -> str:
    """Run `argv` (never through a shell) and return its stdout; ToolError on failure or timeout."""
    argv = [str(a) for a in argv]
    logger.debug("EXEC %s", argv)
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as e:
        raise ToolError(argv, None, str(e)) from e
    except subprocess.TimeoutExpired as e:
        raise ToolError(argv, None, f"timed out after {timeout:g}s") from e
    logger.debug(
        "READ %s rc=%d bytes=%d in %.3fs",
        argv[0],
        done.returncode,
        len(done.stdout),
        time.monotonic() - started,
    )
    if done.returncode != 0:
        raise ToolError(argv, done.returncode, done.stderr[-2000:])
    return done.stdout


def run_later(argv: Sequence[str], delay_s: float) -> None:
    """Start `argv` after `delay_s` seconds in a detached session (no shell runs `argv`: `sleep`
    then `exec`), outliving this process; its output is discarded. Tests patch it with `run`."""
    argv = [str(a) for a in argv]
    logger.debug("LATER %.3gs %s", delay_s, argv)
    try:
        subprocess.Popen(
            ["sh", "-c", 'sleep "$0" && exec "$@"', f"{delay_s:g}", *argv],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError as e:
        raise ToolError(argv, None, str(e)) from e
