"""Atomic, reviewable config writes: unified diffs, temp file + fsync + rename, and a
timestamped backup of every file that changes. Either every file is replaced or none is."""

from __future__ import annotations

import difflib
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from slurm_hetero.errors import OutputError


def _current(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise OutputError(f"{path}: cannot read the existing file: {e.strerror}") from e


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


def _stage(path: Path, text: str) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp)


def write_atomic(files: Mapping[Path, str], backup: bool = True) -> list[Path]:
    """Write the files that change; returns them. Existing ones are kept as `NAME.<stamp>.bak`."""
    changed = {p: t for p, t in files.items() if _current(p) != t}
    staged: dict[Path, Path] = {}
    try:
        for path, text in changed.items():
            if not path.parent.is_dir():
                raise OutputError(f"{path.parent}: output directory does not exist")
            staged[path] = _stage(path, text)
    except OSError as e:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
        raise OutputError(
            f"cannot write to {e.filename or 'the output directory'}: {e.strerror}; nothing changed"
        ) from e
    except OutputError:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
        raise
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for path, tmp in staged.items():
        if backup:
            _backup(path, stamp)
        os.replace(tmp, path)
    _fsync_dir(next(iter(staged)).parent if staged else None)
    return list(staged)


def _backup(path: Path, stamp: str) -> None:
    target = path.with_name(f"{path.name}.{stamp}.bak")
    if path.exists() and not target.exists():
        shutil.copy2(path, target)


def _fsync_dir(directory: Path | None) -> None:
    if directory is None:
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
