"""Local torch.distributed ranks for tests: `Rank([SCRIPT, ARGS...], env)` runs `python SCRIPT ARGS`
and `Rank(["-c", CODE, ARGS...], env)` runs `python -c CODE ARGS`, each forked from one server
process that imported torch once per test worker. A fresh
interpreter per rank spent most of these tests' time importing torch (3-4 CPU seconds a rank).

A rank runs as `python` would run it: `sys.argv`, the environment and `__main__` are the rank's,
stdout and stderr go to one file, SystemExit and uncaught exceptions give Python's exit codes, and
atexit handlers run before it exits."""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import os
import runpy
import sys
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

# What every rank imports anyway; the server imports them once, before any rank forks from it.
PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.distributed.checkpoint",
    "torch.distributed.pipelining",
    "torch.distributed.tensor",
    "slurm_hetero.training",
    "slurm_hetero.training.checkpoint",
    "slurm_hetero.inventory.modelconfigs",
]


@functools.cache
def _forkserver() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _exit_code(exit: SystemExit) -> int:
    if exit.code is None or isinstance(exit.code, int):
        return exit.code or 0
    print(exit.code, file=sys.stderr)
    return 1


def _rank(argv: list[str], env: dict[str, str], output: str) -> None:
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["-c", *argv[2:]] if argv[0] == "-c" else list(argv)
    code = 0
    try:
        if argv[0] == "-c":
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
        else:
            sys.path.insert(0, str(Path(argv[0]).parent))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:  # noqa: BLE001 - as the interpreter: print it, exit 1
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Rank:
    """One started rank, with Popen's `communicate` and `returncode` (output: stdout + stderr)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        handle, self._output = tempfile.mkstemp(prefix="rank-", suffix=".out")
        os.close(handle)
        self._process = _forkserver().Process(target=_rank, args=(list(argv), dict(env), self._output))
        self._process.start()
        self.returncode: int | None = None

    def communicate(self, timeout: float) -> tuple[str, None]:
        self._process.join(timeout)
        if self._process.exitcode is None:
            self._process.kill()
            self._process.join()
        self.returncode = self._process.exitcode
        try:
            return Path(self._output).read_text(errors="replace"), None
        finally:
            os.unlink(self._output)
