"""`slurm-hetero install`: layout, modes, upgrade and the uninstall guard, with the venv build
(`proc.run`) simulated; tests/integration/test_install_slurm.py builds real ones on the dev cluster."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_hetero import install as inst
from slurm_hetero.cli import cli
from slurm_hetero.errors import HeteroError, ToolError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "gres_conf" / "examples" / "mixed.yaml"


class FakeBuild:
    """Stands in for `python -m venv` and pip; records argv; `fail` makes pip fail."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.fail = False

    def __call__(self, argv: Sequence[str], timeout: float = 60.0) -> str:
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        if argv[1:3] == ["-m", "venv"]:
            python = Path(argv[3]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.write_text("#!/bin/sh\n")
            python.chmod(0o700)
            (python.parent.parent / "lib").mkdir()
            (python.parent.parent / "lib" / "mod.py").write_text("x = 1\n")
        elif "pip" in argv and self.fail:
            raise ToolError(argv, 1, "No matching distribution found")
        elif argv[-1] == "--version":
            return "slurm-hetero, version 9.9\n"
        return ""


@pytest.fixture
def build(monkeypatch: pytest.MonkeyPatch) -> FakeBuild:
    fake = FakeBuild()
    monkeypatch.setattr(inst.proc, "run", fake)
    return fake


@pytest.fixture
def layout(tmp_path: Path) -> inst.Layout:
    return inst.Layout(tmp_path / "opt", tmp_path / "etc", tmp_path / "bin", tmp_path / "site")


PYTHON = Path("/usr/bin/python3") if Path("/usr/bin/python3").exists() else Path("/bin/sh")


def test_install_writes_scripts_naming_the_new_venv_and_an_inventory_every_user_reads(
    build: FakeBuild, layout: inst.Layout
) -> None:
    layout.site.mkdir()
    layout.inventory.write_text("old")
    layout.inventory.chmod(0o600)  # a copy kept its mode before: non-root jobs lost their variable
    manifest = inst.install(layout, PYTHON, ROOT, EXAMPLE)
    venv = Path(manifest["venv"])
    assert venv.parent == layout.venvs and manifest["version"] == "9.9"
    assert stat.S_IMODE(layout.inventory.stat().st_mode) == 0o644
    assert layout.inventory.read_bytes() == EXAMPLE.read_bytes()
    prolog = layout.scripts()["taskprolog"]
    assert stat.S_IMODE(prolog.stat().st_mode) == 0o755
    assert f"exec {venv}/bin/python -I -m slurm_hetero task-prolog --inventory {layout.inventory}\n" in (
        prolog.read_text()
    )
    assert '-I -m slurm_hetero "$@"' in layout.scripts()["command"].read_text()
    assert "health --inventory" in layout.scripts()["health"].read_text()
    # a root umask of 077 must not leave the venv closed to job users
    assert stat.S_IMODE((venv / "bin" / "python").stat().st_mode) & 0o055 == 0o055
    assert json.loads(layout.manifest.read_text())["venv"] == str(venv)
    assert (layout.prefix / "venv").resolve() == venv.resolve()


def test_install_twice_asks_for_upgrade_and_upgrade_needs_an_install(
    build: FakeBuild, layout: inst.Layout
) -> None:
    with pytest.raises(HeteroError, match="nothing installed .* to upgrade"):
        inst.install(layout, PYTHON, ROOT, upgrade=True)
    inst.install(layout, PYTHON, ROOT)
    with pytest.raises(HeteroError, match="already installed .*pass --upgrade"):
        inst.install(layout, PYTHON, ROOT)


def test_upgrade_builds_beside_the_current_venv_from_hard_links_and_keeps_the_previous(
    build: FakeBuild, layout: inst.Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    stamps = iter(["20260101T000000", "20260101T000001", "20260101T000002"])
    monkeypatch.setattr(inst.time, "strftime", lambda fmt: next(stamps))
    first = Path(inst.install(layout, PYTHON, ROOT)["venv"])
    second = Path(inst.install(layout, PYTHON, ROOT, upgrade=True)["venv"])
    assert second != first and first.exists()  # a task that read the old script still runs it
    assert os.path.samefile(first / "lib" / "mod.py", second / "lib" / "mod.py")  # linked, not rebuilt
    pip = [c for c in build.calls if "pip" in c and "install" in c][-1]
    assert "--force-reinstall" in pip and "--no-deps" in pip
    assert str(second) in layout.scripts()["taskprolog"].read_text()
    assert os.readlink(layout.prefix / "venv") == f"venvs/{second.name}"
    third = inst.install(layout, PYTHON, ROOT, upgrade=True)
    assert third["removed_venvs"] == [str(first)] and second.exists()


def test_a_failed_build_changes_nothing(build: FakeBuild, layout: inst.Layout) -> None:
    first = inst.install(layout, PYTHON, ROOT)
    before = {p: p.read_text() for p in layout.scripts().values()}
    build.fail = True
    with pytest.raises(HeteroError, match="failed, nothing changed: .*No matching distribution"):
        inst.install(layout, PYTHON, ROOT, upgrade=True)
    assert {p: p.read_text() for p in layout.scripts().values()} == before
    assert sorted(layout.venvs.iterdir()) == [Path(first["venv"])]


def test_a_python_other_users_cannot_reach_is_refused(
    build: FakeBuild, layout: inst.Layout, tmp_path: Path
) -> None:
    home = tmp_path / "root"
    (home / "bin").mkdir(parents=True)
    python = home / "bin" / "python3"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    home.chmod(0o700)  # /root/.pyenv: job users got "No such file or directory"
    with pytest.raises(HeteroError, match=r"not open to other users \(drwx------\).*/usr/bin/python3"):
        inst.install(layout, python, ROOT)
    assert not layout.manifest.exists()


def test_a_bad_inventory_stops_before_anything_is_built(
    build: FakeBuild, layout: inst.Layout, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nnodes: 7\n")
    with pytest.raises(HeteroError):
        inst.install(layout, PYTHON, ROOT, bad)
    assert build.calls == [] and not layout.venvs.exists()


def conf(layout: inst.Layout, text: str) -> Path:
    layout.etc.mkdir(parents=True, exist_ok=True)
    path = layout.etc / "slurm.conf"
    path.write_text(text)
    return path


def test_uninstall_refuses_while_slurm_conf_names_a_script_and_names_the_line(
    build: FakeBuild, layout: inst.Layout
) -> None:
    inst.install(layout, PYTHON, ROOT, EXAMPLE)
    prolog = layout.scripts()["taskprolog"]
    (layout.etc / "nodes.d").mkdir(parents=True)
    (layout.etc / "nodes.d" / "health.conf").write_text(f"HealthCheckProgram={layout.scripts()['health']}\n")
    path = conf(layout, f"# TaskProlog={prolog}\nTaskProlog={prolog}\nInclude nodes.d/*.conf\n")
    with pytest.raises(HeteroError) as e:
        inst.uninstall(layout, [path])
    assert f"{path}:2: TaskProlog={prolog}" in str(e.value)
    assert "health.conf:1: HealthCheckProgram=" in str(e.value)
    assert str(e.value).endswith("then uninstall again; nothing removed")
    assert prolog.exists() and layout.manifest.exists()


def test_uninstall_removes_what_install_wrote_and_leaves_the_rest(
    build: FakeBuild, layout: inst.Layout
) -> None:
    inst.install(layout, PYTHON, ROOT, EXAMPLE)
    health = layout.scripts()["health"]
    health.write_text("#!/bin/sh\nexec my-own-check\n")  # the admin's own script now
    # a longer name that merely starts like ours is another file
    path = conf(layout, f"TaskProlog={layout.scripts()['taskprolog']}.site\n")
    done = inst.uninstall(layout, [path])
    assert f"left {health} (not written by install)" in done
    assert f"left {layout.inventory} (site data)" in done
    assert not layout.scripts()["taskprolog"].exists() and not layout.scripts()["command"].exists()
    assert not layout.prefix.exists() and health.exists() and layout.inventory.exists()


def test_uninstall_without_a_slurm_conf_to_check_removes_nothing(
    build: FakeBuild, layout: inst.Layout
) -> None:
    inst.install(layout, PYTHON, ROOT)
    with pytest.raises(HeteroError, match="pass --slurm-conf FILE .*nothing removed"):
        inst.uninstall(layout, [layout.etc / "slurm.conf"])
    with pytest.raises(HeteroError, match="nothing installed"):
        inst.uninstall(inst.Layout(layout.prefix / "x"), [])


def test_the_command_prints_the_slurm_conf_lines_and_errors_in_one_line(
    build: FakeBuild, layout: inst.Layout
) -> None:
    where = ["--prefix", str(layout.prefix), "--slurm-etc", str(layout.etc), "--bin-dir", str(layout.bin_dir)]
    where += ["--site-dir", str(layout.site), "--python", str(PYTHON)]
    result = CliRunner().invoke(cli, ["install", *where])
    assert result.exit_code == 0, result.output
    assert f"slurm.conf: TaskProlog={layout.scripts()['taskprolog']}" in result.output
    result = CliRunner().invoke(cli, ["install", *where])
    assert result.exit_code == 1
    assert result.output.startswith("slurm-hetero: already installed") and result.output.count("\n") == 1


def test_a_venv_directory_install_did_not_make_is_left_alone(build: FakeBuild, layout: inst.Layout) -> None:
    (layout.prefix / "venv" / "bin").mkdir(parents=True)
    with pytest.raises(HeteroError, match="venv is a directory install did not make"):
        inst.install(layout, PYTHON, ROOT)
    assert build.calls == []


def test_a_second_install_at_once_is_refused(build: FakeBuild, layout: inst.Layout) -> None:
    import fcntl

    layout.prefix.mkdir(parents=True)
    with open(layout.prefix / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(HeteroError, match="another install runs in .*wait for it to end"):
            inst.install(layout, PYTHON, ROOT)
    assert build.calls == []
