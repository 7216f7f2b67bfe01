"""scripts/dev-cluster's installs, on a release root under a temporary directory (no Slurm)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType

import pytest

from scripts.devcluster.release import Release
from tests.conftest import REPO


def dev_cluster() -> ModuleType:
    loader = SourceFileLoader("dev_cluster", str(REPO / "scripts" / "dev-cluster"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_files_jobs_read_are_installed_readable_whatever_was_there(tmp_path: Path) -> None:
    """Issue 26 repro 2: the 22.05 dev cluster installed the TaskProlog's inventory 0600 (a kept
    file's mode, or the umask's), so every non-root task lost its vendor's visible-device variable."""
    module = dev_cluster()
    root = tmp_path / "root"
    rel = Release("24.11", root, "trixie", 1, 2, 3)
    etc, site = rel.path("/etc/slurm"), rel.path("/etc/slurm-hetero/inventory.yaml")
    etc.mkdir(parents=True)
    site.parent.mkdir(parents=True)
    for kept in (etc / "slurm-hetero-inventory.yaml", site, etc / "gres.conf"):
        kept.write_text("old\n")
        kept.chmod(0o600)
    source = tmp_path / "inventory.yaml"
    source.write_text("version: 1\nnodes: []\n")
    source.chmod(0o600)
    old_umask = os.umask(0o077)
    try:
        module.install_configs(rel, {"gres.conf": "x\n", "slurm-nodes.conf": "y\n"}, source)
    finally:
        os.umask(old_umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (*etc.glob("[!.]*"), site)}
    assert modes == {
        "slurm-hetero-inventory.yaml": 0o644,
        "inventory.yaml": 0o644,
        "gres.conf": 0o644,
        "slurm-nodes.conf": 0o644,
        "cgroup.conf": 0o644,
    }, {k: oct(v) for k, v in modes.items()}
    assert site.parent.stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize("text", ["a\n", None])
def test_install_readable_sets_0644(tmp_path: Path, text: str | None) -> None:
    path, source = tmp_path / "f", tmp_path / "src"
    source.write_text("b\n")
    path.write_text("")
    path.chmod(0o600)
    dev_cluster().install_readable(path, text, None if text else source)
    assert path.stat().st_mode & 0o777 == 0o644 and path.read_text() == (text or "b\n")


def test_the_checkout_is_installed_into_the_root_readable_under_umask_077(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adv26 m-venv-24.11: under umask 077 the chroot's venv got slurm_hetero/ 0700 and its files
    0600 (and /opt/slurm-hetero/src 0700): every non-root task's TaskProlog failed."""
    from scripts.devcluster import troot

    seen: list[tuple[list[str], int]] = []

    def run(*argv: str, **kw: object) -> None:
        umask = os.umask(0o077)
        os.umask(umask)
        seen.append((list(argv), umask))

    monkeypatch.setattr(troot, "_run", run)
    (tmp_path / "etc").mkdir()
    old = os.umask(0o077)
    try:
        troot.install_checkout(tmp_path)
        assert os.umask(0o077) == 0o077  # the caller's umask is back
    finally:
        os.umask(old)
    src = tmp_path / "opt" / "slurm-hetero" / "src"
    for path in [
        src,
        src / "pyproject.toml",
        src / "slurm_hetero",
        src / "slurm_hetero" / "core" / "proc.py",
    ]:
        assert path.stat().st_mode & 0o044 == 0o044, (path, oct(path.stat().st_mode))
    [(argv, umask)] = seen
    assert argv[:2] == ["chroot", str(tmp_path)] and "pip" in argv and umask == 0o022


def test_every_name_the_scripts_import_from_the_package_exists() -> None:
    """The scripts import inside functions that only a real cluster or a benchmark runs: a name
    removed from the package must fail here, not on the next `dev-cluster up`."""
    scripts = [p for p in (REPO / "scripts").rglob("*") if p.is_file() and p.suffix in ("", ".py")]
    missing = []
    for path in scripts:
        try:
            tree = ast.parse(path.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue  # a shell script
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("slurm_hetero"):
                module = importlib.import_module(node.module or "")
                missing += [
                    f"{path.name}: {node.module}.{alias.name}"
                    for alias in node.names
                    if not hasattr(module, alias.name)
                    and not (
                        hasattr(module, "__path__")
                        and importlib.util.find_spec(f"{node.module}.{alias.name}")
                    )
                ]
    assert len(scripts) > 5 and not missing
