"""scripts/man-pages: one page per command, from the click commands, that man renders cleanly."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_hetero.cli import COMMAND_MODULES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("man1")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "man-pages"), str(out)], check=True)
    return out


def test_every_command_and_subcommand_has_a_page(pages: Path) -> None:
    names = {p.name for p in pages.glob("*.1")}
    assert "slurm-hetero.1" in names and "slurm-hetero-gres-render.1" in names
    assert {f"slurm-hetero-{c}.1" for c in COMMAND_MODULES} <= names
    install = (pages / "slurm-hetero-install.1").read_text()
    assert install.startswith('.TH "SLURM-HETERO-INSTALL" "1"') and "--uninstall" in install


@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
def test_man_renders_them_without_warnings(pages: Path) -> None:
    for page in sorted(pages.glob("*.1")):
        done = subprocess.run(
            ["man", "--warnings", "-l", str(page)], capture_output=True, text=True, env={"MANWIDTH": "80"}
        )
        assert done.returncode == 0 and not done.stderr.strip(), (page.name, done.stderr)
        assert "Usage: slurm-hetero" in done.stdout, page.name


def test_launch_help_names_the_manual_and_manual_prints_it() -> None:
    from click.testing import CliRunner

    from slurm_hetero.cli import cli

    assert "docs/launch.md" in CliRunner().invoke(cli, ["launch", "--help"]).output
    result = CliRunner().invoke(cli, ["launch", "--manual"])
    assert result.exit_code == 0 and result.output == (ROOT / "docs" / "launch.md").read_text()


def test_the_bash_completion_script_completes_commands() -> None:
    import os

    env = {**os.environ, "_SLURM_HETERO_COMPLETE": "bash_source", "PYTHONPATH": str(ROOT)}
    script = subprocess.run([sys.executable, "-m", "slurm_hetero"], env=env, capture_output=True, text=True)
    assert script.returncode == 0
    assert "complete -o nosort -F _slurm_hetero_completion slurm-hetero" in script.stdout
    env = {**env, "_SLURM_HETERO_COMPLETE": "bash_complete", "COMP_WORDS": "slurm-hetero ins"}
    env["COMP_CWORD"] = "1"
    words = subprocess.run([sys.executable, "-m", "slurm_hetero"], env=env, capture_output=True, text=True)
    assert "plain,install" in words.stdout.splitlines()
