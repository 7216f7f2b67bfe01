"""Unit tests never talk to a real Slurm: Slurm's client commands through `proc.run` fail here
as they would on a host without Slurm, unless a test replaces `proc.run` itself."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from slurm_hetero import proc
from slurm_hetero.errors import ToolError

SLURM_CLIENTS = {"scontrol", "sinfo", "squeue", "srun", "sbatch", "sacctmgr", "slurmd"}


@pytest.fixture(autouse=True)
def _no_real_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    real = proc.run

    def guarded(argv: Sequence[str], timeout: float = 60.0) -> str:
        if argv and str(argv[0]).rsplit("/", 1)[-1] in SLURM_CLIENTS:
            raise ToolError([str(a) for a in argv], None, "unit tests do not reach a real Slurm")
        return real(argv, timeout)

    monkeypatch.setattr(proc, "run", guarded)
