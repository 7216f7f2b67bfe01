"""Parse gres.conf (ours or a site's) back into per-node device records. Pure.

Used to check renders (inventory -> gres.conf -> the same devices) and to read a site's
hand-written file. Keys are case-insensitive as in Slurm (`Nodename=`); `CPUs=` is the legacy
spelling of `Cores=`; `AutoDetect=` lines and comments are kept aside.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from slurm_hetero import hostlist
from slurm_hetero.errors import HeteroError, InventoryError

_KEYS = {
    "nodename",
    "name",
    "type",
    "file",
    "cores",
    "cpus",
    "links",
    "count",
    "flags",
    "autodetect",
    "multiplefiles",
    "envvars",
}


@dataclass(frozen=True)
class GresEntry:
    """One device (or one count-only resource) as gres.conf declares it for one node."""

    node: str | None
    name: str
    type: str | None
    file: str | None
    cores: str | None
    links: str | None
    count: str | None
    flags: str | None


class GresConfError(HeteroError):
    """gres.conf text that Slurm would refuse."""


def _fields(line: str, line_no: int) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError as e:
        raise GresConfError(f"gres.conf line {line_no}: {e}") from e
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep or key.lower() not in _KEYS:
            raise GresConfError(f"gres.conf line {line_no}: unexpected {token!r}")
        out["cores" if key.lower() == "cpus" else key.lower()] = value
    return out


def _expand(spec: str | None, line_no: int) -> list[str | None]:
    if spec is None:
        return [None]
    try:
        return list(hostlist.expand(spec))
    except InventoryError as e:
        raise GresConfError(f"gres.conf line {line_no}: {e}") from e


def parse_gres_conf(text: str) -> list[GresEntry]:
    """Every device line expanded to one entry per node and file, in file order."""
    entries: list[GresEntry] = []
    for line_no, raw in enumerate(text.splitlines(), 1):
        fields = _fields(raw, line_no)
        if not fields or "autodetect" in fields and len(fields) == 1:
            continue
        if "name" not in fields:
            raise GresConfError(f"gres.conf line {line_no}: missing Name=")
        for node in _expand(fields.get("nodename"), line_no):
            for file in _expand(fields.get("file"), line_no):
                entries.append(
                    GresEntry(
                        node,
                        fields["name"],
                        fields.get("type"),
                        file,
                        fields.get("cores"),
                        fields.get("links"),
                        fields.get("count"),
                        fields.get("flags"),
                    )
                )
    return entries
