"""The docs stay true: relative links resolve, and every `slurm-hetero` command they show exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_hetero.cli import cli
from tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#]+)(?:#[^)]*)?\)")
COMMAND = re.compile(r"slurm-hetero ((?:[a-z][a-z-]+)(?: (?:render|merge|check|explain))?)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc: Path) -> None:
    for target in LINK.findall(doc.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"


def _code(text: str) -> str:
    """Fenced blocks and inline code spans: where commands are shown (not prose)."""
    fenced = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return "\n".join(fenced + inline)


def test_every_documented_command_has_help() -> None:
    commands = {m for doc in DOCS for m in COMMAND.findall(_code(doc.read_text()))}
    assert {"discover", "gres render", "inventory merge", "launch", "plan", "fit"} <= commands
    for command in sorted(commands):
        result = CliRunner().invoke(cli, [*command.split(), "--help"])
        assert result.exit_code == 0, f"slurm-hetero {command} --help: {result.output}"
