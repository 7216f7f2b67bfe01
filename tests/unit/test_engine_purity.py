"""The engine is pure: importing it loads no I/O library, and its source does no file or process I/O.

The pure core is `slurm_hetero.engine` and the records it takes (`model`, `devicespec`, `units`,
`errors`, `slurm.syntax`); adapters (`catalog`, `inventory`, `nodes`, `vendors`, `cli`, ...) do the
I/O and hand the engine plain data.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "slurm_hetero"
PURE_FILES = sorted(
    [
        *(PACKAGE / "engine").glob("*.py"),
        PACKAGE / "model.py",
        PACKAGE / "devicespec.py",
        PACKAGE / "units.py",
        PACKAGE / "errors.py",
        PACKAGE / "slurm" / "syntax.py",
    ]
)
FORBIDDEN_MODULES = ("subprocess", "yaml", "click", "jinja2", "ClusterShell", "pynvml")
FORBIDDEN_IMPORTS = {"os", "io", "pathlib", "glob", "tempfile", "shutil", "socket", *FORBIDDEN_MODULES}
FORBIDDEN_CALLS = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "exec", "eval"}

IMPORT_ALL = """
import importlib, json, pkgutil, sys
import slurm_hetero.engine as engine
for info in pkgutil.iter_modules(engine.__path__):
    importlib.import_module(f"slurm_hetero.engine.{info.name}")
importlib.import_module("slurm_hetero.slurm.syntax")
print(json.dumps(sorted(sys.modules)))
"""


def test_importing_the_engine_loads_no_io_library() -> None:
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    loaded = set(json.loads(out))
    bad = sorted(m for m in loaded if m.split(".")[0] in FORBIDDEN_MODULES)
    assert bad == []
    adapters = sorted(m for m in loaded if m.startswith("slurm_hetero.") and m.split(".")[1] in {
        "catalog", "inventory", "nodes", "vendors", "cli", "config", "hostlist", "proc", "render", "launch",
    })  # fmt: skip
    assert adapters == []


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [(node.module or "").split(".")[0]] if node.level == 0 else []
        else:
            names = []
        found += [f"{path.name}:{node.lineno} imports {n}" for n in names if n in FORBIDDEN_IMPORTS]
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if name in FORBIDDEN_CALLS:
                found.append(f"{path.name}:{node.lineno} calls {name}()")
        if isinstance(node, ast.Attribute) and node.attr == "environ":
            found.append(f"{path.name}:{node.lineno} reads environ")
    return found


@pytest.mark.parametrize("path", PURE_FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_pure_source_does_no_file_or_process_io(path: Path) -> None:
    assert _violations(path) == []


def test_the_checker_catches_io(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nfrom pathlib import Path\nx = open('f')\ny = Path('a').read_text()\n")
    assert len(_violations(sample)) == 4
