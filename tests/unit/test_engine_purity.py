"""The engine is pure: importing it loads no I/O library, and its source does no file or process I/O.

The pure core is `slurm_hetero.engine` and the records it takes (`core.model`, `core.devicespec`,
`core.units`, `core.errors`, `slurm.syntax`); adapters (`inventory`, `vendors`, `cli`, ...) do the
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
        PACKAGE / "core" / "model.py",
        PACKAGE / "core" / "devicespec.py",
        PACKAGE / "core" / "units.py",
        PACKAGE / "core" / "errors.py",
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
    adapters = sorted(m for m in loaded if m.startswith("slurm_hetero.") and (
        m.split(".")[1] in {"inventory", "node", "vendors", "cli", "render", "launch", "submit", "accounting"}
        or m in {"slurm_hetero.core.hostlist", "slurm_hetero.core.proc"}
    ))  # fmt: skip
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


# The rooms of ARCHITECTURE.md, by layer: each is a package (or two); a module imports from its own
# room, from a lower layer, or, on the rooms floor, from a room ROOM_USES names. Keep the two in step.
CORE = {"__init__", "core", "data", "schemas", "slurm", "layout"}
ROOMS = {
    "inventory": {"inventory", "vendors"},
    "node": {"node"},
    "render": {"render"},
    "request": {"submit"},
    "training": {"launch", "training"},
    "accounting": {"accounting"},
}
ROOM_USES = {
    "node": {"inventory"},
    "render": {"inventory"},
    "request": {"inventory"},
    "training": {"inventory"},
    "accounting": {"inventory"},
}
TOP = {"cli", "entry", "__main__"}


def _room_of(module: str) -> str:
    """`slurm_hetero.launch.plan` -> `training`; core modules are `core`, the engine `engine`."""
    top = module.split(".")[1] if "." in module else "__init__"
    if top in CORE:
        return "core"
    if top == "engine" or top in TOP:
        return "engine" if top == "engine" else "top"
    return next(room for room, members in ROOMS.items() if top in members)


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every absolute slurm_hetero import in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("slurm_hetero")
        ):
            module = node.module or ""
            names = [a.name for a in node.names]
            if module == "slurm_hetero":  # `from slurm_hetero import inventory`: the modules named
                found += [(node.lineno, f"slurm_hetero.{n}", []) for n in names if n != "__version__"]
            else:
                found.append((node.lineno, module, names))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.startswith("slurm_hetero.")]
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_module_has_a_room() -> None:
    for path in PACKAGE.rglob("*.py"):
        _room_of(_module_name(path))  # StopIteration names a module ARCHITECTURE.md does not place


def test_imports_follow_the_rooms_of_architecture_md() -> None:
    """Core imports only core; the engine core and engine; a room core, the engine, itself and the
    rooms it may use; nothing imports the CLI. No import passes another module's private name."""
    allowed = {"core": {"core"}, "engine": {"core", "engine"}, "top": {"core", "engine", "top", *ROOMS}}
    allowed.update({room: {"core", "engine", room, *ROOM_USES.get(room, ())} for room in ROOMS})
    broken = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = _module_name(path)
        for line, module, names in _imports(path):
            if _room_of(module) not in allowed[_room_of(here)]:
                broken.append(f"{path.relative_to(REPO)}:{line}: {_room_of(here)} imports {module}")
            broken += [
                f"{path.relative_to(REPO)}:{line}: private {n} of {module}"
                for n in names
                if n.startswith("_")
            ]
    assert broken == []


def test_the_rooms_are_those_architecture_md_names() -> None:
    text = (REPO / "ARCHITECTURE.md").read_text()
    for room, members in ROOMS.items():
        assert f"**{room}**" in text, room
        for member in members:
            assert f"`{member}" in text, member
