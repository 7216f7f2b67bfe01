"""A render never drops nodes or devices silently: a truncated inventory that is still valid YAML
would make slurmctld forget nodes and their jobs. A file in another syntax than gres.conf (the
hook's Lua table) carries `declaration(nodes)`."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import chain
from pathlib import Path
from typing import TypeVar

from slurm_hetero.core import hostlist
from slurm_hetero.core.errors import OutputError
from slurm_hetero.core.model import SlurmNode
from slurm_hetero.slurm.gresconf import GresConfError, declared_devices, declared_nodes

ALLOW_FLAG = "--allow-removal"
SHOWN = 5  # dropped hosts or devices named in a message; the rest are counted
_T = TypeVar("_T")


def _read(texts: Iterable[tuple[Path, str | None]], reader: Callable[[str], _T]) -> Iterator[_T]:
    """`reader` of each present file's text."""
    for path, text in texts:
        if text is not None:
            try:
                yield reader(text)
            except GresConfError as e:
                raise OutputError(
                    f"{path}: cannot tell which nodes it names ({e}), so cannot tell whether this render "
                    f"drops any; check the file, or pass {ALLOW_FLAG} to replace it; nothing changed"
                ) from None


def _declared(texts: Iterable[tuple[Path, str | None]]) -> set[str]:
    return set().union(*_read(texts, declared_nodes))


def _devices(texts: Iterable[tuple[Path, str | None]]) -> dict[str, list[tuple[str, ...]]]:
    devices: dict[str, list[tuple[str, ...]]] = {}
    for declared in _read(texts, declared_devices):
        for host, files in declared.items():
            devices.setdefault(host, []).extend(files)
    return devices


def declaration(nodes: Iterable[SlurmNode]) -> list[str]:
    """The hosts and device files of `nodes` as gres.conf lines."""
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for node in nodes:
        if node.devices:
            key = tuple((d.device.type, d.device.file) for d in node.devices)
            groups.setdefault(key, []).append(node.name)
    lines: list[str] = []
    for devices, names in groups.items():
        hosts = hostlist.fold(names)
        files: dict[str, list[str]] = {}
        for gres_type, file in devices:
            files.setdefault(gres_type, []).append(file)
        lines.extend(
            f"NodeName={hosts} Name=gpu Type={gres_type} File={hostlist.fold(paths)}"
            for gres_type, paths in files.items()
        )
    return lines


def _natural(name: str) -> list[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def dropped_devices(current: Mapping[Path, str | None], new: Mapping[Path, str]) -> list[str]:
    """`host:/dev/x` on disk of a host the new set keeps without it."""
    kept = _devices(new.items())
    lost: list[str] = []
    for host, files in _devices(current.items()).items():
        if host in kept and files != kept[host]:
            # sets: a host's per-device shard lines name its gpu lines' files again
            gone = set(chain.from_iterable(files)) - set(chain.from_iterable(kept[host]))
            lost.extend(f"{host}:{file}" for file in gone)
    return sorted(lost, key=_natural)


def _count(items: Sequence[str], noun: str) -> str:
    names = ", ".join(items[:SHOWN]) + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")
    return f"{len(items)} {noun}{'s' if len(items) != 1 else ''} ({names})"


def removed(current: Mapping[Path, str | None], new: Mapping[Path, str]) -> str:
    """What the new set drops from the files on disk (None: absent), in words; '' when nothing."""
    nodes = sorted(_declared(current.items()) - _declared(new.items()), key=_natural)
    devices = dropped_devices(current, new)
    parts = ([_count(nodes, "node")] if nodes else []) + ([_count(devices, "device")] if devices else [])
    return " and ".join(parts)


def guard(new: Mapping[Path, str], where: Path) -> Callable[[Mapping[Path, str | None]], None]:
    """`write_atomic`'s guard refusing a set that drops nodes or devices."""

    def check(current: Mapping[Path, str | None]) -> None:
        if what := removed(current, new):
            raise OutputError(
                f"{where}: this render would remove {what} that the files there name; "
                f"the inventory lacks them (cut short?). Pass {ALLOW_FLAG} if the removal is meant; "
                "nothing changed"
            )

    return check
