"""The one writer of config sets (writefile): a set is complete-new or byte-identical-old, under
errors at every system call, crashes at every system call, a full disk at every size, and
concurrent renders; backups are unique and whole; nothing else is left beside the set."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from slurm_hetero.cli import cli
from slurm_hetero.core import writefile as write
from slurm_hetero.core.errors import OutputError
from slurm_hetero.core.writefile import LOCK_NAME, recover, write_atomic
from tests.conftest import REPO

OLD = {"gres.conf": "NodeName=n1 Name=gpu Type=a100 File=/dev/nvidia0\n" * 50, "slurm-nodes.conf": "o\n"}
NEW = {"gres.conf": "NodeName=n1 Name=gpu Type=h100 File=/dev/nvidia[0-1]\n" * 80, "slurm-nodes.conf": "n\n"}
PATCHED = ("open", "write", "fsync", "replace", "rename", "link", "unlink", "utime", "fchmod")


def files(directory: Path, contents: dict[str, str]) -> dict[Path, str]:
    return {directory / name: text for name, text in contents.items()}


def listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def assert_old_or_new(directory: Path, before: dict[str, bytes]) -> str:
    """The set is byte-identical old (and the directory exactly as before) or complete new with
    one backup per old file; nothing else is there. Returns "old" or "new"."""
    now = listing(directory)
    if all(now.get(n) == before.get(n) for n in OLD):
        assert now == before, sorted(set(now) ^ set(before))
        return "old"
    assert {n: now[n].decode() for n in NEW} == NEW, "a set that is neither old nor new"
    extra = sorted(set(now) - set(before) - set(NEW))
    assert len(extra) == len(OLD) and all(n.endswith(".bak") for n in extra), extra
    for name in OLD:
        backup = next(n for n in extra if n.startswith(name + "."))
        assert now[backup] == before[name], f"{backup} is not the whole old {name}"
    return "new"


@pytest.fixture
def old_set(tmp_path: Path) -> Iterator[tuple[Path, dict[str, bytes]]]:
    write_atomic(files(tmp_path, OLD), backup=False)
    yield tmp_path, listing(tmp_path)


def test_a_set_is_written_whole_once_and_unchanged_renders_write_nothing(tmp_path: Path) -> None:
    assert write_atomic(files(tmp_path, OLD)) == [tmp_path / n for n in OLD]
    assert write_atomic(files(tmp_path, OLD)) == []
    changed = {**OLD, "gres.conf": "changed\n"}
    assert write_atomic(files(tmp_path, changed)) == [tmp_path / n for n in OLD]  # both, not one
    backups = [f"{n}.{_stamp(tmp_path, n)}" for n in OLD]
    assert sorted(listing(tmp_path)) == sorted([LOCK_NAME, *OLD, *backups])


@pytest.mark.parametrize(
    "names", [("gres.conf", "slurm-nodes.conf"), ("inventory.yaml",)], ids=["set", "single"]
)
def test_files_for_other_readers_are_readable_whatever_their_mode_was(
    tmp_path: Path, names: tuple[str, ...]
) -> None:
    """Issue 26 repro 2: a file kept 0600 hid it from its readers (sbatch, the TaskProlog as the
    job's user); written or left unchanged, every file ends readable by all, other bits kept."""
    contents = {n: f"{n}\n" for n in names}
    for name in names:
        (tmp_path / name).write_text("old\n")
        (tmp_path / name).chmod(0o600)
    old_umask = os.umask(0o077)
    try:
        write_atomic(files(tmp_path, contents))
        assert {oct((tmp_path / n).stat().st_mode & 0o777) for n in names} == {"0o644"}
        for name in names:
            (tmp_path / name).chmod(0o620)
        assert write_atomic(files(tmp_path, contents)) == []  # same text: only the mode changes
        assert {oct((tmp_path / n).stat().st_mode & 0o777) for n in names} == {"0o664"}
        (tmp_path / "new.conf").unlink(missing_ok=True)
        write_atomic({tmp_path / "new.conf": "new\n"})
        assert (tmp_path / "new.conf").stat().st_mode & 0o777 == 0o644  # not the umask's 0600
    finally:
        os.umask(old_umask)


def _stamp(directory: Path, name: str) -> str:
    return next(p.name for p in directory.glob(f"{name}.*.bak")).removeprefix(name + ".")


def test_renders_in_the_same_second_keep_every_backup(tmp_path: Path) -> None:
    versions = [{"gres.conf": f"v{i}\n", "slurm-nodes.conf": f"n{i}\n"} for i in range(5)]
    for version in versions:
        write_atomic(files(tmp_path, version))
    backups = sorted(tmp_path.glob("gres.conf.*.bak"), key=lambda p: p.stat().st_mtime_ns)
    assert sorted(p.read_text() for p in backups) == [f"v{i}\n" for i in range(4)]


def test_mtime_always_grows_so_slurmctld_reloads_the_hook(tmp_path: Path) -> None:
    write_atomic(files(tmp_path, OLD))
    future = time.time() + 30  # e.g. an earlier render in a later second, or a touched file
    os.utime(tmp_path / "gres.conf", (future, future))
    write_atomic(files(tmp_path, NEW))
    assert int((tmp_path / "gres.conf").stat().st_mtime) > int(future)
    assert int((tmp_path / "slurm-nodes.conf").stat().st_mtime) >= int(time.time())


class Fault:
    """Makes the k-th call (over PATCHED os functions) raise `error` or end the process."""

    def __init__(self, k: int, error: OSError | None) -> None:
        self.k, self.error, self.calls = k, error, 0

    def wrap(self, fn: Callable[..., object]) -> Callable[..., object]:
        def wrapped(*args: object, **kwargs: object) -> object:
            self.calls += 1
            if self.calls == self.k:
                if self.error is None:
                    os._exit(9)
                raise self.error
            return fn(*args, **kwargs)

        return wrapped


def _count_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    probe = tmp_path / "probe"
    probe.mkdir()
    write_atomic(files(probe, OLD), backup=False)
    fault = Fault(0, None)
    with monkeypatch.context() as m:
        for name in PATCHED:
            m.setattr(os, name, fault.wrap(getattr(os, name)))
        write_atomic(files(probe, NEW))
    return fault.calls


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EIO])
def test_an_error_at_every_system_call_leaves_old_or_new_and_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    total = _count_calls(tmp_path, monkeypatch)
    assert total > 15
    outcomes = set()
    for k in range(1, total + 1):
        directory = tmp_path / f"k{k}"
        directory.mkdir()
        write_atomic(files(directory, OLD), backup=False)
        before = listing(directory)
        fault = Fault(k, OSError(code, os.strerror(code)))
        with monkeypatch.context() as m:
            for name in PATCHED:
                m.setattr(os, name, fault.wrap(getattr(os, name)))
            try:
                write_atomic(files(directory, NEW))
            except OutputError as e:
                assert "\n" not in str(e) and os.strerror(code) in str(e)
                assert "nothing changed" in str(e) or "next render" in str(e)
        with write._locked(directory):
            recover(directory)  # what the next render does first
        outcomes.add(assert_old_or_new(directory, before))
    assert outcomes == {"old", "new"}


_CRASH = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from slurm_hetero.core.writefile import write_atomic
    directory, k = Path(sys.argv[1]), int(sys.argv[2])
    calls = [0]
    def wrap(fn):
        def wrapped(*a, **kw):
            calls[0] += 1
            if calls[0] == k:
                os._exit(9)  # as kill -9: no cleanup, no finally
            return fn(*a, **kw)
        return wrapped
    for name in {patched!r}:
        setattr(os, name, wrap(getattr(os, name)))
    write_atomic({{directory / n: t for n, t in {new!r}.items()}})
    """
)


def test_a_crash_at_every_system_call_is_finished_or_undone_by_the_next_render(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    total = _count_calls(tmp_path, monkeypatch)
    script = _CRASH.format(repo=str(REPO), patched=PATCHED, new=NEW)
    outcomes = []
    for k in range(1, total + 2):
        directory = tmp_path / f"crash{k}"
        directory.mkdir()
        write_atomic(files(directory, OLD), backup=False)
        before = listing(directory)
        rc = subprocess.run([sys.executable, "-c", script, str(directory), str(k)], check=False).returncode
        assert rc in (0, 9)
        with write._locked(directory):
            recover(directory)
        outcomes.append(assert_old_or_new(directory, before))
    assert outcomes[0] == "old" and outcomes[-1] == "new"
    assert "new" in outcomes[: total - 1]  # some crashes after the commit point were rolled forward


def test_a_render_that_finds_an_interrupted_set_finishes_it_first(tmp_path: Path) -> None:
    script = _CRASH.format(repo=str(REPO), patched=("replace",), new=NEW)
    write_atomic(files(tmp_path, OLD), backup=False)
    # the 2nd os.replace is the first file's rename (the 1st commits the journal)
    subprocess.run([sys.executable, "-c", script, str(tmp_path), "3"], check=False)
    assert (tmp_path / "gres.conf").read_text() == NEW["gres.conf"]
    assert (tmp_path / "slurm-nodes.conf").read_text() == OLD["slurm-nodes.conf"]  # torn, for now
    assert write.pending(tmp_path)
    write_atomic(files(tmp_path, NEW))
    assert {n: (tmp_path / n).read_text() for n in NEW} == NEW and not write.pending(tmp_path)


def test_concurrent_renders_serialize_on_the_lock(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(REPO)!r})
        from slurm_hetero.core.writefile import write_atomic
        d, tag = Path(sys.argv[1]), sys.argv[2]
        for i in range(30):
            line = f"{{tag}} {{i}}\\n"
            write_atomic({{d / "gres.conf": line * 200, d / "slurm-nodes.conf": line}})
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path), tag]) for tag in "ab"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    gres, nodes = (tmp_path / "gres.conf").read_text(), (tmp_path / "slurm-nodes.conf").read_text()
    assert gres == nodes * 200  # both files from the same render
    for backup in tmp_path.glob("gres.conf.*.bak"):
        partner = tmp_path / backup.name.replace("gres.conf", "slurm-nodes.conf")
        assert backup.read_text() == partner.read_text() * 200
    assert len(list(tmp_path.glob("*.bak"))) == 2 * 59
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") and p.name != LOCK_NAME]


def test_a_held_lock_times_out_with_one_line(tmp_path: Path) -> None:
    with write._locked(tmp_path), pytest.raises(OutputError, match="another render has held this lock"):
        with write._locked(tmp_path, timeout=0.2):
            pass


def test_single_files_are_atomic_without_lock_or_journal(tmp_path: Path) -> None:
    target = tmp_path / "layout.json"
    assert write_atomic({target: "{}\n"}, backup=False) == [target]
    assert listing(tmp_path) == {"layout.json": b"{}\n"}


def test_sets_live_in_one_directory(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    with pytest.raises(ValueError, match="one directory"):
        write_atomic({tmp_path / "a": "", tmp_path / "x" / "b": ""})


def test_a_damaged_journal_is_reported_not_guessed(tmp_path: Path) -> None:
    (tmp_path / write.JOURNAL_NAME).write_text("{not json")
    with pytest.raises(OutputError, match="damaged journal"):
        write_atomic(files(tmp_path, NEW))


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _free(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _render(inventory: Path, out: Path) -> Result:
    result = CliRunner().invoke(cli, ["gres", "render", "--inventory", str(inventory), "--out", str(out)])
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exception
    )  # no traceback
    return result


def test_a_full_disk_at_every_size_leaves_the_old_pair_or_the_new_one(
    small_tmpfs: Path, tmp_path: Path
) -> None:
    """Issue 9: ENOSPC during `gres render` gave a traceback, gres.conf new with slurm-nodes.conf old,
    a truncated .bak and temp files. Sweep the free space of a small tmpfs page by page."""
    old_inventory = REPO / "gres_conf" / "examples" / "mixed.yaml"
    new_inventory = tmp_path / "big.yaml"
    text = old_inventory.read_text()
    copies = [text.split("nodes:\n", 1)[1].replace("name: ", f"name: c{i}x", 3) for i in range(12)]
    new_inventory.write_text(text + "".join(c for c in copies))
    out = small_tmpfs / "etc"
    outcomes: dict[str, int] = {}
    free_pages = None
    for step in range(200):
        subprocess.run(["rm", "-rf", str(out), str(small_tmpfs / "filler")], check=True)
        out.mkdir()
        assert _render(old_inventory, out).exit_code == 0
        before = listing(out)
        free_pages = free_pages or _free(small_tmpfs) // 4096
        if step > free_pages:
            break
        with (small_tmpfs / "filler").open("wb") as f:  # leave `step` pages free
            f.write(b"\0" * max(0, _free(small_tmpfs) - step * 4096))
        result = _render(new_inventory, out)
        (small_tmpfs / "filler").unlink()
        now = listing(out)
        if result.exit_code == 0:
            assert now["gres.conf"] != before["gres.conf"] and not [
                n for n in now if n.startswith(".") and "lock" not in n
            ]
            for name in ("gres.conf", "slurm-nodes.conf"):
                backup = next(n for n in now if n.startswith(name + ".") and n.endswith(".bak"))
                assert now[backup] == before[name]
            outcomes["new"] = outcomes.get("new", 0) + 1
        else:
            assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.stderr
            assert "No space left on device" in result.stderr and "nothing changed" in result.stderr
            assert now == before, sorted(set(now) ^ set(before))
            outcomes["old"] = outcomes.get("old", 0) + 1
    print(outcomes)
    assert outcomes.get("old", 0) >= 3 and outcomes.get("new", 0) >= 1, outcomes


def test_single_files_keep_backups_without_a_lock_file(tmp_path: Path) -> None:
    target = tmp_path / "cluster.yaml"
    for version in ("a\n", "b\n", "c\n"):
        write_atomic({target: version})
    assert sorted(p.read_text() for p in tmp_path.glob("cluster.yaml.*.bak")) == ["a\n", "b\n"]
    assert not (tmp_path / LOCK_NAME).exists() and not list(tmp_path.glob(".*"))


def test_a_single_file_behind_a_link_is_written_through_it(tmp_path: Path) -> None:
    """C10: `calibrate --out LINK` merged the target's content into a new file in the link's place
    and left the target stale. A single file is written through a link: the link stays, its
    target is replaced atomically, the backup beside the target."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "target.yaml").write_text("old\n")
    link = tmp_path / "link.yaml"
    link.symlink_to("shared/target.yaml")
    assert write_atomic({link: "new\n"}) == [link]
    assert link.is_symlink() and (shared / "target.yaml").read_text() == "new\n"
    assert [p.name for p in shared.glob("target.yaml.*.bak")] and list(tmp_path.glob("link.yaml*")) == [link]


def test_calibrate_merges_into_a_linked_file(tmp_path: Path) -> None:
    from slurm_hetero.launch import calibrate as cal

    (tmp_path / "target.yaml").write_text("a100_80g: 111\n")
    link = tmp_path / "callink.yaml"
    link.symlink_to("target.yaml")
    cal.store(link, cal.Calibration("l40s", 90.0, 60.0, 5e4, "cpu", "fp32", "2025-01-01T00:00:00Z"))
    assert link.is_symlink()
    assert set(cal.load_profile(tmp_path / "target.yaml").tflops) == {"a100_80g", "l40s"}


def test_keep_backups_leaves_the_newest_of_each_file_and_never_an_admins_copy(tmp_path: Path) -> None:
    # backups piled up by the hundred in a dev machine's /etc/slurm: a write leaves the newest N
    # of each file of the set (by stamp, -N after the bare stamp), and names it did not make stay
    made = [
        "gres.conf.20261101T000000.bak",
        "gres.conf.20261101T000000-2.bak",
        "gres.conf.20261101T000000-10.bak",
        "gres.conf.20261102T000000.bak",
        "slurm-nodes.conf.20261101T000000.bak",
    ]
    foreign = [
        "gres.conf.bak",
        "gres.conf.20261101T000000.bak.keep",
        "gres.conf.mine.bak",
        "other.20261101T000000.bak",
    ]
    write_atomic(files(tmp_path, OLD), backup=False)
    for name in made + foreign:
        (tmp_path / name).write_text(name)
    write_atomic(files(tmp_path, NEW), keep_backups=2)
    left = sorted(p.name for p in tmp_path.iterdir())
    today = [n for n in left if n.endswith(".bak") and n not in made + foreign]
    assert len(today) == 2  # this write's backups of both files
    assert sorted(set(left) - set(today)) == sorted(
        [*foreign, "gres.conf", "slurm-nodes.conf", "gres.conf.20261102T000000.bak", made[4], LOCK_NAME]
    )
    with pytest.raises(ValueError):
        write_atomic(files(tmp_path, OLD), keep_backups=0)


def test_keep_backups_on_the_command_line(tmp_path: Path) -> None:
    inventory = REPO / "gres_conf" / "examples" / "mixed.yaml"
    for n in range(3):
        (tmp_path / f"gres.conf.2026010{n + 1}T000000.bak").write_text("old\n")
    render = ["gres", "render", "--inventory", str(inventory), "--out", str(tmp_path)]
    assert CliRunner().invoke(cli, render).exit_code == 0
    assert len(list(tmp_path.glob("gres.conf.*.bak"))) == 3  # the first render made none
    gres = tmp_path / "gres.conf"
    gres.write_text(gres.read_text() + "# edited\n")
    assert CliRunner().invoke(cli, [*render, "--keep-backups", "all"]).exit_code == 0
    # adversarial r6 K03: --help printed the metavar N|ALL, and ALL was refused
    assert CliRunner().invoke(cli, [*render, "--keep-backups", "ALL"]).exit_code == 0
    assert "--keep-backups N|all" in CliRunner().invoke(cli, [render[0], render[1], "--help"]).output
    assert len(list(tmp_path.glob("gres.conf.*.bak"))) == 4
    gres.write_text(gres.read_text() + "# edited\n")
    assert CliRunner().invoke(cli, [*render, "--keep-backups", "1"]).exit_code == 0
    [kept] = tmp_path.glob("gres.conf.*.bak")
    assert kept.read_text().endswith("# edited\n")
    for bad in ("0", "-1", "x", "9" * 5000, "１"):
        result = CliRunner().invoke(cli, [*render, "--keep-backups", bad])
        assert result.exit_code == 2 and "--keep-backups" in result.output, (bad, result.output)
        assert "Traceback" not in result.output


def test_a_crash_where_hard_links_fail_is_finished_by_the_next_render(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the filesystem refuses hard links the backups are copies: a backup made before a crash
    is the same text, not the same inode, and the next render must still finish the set."""
    no_link = textwrap.dedent(
        """
        import errno
        def _no_link(src, dst, *a, **kw):  # as link(2): an existing name first, then no links
            if os.path.lexists(dst):
                raise FileExistsError(errno.EEXIST, "exists", dst)
            raise OSError(errno.EPERM, "no links")
        os.link = _no_link
        """
    )
    script = _CRASH.format(repo=str(REPO), patched=PATCHED, new=NEW).replace(
        "calls = [0]", no_link + "calls = [0]"
    )
    namespace: dict[str, Any] = {"os": os}
    exec(no_link.replace("os.link = _no_link", ""), namespace)  # the same stand-in for the next render
    monkeypatch.setattr(os, "link", namespace["_no_link"])
    outcomes: list[str] = []
    for k in range(1, 200):
        directory = tmp_path / f"crash{k}"
        directory.mkdir()
        write_atomic(files(directory, OLD), backup=False)
        before = listing(directory)
        rc = subprocess.run([sys.executable, "-c", script, str(directory), str(k)], check=False).returncode
        assert rc in (0, 9)
        with write._locked(directory):
            recover(directory)
        outcomes.append(assert_old_or_new(directory, before))
        if rc == 0:
            break
    assert outcomes[0] == "old" and outcomes[-1] == "new" and "new" in outcomes[:-1]
