"""Unit tests never talk to a real Slurm: Slurm's client commands through `proc.run` fail here
as they would on a host without Slurm, unless a test replaces `proc.run` itself.

With pytest-xdist (`-n N`), the slow modules run first and each worker takes one test at a time,
so the workers end together: in file order a worker could be left with the last minute of torch
ranks while the others sat idle."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from slurm_hetero.core import proc
from slurm_hetero.core.errors import ToolError

SLURM_CLIENTS = {"scontrol", "sinfo", "squeue", "srun", "sbatch", "sacctmgr", "slurmd"}
# The clients that ask slurmctld; subprocesses find stubs of them (sbatch and slurmd parse and read
# the host here, and some tests compare with them).
CONTROLLER_CLIENTS = ("scontrol", "sinfo", "squeue", "sacct", "sacctmgr", "scancel")

# Modules whose tests take seconds each (torch ranks, the planner's searches, exhaustive crash
# and full-disk loops, documented commands), slowest first: measured with --durations.
HERE = Path(__file__).parent
SLOW_FIRST = (
    "test_training.py",
    "test_training_checkpoint.py",
    "test_runnable.py",
    "test_layout.py",
    "test_docs_commands.py",
    "test_writefile.py",
    "test_render.py",
    "test_fuzz_harness.py",
    "test_py39.py",
    "test_vendor_amd.py",
    "test_launch_run.py",
    "test_plan.py",
    "test_measured_shapes.py",
    "test_calibrate.py",
    "test_job_submit_chain.py",
)


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist") and config.getoption("maxschedchunk", None) is None:
        config.option.maxschedchunk = 1  # one test at a time: a worker never queues slow ones


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        ours = item.path.parent == HERE
        return SLOW_FIRST.index(name) if ours and name in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: each module keeps its order (and its module fixtures)


@pytest.fixture(autouse=True, scope="session")
def _controller_unreachable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Commands the tests start (the CLI, documented commands) find slurmctld unreachable at once:
    the host's own clients wait ~9 s for a controller that is not running, and would ask a dev
    cluster that is."""
    stubs = tmp_path_factory.mktemp("slurm-clients")
    for name in CONTROLLER_CLIENTS:
        stub = stubs / name
        stub.write_text(f"#!/bin/sh\necho '{name}: error: Unable to contact slurm controller' >&2\nexit 1\n")
        stub.chmod(0o755)
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{stubs}{os.pathsep}{path}"
    yield
    os.environ["PATH"] = path


@pytest.fixture(autouse=True)
def _no_real_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    real = proc.run

    def guarded(argv: Sequence[str], timeout: float = 60.0, max_output: int = proc.MAX_OUTPUT) -> str:
        if argv and str(argv[0]).rsplit("/", 1)[-1] in SLURM_CLIENTS:
            raise ToolError([str(a) for a in argv], None, "unit tests do not reach a real Slurm")
        return real(argv, timeout, max_output)

    monkeypatch.setattr(proc, "run", guarded)


@pytest.fixture(autouse=True)
def _launcher_signals_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The `launch` command marks its process as ending with the rank, and an ending launcher
    ignores SIGTERM and the other forwarded signals; children inherit SIG_IGN, so no test may
    leave either behind."""
    from slurm_hetero.launch import supervise

    monkeypatch.setattr(supervise, "KEEP_HANDLERS_WHEN_ENDING", False)
    before = {s: signal.getsignal(s) for s in (*supervise.FORWARDED, supervise.PEER_FAILED)}
    yield
    for s, handler in before.items():
        signal.signal(s, handler)
