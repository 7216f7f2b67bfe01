"""What `health` and the renders tell syslog (the journal): faults with node and device, actions,
files written; nothing of it on the terminal."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.core import journal
from tests.unit.test_py39 import unreachable_slurm

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "gres_conf" / "examples" / "mixed.yaml"
NVIDIA_XML = ROOT / "tests/fixtures/nvidia/nvidia-smi-q-x_a100-sxm4-80gb_mig_drv535_1-of-4-gpus.xml"


@pytest.fixture
def syslog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket standing in for /dev/log; the journal loggers start afresh."""
    path = str(tmp_path / "log")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.settimeout(5)
    monkeypatch.setattr(journal, "SOCKET", path)
    for ident in ("slurm-hetero-health", "slurm-hetero-render"):
        logging.getLogger(f"slurm_hetero.core.journal.{ident}").handlers.clear()
    yield server
    server.close()
    for ident in ("slurm-hetero-health", "slurm-hetero-render"):
        logging.getLogger(f"slurm_hetero.core.journal.{ident}").handlers.clear()


def received(server: socket.socket) -> list[str]:
    lines = []
    server.settimeout(0.5)
    try:
        while True:
            lines.append(server.recv(4096).decode().rstrip("\x00"))
    except TimeoutError:
        return lines


def test_health_tells_syslog_each_fault_with_its_node_and_device(
    syslog: socket.socket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{unreachable_slurm(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    args = ["health", "--inventory", str(EXAMPLE), "--node", "a100n1", "--vendor", "nvidia"]
    result = CliRunner().invoke(cli, [*args, "--from-file", str(NVIDIA_XML), "--dry-run"])
    assert result.exit_code == 3  # the faults are logged before Slurm's record is asked for
    lines = received(syslog)
    assert (
        "<12>slurm-hetero-health: node a100n1: nvidia 0 (/dev/nvidia0): missing" in lines
    )  # 12: user.warning
    # every fault: the 3 devices the capture lacks (it lists no links to check); no drain without a
    # Slurm that answers
    assert len(lines) == 3
    assert "slurm-hetero-health" not in result.output


def test_render_tells_syslog_what_it_wrote(syslog: socket.socket, tmp_path: Path) -> None:
    out = tmp_path / "etc"
    result = CliRunner().invoke(cli, ["gres", "render", "--inventory", str(EXAMPLE), "--out", str(out)])
    assert result.exit_code == 0, result.output
    (line,) = received(syslog)
    assert f"slurm-hetero-render: wrote {out}/gres.conf, {out}/slurm-nodes.conf" in line
