"""The one writer of generated files: reviewable diffs, and sets of files (gres.conf +
slurm-nodes.conf; job_submit.lua + its table) that change together or not at all.

Slurm opens plain paths, so a set cannot be swapped in one rename. The commit protocol, in one
directory and under its lock file (`.slurm-hetero.lock`, flock; concurrent renders wait):

1. recover: finish or undo an interrupted set (below), remove stray temporaries;
2. if any file differs, stage *every* file as `.NAME.slurm-hetero-new`, fsynced (slurmctld
   reloads job_submit.lua only when its mtime grows, so mtimes are made to grow by >= 1 s);
3. write the journal `.slurm-hetero.journal` (the commit point): each file, the digests of its
   old and new text, and its backup;
4. hard-link each existing file to its backup `NAME.<stamp>[-N].bak` (complete or absent);
5. rename each temporary over its file, in the order given (the file a reader keys on last),
   then remove the journal;
6. with `keep_backups`, remove the oldest backups beyond that many (never an admin's copies).

An error before step 5 removes what this run created (`... nothing changed`). After a crash the
next run under the lock rolls a journalled set forward, or when impossible back from the backups.

Single files use a unique temporary + fsync + (backup) + rename, without lock or journal; a
symbolic link is written through (its target replaced), as an editor saves a linked file.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_hetero.core.errors import OutputError

logger = logging.getLogger(__name__)

LOCK_NAME = ".slurm-hetero.lock"
JOURNAL_NAME = ".slurm-hetero.journal"
STAGED_SUFFIX = ".slurm-hetero-new"  # `.NAME.slurm-hetero-new`: a staged member of a set
OLD_SUFFIX = ".slurm-hetero-old"  # `.NAME.slurm-hetero-old`: the old file while a set commits
_LEFTOVER_SUFFIXES = (STAGED_SUFFIX, OLD_SUFFIX, JOURNAL_NAME)
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


def write_bytes_atomic(path: Path, data: bytes, backup: bool = False, mode: int | None = None) -> None:
    """One file of any content (a plot) through the single-file path of `write_atomic`; a failed
    write leaves the old file, never a partial one. It keeps the old file's mode unless `mode`."""
    if path.is_symlink():
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
        _fsync_dir(path.parent)
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


# ------------------------------------------------------------------------------ the journal


@dataclass(frozen=True)
class Entry:
    """One file of a set in the journal."""

    name: str
    new: str  # sha256 of the new text
    old: str | None  # sha256 of the text it replaces (None: the file did not exist)
    backup: str | None  # backup name (None: no backup kept)

    @property
    def staged(self) -> str:
        return f".{self.name}{STAGED_SUFFIX}"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_digest(path: Path) -> str | None:
    try:
        return _digest(path.read_bytes())
    except FileNotFoundError:
        return None


def _write_journal(directory: Path, entries: Sequence[Entry]) -> None:
    data = json.dumps({"version": 1, "files": [asdict(e) for e in entries]}, indent=1).encode()
    tmp = directory / f"{JOURNAL_NAME}{STAGED_SUFFIX}"
    write_synced(tmp, data, 0o600)
    os.replace(tmp, directory / JOURNAL_NAME)
    _fsync_dir(directory)


def _read_journal(directory: Path) -> list[Entry] | None:
    try:
        raw = json.loads((directory / JOURNAL_NAME).read_bytes())
        return [Entry(**e) for e in raw["files"]]
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError) as e:
        raise OutputError(
            f"{directory / JOURNAL_NAME}: damaged journal of an interrupted render ({e}); check the "
            "files it names against their .bak copies, then remove it"
        ) from e


# ------------------------------------------------------------------------------ one commit


def _entry(directory: Path, name: str, data: bytes, stamp: str | None) -> Entry:
    """A journal entry. Without a kept backup the old file gets a hidden one for the time of the
    commit, so a failed set can always be rolled back."""
    old = _file_digest(directory / name)
    if old is None:
        return Entry(name, _digest(data), None, None)
    return Entry(name, _digest(data), old, f"{name}.{stamp}.bak" if stamp else f".{name}{OLD_SUFFIX}")


def _commit(directory: Path, files: Sequence[tuple[str, str]], backup: bool) -> list[Path]:
    entries: list[Entry] = []
    names = [name for name, _ in files]
    stamp = _backup_stamp(directory, names) if backup else None
    committed, doing = False, names[0]
    try:
        for name, text in files:
            doing, data = name, text.encode("utf-8")
            entry = _entry(directory, name, data, stamp)
            write_synced(
                directory / entry.staged, data, _mode(directory / name), _next_mtime_ns(directory / name)
            )
            entries.append(entry)
        doing = JOURNAL_NAME
        _write_journal(directory, entries)
        committed = True
        for entry in entries:
            doing = entry.backup or entry.name
            if entry.backup:
                _link_backup(directory / entry.name, directory / entry.backup)
        for entry in entries:
            doing = entry.name
            os.replace(directory / entry.staged, directory / entry.name)
        _fsync_dir(directory)
    except OSError as e:
        state = _undo(directory, names, entries if committed else None)
        raise OutputError(f"cannot write {directory / doing}: {e.strerror or e}; {state}") from e
    except BaseException:
        if not committed:  # KeyboardInterrupt before the commit point: leave nothing behind
            _undo(directory, names, None)
        raise
    _finish(directory, entries)
    return [directory / name for name in names]


def _finish(directory: Path, entries: Sequence[Entry]) -> None:
    """The set is in place: drop hidden backups, then the journal (else the next render does)."""
    try:
        for entry in entries:
            if entry.backup and entry.backup.startswith("."):
                _quiet_unlink(directory / entry.backup)
        _remove_journal(directory)
    except OSError as e:
        logger.warning("%s: written; the next render removes its journal (%s)", directory, e)


def _undo(directory: Path, names: Sequence[str], entries: Sequence[Entry] | None) -> str:
    """After an error: roll a committed set back, or drop an uncommitted one; says what state the
    set is in, for the error message."""
    try:
        if entries is not None:
            _roll_back(directory, entries)
            _remove_journal(directory)
        for name in names:
            _quiet_unlink(directory / f".{name}{STAGED_SUFFIX}")
        _quiet_unlink(directory / f"{JOURNAL_NAME}{STAGED_SUFFIX}")
    except (OSError, OutputError) as e:  # the journal stays: the next render finishes the job
        left = sorted(p.name for p in directory.glob(".*") if p.name.endswith(_LEFTOVER_SUFFIXES))
        why = f"could not clean up ({getattr(e, 'strerror', None) or e})"
        if entries is None or all(_file_digest(directory / x.name) == x.old for x in entries):
            return (
                f"the files Slurm reads are unchanged; {why}: the next render in that directory "
                f"removes {', '.join(left) or 'what is left'}"
            )
        return f"the set is incomplete and {why}; the next render in that directory finishes it"
    return "nothing changed"


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
                os.unlink(directory / entry)
            except FileNotFoundError:
                pass
            except OSError as e:
                logger.warning("%s: old backup kept (%s)", directory / entry, e.strerror or e)


def _link_backup(path: Path, target: Path) -> None:
    """`target` becomes another name of `path`'s inode (exclusive: never replaces a file)."""
    try:
        os.link(path, target)
    except FileExistsError:
        if _file_digest(target) != _file_digest(path):
            raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        tmp = target.with_name(f".{target.name}{STAGED_SUFFIX}")  # no hard links here: copy
        write_synced(tmp, path.read_bytes(), _mode(path))
        os.rename(tmp, target)  # under the lock, and the name was free when the stamp was chosen


# ------------------------------------------------------------------------------ recovery


def recover(directory: Path) -> None:
    """Finish (or, when impossible, undo) a set write a crash interrupted; remove stray temporaries.
    Call with the directory's lock held."""
    entries = _read_journal(directory)
    if entries is not None:
        if all(
            e.new in (_file_digest(directory / e.name), _file_digest(directory / e.staged)) for e in entries
        ):
            _roll_forward(directory, entries)
            _finish(directory, entries)
            logger.warning("finished an interrupted render of %s", ", ".join(e.name for e in entries))
        else:
            _roll_back(directory, entries)
            logger.warning("undid an interrupted render of %s", ", ".join(e.name for e in entries))
        _remove_journal(directory)
    for suffix in (STAGED_SUFFIX, OLD_SUFFIX):
        for stray in directory.glob(f".*{suffix}"):
            _quiet_unlink(stray)


def _roll_forward(directory: Path, entries: Sequence[Entry]) -> None:
    for entry in entries:
        target = directory / entry.name
        if _file_digest(target) == entry.new:
            continue
        if entry.backup and not (directory / entry.backup).exists() and _file_digest(target) == entry.old:
            _link_backup(target, directory / entry.backup)
        os.replace(directory / entry.staged, target)
    _fsync_dir(directory)


def _roll_back(directory: Path, entries: Sequence[Entry]) -> None:
    """Put each file back as it was (from its backup); drop this set's backups and temporaries."""
    for entry in entries:
        target, staged = directory / entry.name, directory / entry.staged
        current = _file_digest(target)
        if current != entry.old:
            if entry.old is None:
                _quiet_unlink(target)
            elif entry.backup and _file_digest(directory / entry.backup) == entry.old:
                _quiet_unlink(staged)
                os.link(directory / entry.backup, staged)
                os.replace(staged, target)
            else:
                raise OutputError(
                    f"{target}: cannot undo an interrupted render (no copy of the old file); "
                    f"check it and remove {directory / JOURNAL_NAME}"
                )
        if entry.backup and (directory / entry.backup).exists():
            _quiet_unlink(directory / entry.backup)
        _quiet_unlink(staged)
    _fsync_dir(directory)


def _remove_journal(directory: Path) -> None:
    _quiet_unlink(directory / JOURNAL_NAME)
    _fsync_dir(directory)


# ------------------------------------------------------------------------------ helpers


def _quiet_unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
