"""Bounded reads of input files (inventories, captured tool output, configs).

Anything but a regular file (or /dev/null, read as empty) is refused without blocking: O_NONBLOCK
(a FIFO with no writer would wait forever), then fstat on the open descriptor (no race with a rename).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from slurm_hetero.core.errors import HeteroError

MiB = 1 << 20
MAX_INVENTORY_BYTES = 512 * MiB
MAX_CAPTURE_BYTES = 64 * MiB  # one vendor tool's output
MAX_CONFIG_BYTES = 4 * MiB
MAX_MEASURED_BYTES = 256 << 10  # `calibrate`'s YAML: a few lines per device type

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFSOCK: "a socket",
}


def _size(limit: int) -> str:
    return f"{limit // MiB} MiB" if limit % MiB == 0 else f"{limit >> 10} KiB"


def read_bytes(path: str | Path, limit: int, what: str, error: type[HeteroError] = HeteroError) -> bytes:
    """The bytes of the regular file `path` (at most `limit`), else `error`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except OSError as e:
        raise error(f"{path}: cannot read {what}: {e.strerror or e}") from e
    try:
        info = os.fstat(fd)
        if stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(1, 3):
            return b""  # /dev/null: the usual "empty file"
        if not stat.S_ISREG(info.st_mode):
            kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
            raise error(f"{path}: {what} is {kind}; give a regular file")
        if info.st_size > limit:
            raise error(f"{path}: {what} is {info.st_size} bytes, more than the {_size(limit)} allowed")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 * MiB, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise error(f"{path}: {what} is more than the {_size(limit)} allowed")
        return b"".join(chunks)
    except OSError as e:
        raise error(f"{path}: cannot read {what}: {e.strerror or e}") from e
    finally:
        os.close(fd)


def read_text(
    path: str | Path,
    limit: int,
    what: str,
    error: type[HeteroError] = HeteroError,
    errors: str = "strict",
) -> str:
    """`read_bytes` decoded as UTF-8."""
    data = read_bytes(path, limit, what, error)
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise error(f"{path}: {what} is not UTF-8 text (byte {e.start})") from None


def unusable_path(path: Path) -> str | None:
    """Why `path` (to be written) can never be (ENAMETOOLONG, ENOTDIR, ELOOP), or None."""
    for probe in (path, path.parent):
        try:
            os.stat(probe)
        except FileNotFoundError:
            continue
        except OSError as e:
            return e.strerror or str(e)
    return None
