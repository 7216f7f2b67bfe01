"""The only place that spawns processes. Tests patch `run`."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from slurm_hetero.core.errors import ToolError

logger = logging.getLogger(__name__)


MAX_OUTPUT = 64 * 1024 * 1024  # bytes read from a command before it is killed: memory stays bounded


def run(argv: Sequence[str], timeout: float = 60.0, max_output: int = MAX_OUTPUT) -> str:
    """Run `argv` (no shell, stdin closed); its stdout, bad UTF-8 replaced. ToolError on failure,
    timeout or more than `max_output` bytes; its process group is killed whole on the last two."""
    argv = [str(a) for a in argv]
    logger.debug("EXEC %s", argv)
    started = time.monotonic()
    try:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as e:  # not found, not executable, ...
        raise ToolError(argv, None, str(e), None if isinstance(e, FileNotFoundError) else "cannot run") from e
    try:
        out, err = _read(child, argv, started + timeout, max_output, timeout)
    except BaseException:
        with contextlib.suppress(OSError):  # not yet reaped: the group is still this child's
            os.killpg(child.pid, signal.SIGKILL)
        raise
    finally:
        for pipe in (child.stdout, child.stderr):
            if pipe is not None:
                pipe.close()
        child.wait()
    rc = child.returncode
    logger.debug("READ %s rc=%d bytes=%d in %.3fs", argv[0], rc, len(out), time.monotonic() - started)
    if rc != 0:
        raise ToolError(argv, rc, _decode(err)[-2000:])
    return _decode(out)


def _decode(data: bytes) -> str:
    # Universal newlines, as `text=True` gave: a CRLF capture parses like an LF one.
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def _read(
    child: subprocess.Popen[bytes], argv: list[str], deadline: float, max_output: int, timeout: float
) -> tuple[bytes, bytes]:
    """Both pipes of `child` until it closes them and exits, bounded in time and size."""
    assert child.stdout is not None and child.stderr is not None
    chunks: dict[int, list[bytes]] = {child.stdout.fileno(): [], child.stderr.fileno(): []}
    total = 0
    with selectors.DefaultSelector() as sel:
        for pipe in (child.stdout, child.stderr):
            sel.register(pipe, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise ToolError(argv, None, status=f"timed out after {timeout:g}s")
            for key, _ in sel.select(left):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                total += len(data)
                if total > max_output:
                    raise ToolError(
                        argv, None, status=f"printed more than {max_output / 2**20:g} MiB; killed"
                    )
                chunks[key.fd].append(data)
    try:
        child.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired as e:
        raise ToolError(argv, None, status=f"timed out after {timeout:g}s") from e
    return b"".join(chunks[child.stdout.fileno()]), b"".join(chunks[child.stderr.fileno()])


# The detached process of `run_later`; its only input is its argv, (DELAY N ARG*N) repeated.
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
    """Run each `(delay_s, argv)` at `delay_s` from now, in one detached process outliving this one."""
    if any(not 0 <= delay_s < math.inf for delay_s, _ in steps):
        raise ValueError(f"run_later: delays must be numbers of seconds >= 0, got {[d for d, _ in steps]!r}")
    flat = [x for delay_s, argv in steps for x in (repr(float(delay_s)), str(len(argv)), *map(str, argv))]
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
