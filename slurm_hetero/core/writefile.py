"""The one writer of generated files: reviewable diffs, and sets of files (gres.conf +
slurm-nodes.conf; job_submit.lua + its table) that change together or not at all.

Slurm opens plain paths, so a set cannot be swapped in one rename: under a lock every file is
staged, then a journal (the commit point) names them, then each is renamed into place in the
order given (the file a reader keys on last); the next render finishes a set a crash interrupted.
docs/admin-guide.md describes the protocol, the backups and the errors. Single files use a unique
temporary + fsync + (backup) + rename, without lock or journal.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import fcntl
import filecmp
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from slurm_hetero.core.errors import OutputError

logger = logging.getLogger(__name__)

LOCK_NAME = ".slurm-hetero.lock"
JOURNAL_NAME = ".slurm-hetero.journal"
STAGED_SUFFIX = ".slurm-hetero-new"  # `.NAME.slurm-hetero-new`: a staged member of a set
OLD_SUFFIX = ".slurm-hetero-old"  # `.NAME.slurm-hetero-old`: the old file while a set commits
SINGLE_SUFFIX = ".slurm-hetero-tmp"  # unique temporaries of single-file writes
LOCK_TIMEOUT_S = 120.0
READABLE = 0o444  # every file written is read by other users (see `_mode`)


def _current(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise OutputError(f"{path}: cannot read the existing file: {getattr(e, 'strerror', e)}") from e


def ensure_output_dir(directory: Path) -> Path:
    """Create `directory` if needed; OutputError (nothing changed) when it can't be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{directory}: cannot create output directory: {e.strerror}") from e
    if not os.access(directory, os.W_OK):
        raise OutputError(f"{directory}: output directory is not writable; nothing changed")
    return directory


def diff(files: Mapping[Path, str]) -> str:
    """Unified diff between the files on disk and their new contents ('' when nothing changes)."""
    chunks: list[str] = []
    for path, new in files.items():
        old = _current(path)
        if old == new:
            continue
        chunks.extend(
            difflib.unified_diff(
                (old or "").splitlines(keepends=True),
                new.splitlines(keepends=True),
                fromfile=str(path) if old is not None else "/dev/null",
                tofile=str(path),
            )
        )
    return "".join(chunks)


def read_current(paths: Iterable[Path]) -> dict[Path, str | None]:
    """The text of each file on disk (None where it does not exist)."""
    return {path: _current(path) for path in paths}


def pending(directory: Path) -> bool:
    """Whether an interrupted set write waits in `directory` for the next render to finish it."""
    return (directory / JOURNAL_NAME).exists()


def write_atomic(
    files: Mapping[Path, str],
    backup: bool = True,
    guard: Callable[[Mapping[Path, str | None]], None] | None = None,
    keep_backups: int | None = None,
) -> list[Path]:
    """Write `files` (all in one directory) as one set; returns the files written ([] when none
    differs). `guard` gets the files on disk (None: absent) under the lock, so no other render
    changes them between its check and this write; it refuses by raising OutputError.
    `keep_backups` (>= 1; None: all): how many backups of each file a write leaves."""
    if not files:
        return []
    if keep_backups is not None and keep_backups < 1:
        raise ValueError(f"keep_backups is at least 1 (None keeps every backup), not {keep_backups}")
    directories = {p.parent for p in files}
    if len(directories) != 1:
        raise ValueError(f"one set of files lives in one directory, not {sorted(map(str, directories))}")
    directory = directories.pop()
    if not directory.is_dir():
        raise OutputError(f"{directory}: output directory does not exist; nothing changed")
    single = len(files) == 1  # no lock or journal: a unique temporary, fsync, a backup link, rename
    with contextlib.nullcontext() if single else _locked(directory):
        if not single:
            recover(directory)
        current = read_current(files)
        if all(current[p] == t for p, t in files.items()):
            _make_readable(files)
            return []
        if guard is not None:
            guard(current)
        if single:
            [(path, text)] = files.items()
            write_bytes_atomic(path, text.encode("utf-8"), backup)
            written = [path]
        else:
            written = _commit(directory, [(p.name, t) for p, t in files.items()], backup)
        if keep_backups is not None:
            prune_backups(directory, [p.name for p in files], keep_backups)
        return written


# ------------------------------------------------------------------------------ single files


def write_bytes_atomic(
    path: Path, data: bytes, backup: bool = False, mode: int | None = None, replace_link: bool = False
) -> None:
    """One file of any content (a plot) through the single-file path of `write_atomic`; a failed
    write leaves the old file, never a partial one. It keeps the old file's mode unless `mode`; a
    symbolic link is written through (as an editor saves a linked file) unless `replace_link`."""
    if path.is_symlink() and not replace_link:
        path = Path(os.path.realpath(path))
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=SINGLE_SUFFIX, dir=path.parent)
        os.close(fd)
        write_synced(Path(tmp), data, _mode(path) if mode is None else mode)
        if backup and path.exists():
            _link_backup(path, path.with_name(f"{path.name}.{_backup_stamp(path.parent, [path.name])}.bak"))
        os.replace(tmp, path)
        tmp = None
        fsync_dir(path.parent)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}; nothing changed") from e
    finally:
        if tmp is not None:
            _quiet_unlink(Path(tmp))


# ------------------------------------------------------------------------------ the lock


@contextlib.contextmanager
def _locked(directory: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """flock on `directory/.slurm-hetero.lock` (kept, never removed: removing lock files races)."""
    path = directory / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise OutputError(f"{directory}: cannot lock for writing: {e.strerror}; nothing changed") from e
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OutputError(
                        f"{path}: another render has held this lock for {timeout:.0f}s; nothing changed"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------ one commit


def _staged(name: str) -> str:
    return f".{name}{STAGED_SUFFIX}"


def _old(name: str) -> str:
    return f".{name}{OLD_SUFFIX}"


def _commit(directory: Path, files: Sequence[tuple[str, str]], backup: bool) -> list[Path]:
    names = [name for name, _ in files]
    stamp = _backup_stamp(directory, names) if backup else None
    journal: list[tuple[str, str | None]] = []
    committed, doing = False, names[0]
    try:
        for name, text in files:
            doing, target = name, directory / name
            mtime = _next_mtime_ns(target)
            write_synced(directory / _staged(name), text.encode("utf-8"), _mode(target), mtime)
            kept = stamp is not None and target.exists()
            if kept:
                _link_backup(target, directory / _old(name))
            journal.append((name, f"{name}.{stamp}.bak" if kept else None))
        doing = JOURNAL_NAME
        data = json.dumps({"version": 2, "files": journal}).encode()
        write_synced(directory / _staged(JOURNAL_NAME), data, 0o600)
        os.replace(directory / _staged(JOURNAL_NAME), directory / JOURNAL_NAME)
        committed, doing = True, ""
        _roll_forward(directory, journal)
    except BaseException as e:
        if committed:  # the journal stays: the next render finishes the set
            state = "the set is incomplete: the next render there finishes it"
        else:
            left = _discard(directory, [*map(_staged, names), *map(_old, names), _staged(JOURNAL_NAME)])
            state = "nothing changed" + (f"; the next render there removes {', '.join(left)}" if left else "")
        if not isinstance(e, OSError):
            raise
        raise OutputError(f"cannot write {directory / doing}: {e.strerror or e}; {state}") from e
    _finish(directory)
    return [directory / name for name in names]


def _roll_forward(directory: Path, journal: Sequence[tuple[str, str | None]]) -> None:
    """Per file, its hidden old link becomes its backup, then its staged text replaces it; a step
    already done is skipped, so running this again finishes a set a crash interrupted."""
    for name, backup in journal:
        if backup and os.path.lexists(directory / _old(name)):
            _link_backup(directory / _old(name), directory / backup)  # never over another file
            os.unlink(directory / _old(name))
        if os.path.lexists(directory / _staged(name)):
            os.replace(directory / _staged(name), directory / name)
    fsync_dir(directory)


def _finish(directory: Path) -> None:
    """The set is in place: remove the journal (else the next render does)."""
    try:
        _quiet_unlink(directory / JOURNAL_NAME)
        fsync_dir(directory)
    except OSError as e:
        logger.warning("%s: written; the next render removes its journal (%s)", directory, e)


def _discard(directory: Path, names: Iterable[str]) -> list[str]:
    """Remove what an uncommitted set staged; returns the names that could not be removed."""
    left = []
    for name in names:
        try:
            _quiet_unlink(directory / name)
        except OSError:
            left.append(name)
    return left


def _read_journal(directory: Path) -> list[tuple[str, str | None]] | None:
    try:
        raw = json.loads((directory / JOURNAL_NAME).read_bytes())
        return [(str(name), backup and str(backup)) for name, backup in raw["files"]]
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError) as e:
        raise OutputError(
            f"{directory / JOURNAL_NAME}: damaged journal of an interrupted render ({e}); check the "
            "files it names against their .bak copies, then remove it"
        ) from e


def write_synced(path: Path, data: bytes, mode: int, mtime_ns: int | None = None) -> None:
    """`data` in `path` (never through a link), with `mode`, fsynced before it returns."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
        if mtime_ns is not None:
            os.utime(fd, ns=(mtime_ns, mtime_ns))
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_readable(paths: Iterable[Path]) -> None:
    """Files left as they are (same text) still get the mode their readers need (`_mode`)."""
    for path in paths:
        try:
            mode = path.stat().st_mode & 0o777
            if mode & READABLE != READABLE:
                os.chmod(path, mode | READABLE)
        except OSError as e:
            raise OutputError(f"{path}: cannot make it readable by its readers ({e.strerror})") from None


def _mode(path: Path) -> int:
    """The old file's mode, readable by everyone (slurmd, SlurmUser and the job's user read what
    this writes), else 0644."""
    try:
        return path.stat().st_mode & 0o777 | READABLE
    except FileNotFoundError:
        return 0o644


def _next_mtime_ns(path: Path) -> int | None:
    """An mtime whole seconds past the file's current one, when now is not (slurmctld compares
    job_submit.lua's st_mtime in seconds with the one it loaded)."""
    try:
        old = path.stat().st_mtime_ns
    except FileNotFoundError:
        return None
    now = time.time_ns()
    floor = (old // 1_000_000_000 + 1) * 1_000_000_000
    return None if now >= floor else floor


def _backup_stamp(directory: Path, names: Sequence[str]) -> str:
    """`YYYYmmddTHHMMSS`, with `-N` added until no file of the set has a backup of that name."""
    base = time.strftime("%Y%m%dT%H%M%S")
    for n in range(1, 10_000):
        stamp = base if n == 1 else f"{base}-{n}"
        if not any(os.path.lexists(directory / f"{name}.{stamp}.bak") for name in names):
            return stamp
    raise OutputError(f"{directory}: 10,000 backups in one second; nothing changed")


def prune_backups(directory: Path, names: Iterable[str], keep: int) -> None:
    """Remove all but the newest `keep` backups (`NAME.<stamp>[-N].bak`) of each of `names`; one
    that cannot be removed stays, with a warning (the write already succeeded)."""
    try:
        present = os.listdir(directory)
    except OSError as e:
        logger.warning("%s: backups not pruned (%s)", directory, e.strerror or e)
        return
    for name in names:
        pattern = re.compile(re.escape(name) + r"\.(\d{8}T\d{6})(?:-(\d{1,4}))?\.bak")
        found = [(m, entry) for entry in present if (m := pattern.fullmatch(entry))]
        found.sort(key=lambda pair: (pair[0][1], int(pair[0][2] or 1)))  # by stamp, then -N
        for _, entry in found[: max(len(found) - keep, 0)]:
            try:
                _quiet_unlink(directory / entry)
            except OSError as e:
                logger.warning("%s: old backup kept (%s)", directory / entry, e.strerror or e)


def _link_backup(path: Path, target: Path) -> None:
    """`target` becomes another name of `path`'s inode (exclusive: never replaces a file)."""
    try:
        os.link(path, target)
    except FileExistsError:  # a backup this write made before (a copy where links fail) is kept
        if not (os.path.samefile(target, path) or filecmp.cmp(target, path, shallow=False)):
            raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        tmp = target.with_name(f".{target.name}{STAGED_SUFFIX}")  # no hard links here: copy
        write_synced(tmp, path.read_bytes(), _mode(path))
        os.rename(tmp, target)  # under the lock, and the name was free when the stamp was chosen


# ------------------------------------------------------------------------------ recovery


def recover(directory: Path) -> None:
    """Finish a set write a crash interrupted after its commit point; remove stray temporaries.
    Call with the directory's lock held."""
    if (journal := _read_journal(directory)) is not None:
        _roll_forward(directory, journal)
        _finish(directory)
        logger.warning("finished an interrupted render of %s", ", ".join(name for name, _ in journal))
    for suffix in (STAGED_SUFFIX, OLD_SUFFIX):
        for stray in directory.glob(f".*{suffix}"):
            _quiet_unlink(stray)


# ------------------------------------------------------------------------------ helpers


def _quiet_unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
