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

from slurm_hetero.cli import cli
from slurm_hetero.core.errors import HeteroError, ToolError
from slurm_hetero.node import install as inst

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "gres_conf" / "examples" / "mixed.yaml"


class FakeBuild:
    """Stands in for `python -m venv` and pip; records argv; `fail` makes pip fail."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.fail = False

    def __call__(self, argv: Sequence[str], timeout: float = 60.0) -> str:
        argv = [str(a) for a in argv]
        if argv[0] == "runuser":  # the check that job users can run --python: see its own test
            return ""
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


def test_an_upgrade_keeps_the_taskprologs_config_unless_given_another(
    build: FakeBuild, layout: inst.Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admin's `install --upgrade` without --config dropped the shard sizes the TaskProlog reads
    (the dev cluster's shared l40s then got no MPS memory limit)."""
    stamps = iter(["20260101T000000", "20260101T000001", "20260101T000002"])
    monkeypatch.setattr(inst.time, "strftime", lambda fmt: next(stamps))
    inst.install(layout, PYTHON, ROOT, config="/etc/slurm/site.yaml")
    inst.install(layout, PYTHON, ROOT, upgrade=True)
    assert "--config /etc/slurm/site.yaml" in layout.scripts()["taskprolog"].read_text()
    inst.install(layout, PYTHON, ROOT, config="/etc/slurm/other.yaml", upgrade=True)
    assert "--config /etc/slurm/other.yaml" in layout.scripts()["taskprolog"].read_text()


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
    assert not layout.prefix.exists()  # not even the lock file (the adversarial pass)


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
    assert f"left {health} (not as install wrote it: edited or replaced; remove it yourself)" in done
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


def test_a_slurm_etc_with_whitespace_is_printed_double_quoted_as_slurm_conf_reads_it(
    build: FakeBuild, tmp_path: Path
) -> None:
    # Slurm ends a bare value at whitespace: `TaskProlog=/x/with space/...` named `/x/with`
    spaced = tmp_path / "with space"
    layout = inst.Layout(spaced / "pre", spaced / "etc", tmp_path / "bin", tmp_path / "site")
    where = ["--prefix", str(layout.prefix), "--slurm-etc", str(layout.etc), "--bin-dir", str(layout.bin_dir)]
    where += ["--site-dir", str(layout.site), "--python", str(PYTHON)]
    result = CliRunner().invoke(cli, ["install", *where])
    assert result.exit_code == 0, result.output
    assert f'slurm.conf: TaskProlog="{layout.etc}/slurm-hetero-taskprolog"\n' in result.output
    assert f'slurm.conf: HealthCheckProgram="{layout.etc}/slurm-hetero-health"\n' in result.output
    where[1], where[3] = str(tmp_path / "p2"), str(tmp_path / 'a "quoted" etc')
    result = CliRunner().invoke(cli, ["install", *where])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "cannot name a path with a double quote and whitespace" in result.output
    assert not (tmp_path / "p2").exists() and not Path(where[3]).exists()


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


@pytest.mark.parametrize("name", ["with space", "d$(id>&2)", "s;touch x;y", "q'uote"])
def test_paths_are_shell_quoted_in_every_script(build: FakeBuild, tmp_path: Path, name: str) -> None:
    import shlex

    layout = inst.Layout(tmp_path / name / "opt", tmp_path / name / "etc", tmp_path / "bin", tmp_path / name)
    manifest = inst.install(layout, PYTHON, ROOT, config=f"/etc/{name}.yaml")
    prolog = layout.scripts()["taskprolog"].read_text().splitlines()[-1]
    python = f"{manifest['venv']}/bin/python"
    assert shlex.split(prolog) == [
        "exec", python, "-I", "-m", "slurm_hetero", "task-prolog", "--inventory", str(layout.inventory),
        "--config", f"/etc/{name}.yaml",
    ]  # fmt: skip
    assert shlex.split(layout.scripts()["command"].read_text().splitlines()[-1])[1] == python


@pytest.mark.parametrize("bad", ["\n", "\r", "\x1b"])
def test_a_path_with_a_control_character_is_refused_before_anything(
    build: FakeBuild, layout: inst.Layout, bad: str
) -> None:
    with pytest.raises(HeteroError, match="--config .* holds the control character"):
        inst.install(layout, PYTHON, ROOT, config=f"/etc/x.yaml{bad}touch /tmp/pwn")
    broken = inst.Layout(layout.prefix / f"a{bad}b", layout.etc, layout.bin_dir, layout.site)
    with pytest.raises(HeteroError, match="--prefix .* holds the control character"):
        inst.install(broken, PYTHON, ROOT)
    assert build.calls == [] and not layout.prefix.exists()


@pytest.mark.parametrize("which", ["prefix", "etc", "bin_dir"])
def test_a_path_that_is_a_file_is_one_line_and_nothing_is_written(
    build: FakeBuild, layout: inst.Layout, which: str
) -> None:
    target = getattr(layout, which)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("a file")
    with pytest.raises(HeteroError, match=f"{target} is a file, not a directory; move it"):
        inst.install(layout, PYTHON, ROOT)
    assert not layout.manifest.exists() and not any(
        p.exists() for p in layout.scripts().values() if p.parent != target
    )
    assert not layout.venvs.exists() or list(layout.venvs.iterdir()) == []


def test_an_upgrade_that_fails_writing_leaves_the_old_install_whole(
    build: FakeBuild, layout: inst.Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = inst.install(layout, PYTHON, ROOT)
    before = {p: p.read_bytes() for p in [*layout.scripts().values(), layout.manifest]}
    real = inst.tempfile.mkstemp

    def full_in_bin(*args: object, dir: Path, **kw: object) -> tuple[int, str]:
        if Path(dir) == layout.bin_dir:  # the last script: etc's are already staged
            raise OSError(28, "No space left on device", str(dir))
        return real(*args, dir=dir, **kw)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(inst.tempfile, "mkstemp", full_in_bin)
    with pytest.raises(HeteroError, match="No space left on device; nothing changed"):
        inst.install(layout, PYTHON, ROOT, upgrade=True)
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(layout.venvs.iterdir()) == [Path(first["venv"])]
    assert [p.name for p in layout.etc.iterdir()] == [
        p.name for p in layout.etc.iterdir() if not p.name.startswith(".")
    ]


def test_a_full_disk_names_the_file_being_written_not_the_new_venv(
    build: FakeBuild, layout: inst.Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adv34 H10/H11: a full --slurm-etc or --site-dir was reported as the new venv's path (a write
    that fails names no file), which had room."""

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(inst.os, "fsync", full)
    with pytest.raises(HeteroError) as e:
        inst.install(layout, PYTHON, ROOT)
    written = [str(p) for p in layout.scripts().values()] + [str(layout.manifest)]
    said = str(e.value)
    assert said.endswith(": No space left on device; nothing changed") and "venvs" not in said, said
    assert said.removeprefix("cannot write ").split(": ")[0] in written, said


def test_a_read_only_file_system_is_one_line(
    build: FakeBuild, layout: inst.Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(self: Path, *args: object, **kw: object) -> None:
        raise OSError(30, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    result = CliRunner().invoke(cli, ["install", "--prefix", str(layout.prefix), "--python", str(PYTHON)])
    assert result.exit_code == 1 and result.output == (
        f"slurm-hetero: cannot write {layout.prefix}: Read-only file system; nothing changed\n"
    )


def test_directories_made_and_the_site_dir_open_to_every_user_whatever_the_umask(
    build: FakeBuild, tmp_path: Path
) -> None:
    layout = inst.Layout(
        tmp_path / "o" / "opt", tmp_path / "e" / "etc", tmp_path / "b" / "bin", tmp_path / "site"
    )
    layout.site.mkdir(mode=0o700)
    layout.site.chmod(0o700)  # a site dir made by hand under umask 077
    saved = os.umask(0o077)
    try:
        inst.install(layout, PYTHON, ROOT, EXAMPLE)
    finally:
        os.umask(saved)
    for directory in [layout.prefix, layout.prefix.parent, layout.etc, layout.etc.parent, layout.bin_dir]:
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755, directory
    assert stat.S_IMODE(layout.site.stat().st_mode) == 0o755
    assert stat.S_IMODE(layout.inventory.stat().st_mode) == 0o644


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/sbin/runuser").exists(), reason="runs as nobody")
def test_a_python_that_nobody_can_run_is_refused_even_behind_an_open_wrapper(tmp_path: Path) -> None:
    import tempfile

    closed = Path(tempfile.mkdtemp(dir="/tmp"))  # 0700, as /root
    opened = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        (closed / "python3").symlink_to(PYTHON)
        wrapper = opened / "python3"
        wrapper.write_text(f'#!/bin/sh\nexec {closed}/python3 "$@"\n')
        wrapper.chmod(0o755)
        opened.chmod(0o755)
        with pytest.raises(HeteroError, match=r"the user nobody cannot run it \(.*Permission denied.*\)"):
            inst._check_python(wrapper)
        inst._check_python(PYTHON)  # a system Python passes
    finally:
        for d in (closed, opened):
            for f in d.iterdir():
                f.unlink()
            d.rmdir()


def test_another_installs_scripts_are_refused_and_uninstall_keeps_what_it_did_not_write(
    build: FakeBuild, tmp_path: Path
) -> None:
    a = inst.Layout(tmp_path / "a", tmp_path / "etc", tmp_path / "bin", tmp_path / "site")
    b = inst.Layout(tmp_path / "b", a.etc, a.bin_dir, a.site)
    inst.install(a, PYTHON, ROOT)
    with pytest.raises(HeteroError, match=f"belongs to the install of {a.manifest}; uninstall that one"):
        inst.install(b, PYTHON, ROOT)
    assert not b.manifest.exists()
    inst.install(a, PYTHON, ROOT, upgrade=True)  # its own scripts: fine
    health = a.scripts()["health"]
    health.write_text(health.read_text() + "echo extra check\n")  # MARK kept, content edited
    done = inst.uninstall(a, [conf(a, "# nothing\n")])
    assert f"left {health} (not as install wrote it: edited or replaced; remove it yourself)" in done
    assert health.exists() and not a.scripts()["taskprolog"].exists()


@pytest.mark.parametrize("spell", ["link", "double_slash", "dot"])
def test_uninstall_sees_the_scripts_however_slurm_conf_spells_the_path(
    build: FakeBuild, layout: inst.Layout, tmp_path: Path, spell: str
) -> None:
    inst.install(layout, PYTHON, ROOT)
    (tmp_path / "etclink").symlink_to(layout.etc)
    named = {
        "link": tmp_path / "etclink" / "slurm-hetero-health",
        "double_slash": f"{layout.etc.parent}//{layout.etc.name}/slurm-hetero-health",
        "dot": f"{layout.etc}/./slurm-hetero-health",
    }[spell]
    with pytest.raises(HeteroError, match="Slurm still runs what uninstall would remove"):
        inst.uninstall(layout, [conf(layout, f'HealthCheckProgram="{named}"\n')])
    assert layout.manifest.exists()


@pytest.mark.parametrize("text", [b"\x00\xff\xfe garbage", b"Include /nonexistent/nodes.conf\n"])
def test_uninstall_refuses_when_it_cannot_read_slurm_conf_or_an_include(
    build: FakeBuild, layout: inst.Layout, text: bytes
) -> None:
    inst.install(layout, PYTHON, ROOT)
    path = conf(layout, "")
    path.write_bytes(text)
    with pytest.raises(HeteroError, match="nothing removed"):
        inst.uninstall(layout, [path])
    assert layout.manifest.exists() and all(p.exists() for p in layout.scripts().values())


def test_upgrade_and_uninstall_together_is_a_usage_error(build: FakeBuild, layout: inst.Layout) -> None:
    inst.install(layout, PYTHON, ROOT)
    result = CliRunner().invoke(cli, ["install", "--prefix", str(layout.prefix), "--upgrade", "--uninstall"])
    assert result.exit_code == 2 and "exclude each other" in result.output
    assert layout.manifest.exists()


def test_the_taskprolog_outlives_a_checkpoint_signal_as_it_starts(tmp_path: Path) -> None:
    """adv52 S03/T01: `scancel --signal=USR1 J.S` as a step started reached its TaskProlog (Slurm
    signals every process of the step) and killed it while Python started: TaskProlog failed,
    srun exit 1, the command never ran (10 of 10 on 22.05)."""
    import signal
    import subprocess
    import time

    python = tmp_path / "python"  # stands in for the venv's: slow to start, then done
    python.write_text("#!/bin/sh\nsleep 1\necho started\n")
    python.chmod(0o755)
    script = tmp_path / "taskprolog"
    script.write_text(inst.script_text("taskprolog", python, inst.Layout(site=Path("/x")), None))
    script.chmod(0o755)
    prolog = subprocess.Popen([str(script)], stdout=subprocess.PIPE)
    time.sleep(0.3)
    for signum in (signal.SIGUSR1, signal.SIGUSR2):
        prolog.send_signal(signum)
    out, _ = prolog.communicate(timeout=10)
    assert prolog.returncode == 0 and out == b"started\n", (prolog.returncode, out)
