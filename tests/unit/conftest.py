"""Unit tests never talk to a real Slurm: Slurm's client commands through `proc.run` fail here
as they would on a host without Slurm, unless a test replaces `proc.run` itself."""

from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence

import pytest

from slurm_hetero.core import proc
from slurm_hetero.core.errors import ToolError

SLURM_CLIENTS = {"scontrol", "sinfo", "squeue", "srun", "sbatch", "sacctmgr", "slurmd"}


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
