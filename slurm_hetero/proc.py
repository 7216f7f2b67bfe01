"""The only place that spawns processes. Tests patch `run`."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
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
    except OSError as e:  # not executable, ...
        raise ToolError(argv, None, str(e), status="cannot run") from e
    except subprocess.TimeoutExpired as e:
        raise ToolError(argv, None, status=f"timed out after {timeout:g}s") from e
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


# The detached process of `run_later`: fixed code, whose only input is its argv (DELAY N ARG*N
# repeated); each command runs without a shell, in order, at its time from the start.
_LATER = """
import subprocess, sys, time
start, args = time.monotonic(), sys.argv[1:]
while args:
    delay, count = float(args[0]), int(args[1])
    argv, args = args[2 : 2 + count], args[2 + count :]
    time.sleep(max(0.0, start + delay - time.monotonic()))
    try:
        subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        pass
"""


def run_later(steps: Sequence[tuple[float, Sequence[str]]]) -> None:
    """Run each `(delay_s, argv)` of `steps` `delay_s` seconds from now, in order, in one detached
    process that outlives this one (a Python running fixed code; no shell sees `argv`); a command
    that fails does not stop the next, and their output is discarded. Tests patch it."""
    flat: list[str] = []
    for delay_s, argv in steps:
        if not 0 <= delay_s < math.inf:
            raise ValueError(f"run_later: delay {delay_s!r} is not a number of seconds >= 0")
        flat += [repr(float(delay_s)), str(len(argv)), *(str(a) for a in argv)]
    logger.debug("LATER %s", [(f"{d:g}s", list(a)) for d, a in steps])
    try:
        subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _LATER, *flat],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError as e:
        raise ToolError([sys.executable, *flat], None, str(e)) from e
