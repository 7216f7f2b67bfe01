"""The commands README.md and docs/*.md show, as the docs tests run them.

A command is a logical line of a fenced `bash`/`sh`/`shell` block (backslash continuations and
here-documents included) or a `$ ` line of a `console` block (with its `> ` continuations); other
fences (slurm.conf, YAML, output) are not commands; a block that starts with `#!` is one script,
run whole. A command the docs tests cannot run here
carries a visible marker, in its trailing comment or in a comment line of its own right above it:

    # not run here: <why>

A trailing comment with `rejected` or `refused` documents a command that fails (the test expects a
non-zero exit); `exit 1 if` one that may exit 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

SHELLS = {"bash", "sh", "shell", "console"}
MARKER = re.compile(r"#\s*not run here:\s*(.+?)\s*$")
# Words that make a command need a running Slurm (it runs against the dev cluster, each release).
SLURM_WORDS = re.compile(
    r"(?:^|[\s;|&(\"'])(sbatch|srun|salloc|scontrol|squeue|sinfo|scancel|sacct)\b"
    r"|slurm-hetero (?:sbatch|discover --all)"
)
_HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")


@dataclass(frozen=True)
class DocCommand:
    path: Path
    line: int  # 1-based line of the command's first line
    text: str  # as a shell reads it (continuations kept)
    marked: str | None  # the marker's reason, or None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def needs_slurm(self) -> bool:
        return bool(SLURM_WORDS.search(self.text))

    @property
    def expects_failure(self) -> bool:
        return bool(re.search(r"#.*\b(rejected|refused)\b", self.text))

    @property
    def may_exit_1(self) -> bool:
        return "exit 1 if" in self.text


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def commands(path: Path) -> list[DocCommand]:
    """Every command of one Markdown file, in order."""
    found: list[DocCommand] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^\s*```(\w*)", lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), len(lines))
        if fence.group(1) in SHELLS and lines[i + 1 : i + 2] and lines[i + 1].startswith("#!"):
            found.append(_script(path, i + 2, lines[i + 1 : end]))
        elif fence.group(1) in SHELLS:
            body = list(enumerate(lines[i + 1 : end], start=i + 2))
            parse = _console if fence.group(1) == "console" else _shell
            found += [DocCommand(path, n, text, marked) for n, text, marked in parse(body)]
        i = end + 1
    return found


def _script(path: Path, line: int, text: list[str]) -> DocCommand:
    """A block that starts with `#!` is one script (a batch script sbatch runs), run as a whole;
    its marker, if any, is a comment line among its first five."""
    marked = next((m for m in map(_marker, text[:5]) if m), None)
    return DocCommand(path, line, "\n".join(text), marked)


def _shell(body: list[tuple[int, str]]) -> list[tuple[int, str, str | None]]:
    out: list[tuple[int, str, str | None]] = []
    pending = None
    k = 0
    while k < len(body):
        number, line = body[k]
        if not line.strip() or line.lstrip().startswith("#"):
            pending = _marker(line) or pending
            k += 1
            continue
        text = [line]
        while text[-1].rstrip().endswith("\\") and k + 1 < len(body):
            k += 1
            text.append(body[k][1])
        heredoc = _HEREDOC.search(text[0])
        while heredoc and k + 1 < len(body):
            k += 1
            text.append(body[k][1])
            if body[k][1].strip() == heredoc.group(1):
                break
        command = "\n".join(text)
        out.append((number, command, _marker(command) or pending))
        pending = None
        k += 1
    return out


def _console(body: list[tuple[int, str]]) -> list[tuple[int, str, str | None]]:
    out: list[tuple[int, str, str | None]] = []
    pending = None
    for k, (number, line) in enumerate(body):
        if not line.startswith("$ "):
            pending = _marker(line) if line.lstrip().startswith("#") else None
            continue
        text = [line[2:]]
        for _, more in body[k + 1 :]:
            if not more.startswith("> "):
                break
            text.append(more[2:])
        command = "\n".join(text)
        out.append((number, command, _marker(command) or pending))
        pending = None
    return out


def _marker(text: str) -> str | None:
    for line in text.splitlines():
        m = MARKER.search(line)
        if m:
            return m.group(1)
    return None


def all_commands() -> list[DocCommand]:
    return [c for path in doc_files() for c in commands(path)]
