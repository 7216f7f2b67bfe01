"""gres.conf read back into per-node device records, for tests that check what `gres render`
wrote (inventory -> gres.conf -> the same devices). Keys are case-insensitive as in Slurm;
`CPUs=` is the legacy spelling of `Cores=`; `AutoDetect=` lines and comments are skipped."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from slurm_hetero.core import hostlist


@dataclass(frozen=True)
class GresEntry:
    node: str | None
    name: str
    type: str | None
    file: str | None
    cores: str | None
    links: str | None


def parse_gres_conf(text: str) -> list[GresEntry]:
    """Every device line expanded to one entry per node and file, in file order."""
    entries = []
    for raw in text.splitlines():
        fields = {}
        for token in shlex.split(raw, comments=True):
            key, _, value = token.partition("=")
            fields["cores" if key.lower() == "cpus" else key.lower()] = value
        if not fields or set(fields) == {"autodetect"}:
            continue
        nodes = hostlist.expand(fields["nodename"]) if "nodename" in fields else [None]
        files = hostlist.expand(fields["file"]) if "file" in fields else [None]
        for node in nodes:
            for file in files:
                entries.append(
                    GresEntry(
                        node,
                        fields["name"],
                        fields.get("type"),
                        file,
                        fields.get("cores"),
                        fields.get("links"),
                    )
                )
    return entries
