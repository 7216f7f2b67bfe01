"""What runs on compute nodes (discover, health, task-prolog, launch) must run on Python 3.9, the
system Python of openEuler 22.03 and RHEL 9. The console script imports every command, so the
whole package is checked with vermin (`enum.StrEnum`, `match`, `datetime.UTC`, `zip(strict=)`,
runtime `X | Y`... are 3.10+); slurm_hetero.core.compat holds the 3.11 StrEnum behind a version check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "slurm_hetero"
NVIDIA_XML = ROOT / "tests/fixtures/nvidia/nvidia-smi-q-x_a100-sxm4-80gb_mig_drv535_1-of-4-gpus.xml"
EXAMPLE = ROOT / "gres_conf/examples/mixed.yaml"
# What compute nodes run, as a node runs it; each must start and answer on a real interpreter.
NODE_COMMANDS = {
    "help": (["--help"], 0),
    "version": (["--version"], 0),
    "discover": (["discover", "--vendor", "nvidia", "--from-file", str(NVIDIA_XML), "--node", "n1"], 0),
    "task-prolog": (["task-prolog", "--inventory", str(EXAMPLE)], 0),
    # the capture lists 1 of a100n1's 4 devices: a fault, reported without draining (--dry-run); the
    # node's record then comes from a Slurm that cannot answer (FAKE_BIN's scontrol): exit 3
    "health": (
        [
            "health",
            "--inventory",
            str(EXAMPLE),
            "--node",
            "a100n1",
            "--vendor",
            "nvidia",
            "--from-file",
            str(NVIDIA_XML),
            "--dry-run",
        ],
        3,
    ),
    "launch": (
        [
            "launch",
            "--dry-run",
            "--simulate",
            "x1:a100_80g:2,x2:l40s:2",
            "--model",
            "gpt2",
            "--seq",
            "64",
            "--global-batch",
            "8",
        ],
        0,
    ),
}


def unreachable_slurm(tmp_path: Path) -> Path:
    """A directory whose `scontrol` answers as when slurmctld is down, whatever runs on this host."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    scontrol = fake_bin / "scontrol"
    scontrol.write_text("#!/bin/sh\necho 'Unable to contact slurm controller' >&2\nexit 1\n")
    scontrol.chmod(0o755)
    return fake_bin


def node_venv(version: str) -> Path:
    """The venv scripts/setup makes from pyenv's interpreter; CI must have it, elsewhere a skip."""
    venv = ROOT / ".venv-node" / f"py{version}"
    if not (venv / "bin" / "slurm-hetero").exists():
        if os.environ.get("CI"):
            pytest.fail(f"{venv} missing: scripts/setup makes it from pyenv's Python {version}")
        pytest.skip(f"{venv} missing (bash scripts/setup makes it)")
    return venv


@pytest.mark.parametrize("version", ["3.9", "3.13"])
@pytest.mark.parametrize("name", sorted(NODE_COMMANDS))
def test_node_commands_run_on_a_real_interpreter(version: str, name: str, tmp_path: Path) -> None:
    venv = node_venv(version)
    args, code = NODE_COMMANDS[name]
    fake_bin = unreachable_slurm(tmp_path)
    env = {
        "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}",
        "HOME": os.environ.get("HOME", "/root"),
        "SLURMD_NODENAME": "a100n1",
        "SLURM_JOB_GPUS": "0",
    }
    done = subprocess.run(
        [str(venv / "bin" / "slurm-hetero"), *args], capture_output=True, text=True, timeout=120, env=env
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == code, done.stdout + done.stderr
    version_line = subprocess.run([str(venv / "bin" / "python"), "--version"], capture_output=True, text=True)
    assert version_line.stdout.startswith(f"Python {version}.")


def test_one_broken_command_leaves_the_others_running(tmp_path: Path) -> None:
    """Commands are imported when asked for: a library only `gres render` needs (jinja2), broken on
    a node, must not take down the TaskProlog there."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "jinja2.py").write_text("raise ImportError('jinja2 is broken on this node')\n")
    env = {**os.environ, "PYTHONPATH": f"{shadow}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [sys.executable, "-m", "slurm_hetero", "task-prolog", "--inventory", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "SLURMD_NODENAME": "a100n1"},
    )
    assert done.returncode == 0, done.stderr


def test_package_runs_on_python_3_9() -> None:
    vermin = shutil.which("vermin")
    command = [vermin] if vermin else [sys.executable, "-m", "vermin"]
    try:
        done = subprocess.run(
            [*command, "--target=3.9-", "--no-tips", "--violations", "--eval-annotations", str(PACKAGE)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except FileNotFoundError:
        pytest.skip("vermin not installed (pip install -e .[dev])")
    if "No module named vermin" in done.stderr:
        pytest.skip("vermin not installed (pip install -e .[dev])")
    assert done.returncode == 0, done.stdout + done.stderr


def test_requires_python_says_3_9() -> None:
    text = (PACKAGE.parent / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.9"' in text and "pyslurm" not in text
    assert (PACKAGE.parent / "LICENSE").read_text().lstrip().startswith("Apache License")
