"""Docs are tests, Slurm half: every documented command that needs Slurm (sbatch, srun, scontrol,
`slurm-hetero sbatch`, `discover --all`, ...) and is not marked `# not run here: <why>` runs as
written against the dev cluster, on each release, with that release's tools. Users' commands
(sbatch, srun, salloc, `slurm-hetero sbatch`) run as the plain user (root is exempt from the
hook), the rest as root, in a directory holding what the docs assume (tests/unit/test_docs_commands.py
runs the rest, and sets up the same directory)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.doccommands import DocCommand, all_commands
from tests.integration.conftest import Cluster
from tests.unit.test_docs_commands import check, sandbox

SLURM = [c for c in all_commands() if c.needs_slurm and not c.marked]
# What a job user finds first: the node install's venv (python with slurm_hetero) and command.
USER_PATH = "/opt/slurm-hetero/venv/bin:/usr/local/bin"
USER_COMMAND = re.compile(r"^(sbatch|srun|salloc|slurm-hetero sbatch)\b")


@pytest.fixture(scope="module")
def docs_dir(dev_cluster: Cluster) -> Path:
    """/tmp: the same path inside a chrooted release; open to the plain user."""
    directory = Path(f"/tmp/slurm-hetero-docs-{dev_cluster.name}")
    sandbox(directory, dev_cluster.inventory)
    for path in [directory, *directory.rglob("*")]:
        path.chmod(0o777 if path.is_dir() else 0o755)
    return directory


@pytest.mark.parametrize("command", SLURM, ids=lambda c: c.where)
def test_a_documented_slurm_command_runs_as_written(
    command: DocCommand, dev_cluster: Cluster, docs_dir: Path
) -> None:
    if command.text.startswith("scripts/"):  # the dev cluster's own tool: on the host, from the checkout
        argv = ["bash", "-c", command.text]
        result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    else:
        user = "nobody" if USER_COMMAND.match(command.text) else None
        argv = ["bash", "-c", f"export PATH={USER_PATH}:$PATH; {command.text}"]
        result = dev_cluster.run(argv, user, timeout=300, cwd=str(docs_dir))
    check(command, result)
