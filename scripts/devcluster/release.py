"""The Slurm releases the dev cluster runs, and where each one's files, ports and tools are.

The host's own release (Debian 12: 22.05) runs from the host. Another release runs from a
Debian root (`troot`: Debian 13 carries 24.11) with chroot: its daemons and client tools are the
root's, its config, state, logs, PID files and munge socket are the root's own `/etc/slurm`,
`/var/lib/slurm`, ... and its ports differ, so a cluster of each release can run side by side.
`Release.path()` maps a path as the cluster sees it to the path on the host.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOST_RELEASE = "22.05"  # Debian 12's slurm-wlm, when no Slurm is installed yet
CACHE = Path("/var/cache/slurm-hetero")
STATE_FILE = Path("/run/slurm-hetero/dev-cluster.json")  # the release started last


@dataclass(frozen=True)
class Release:
    name: str  # "22.05"
    root: Path | None  # None: the host's Slurm; else the chroot that carries this release
    suite: str  # Debian suite whose slurm-wlm is this release
    ctld_port: int
    slurmd_port: int
    port_base: int  # first per-node slurmd port (one slurmd per inventory node)

    def path(self, inner: str | Path) -> Path:
        """The host path of `inner`, a path as the cluster's daemons and tools see it."""
        inner = Path(inner)
        return inner if self.root is None else self.root / inner.relative_to("/")

    @property
    def chrooted(self) -> bool:
        return self.root is not None


# Port ranges differ per release (22.05 keeps Slurm's defaults, as slurm-lab measured them).
_PORTS = {"22.05": (6817, 6818, 17001), "24.11": (6917, 6918, 17101)}
_SUITES = {"22.05": "bookworm", "24.11": "trixie"}
RELEASES = tuple(_PORTS)


def release_of(version_text: str) -> str | None:
    """`slurm-wlm 24.11.5` / `slurm 22.05.8` -> `24.11`."""
    m = re.search(r"\b(\d+)\.(\d+)\.\d+", version_text)
    return f"{m.group(1)}.{int(m.group(2)):02d}" if m else None


@functools.cache
def host_release() -> str:
    """The release of the host's Slurm tools, else Debian 12's."""
    for tool in ("slurmctld", "sinfo"):
        try:
            out = subprocess.run([tool, "-V"], capture_output=True, text=True, check=False, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        found = release_of(out.stdout)
        if found:
            return found
    return DEFAULT_HOST_RELEASE


def get(name: str | None = None) -> Release:
    """A release by name (default: the host's). Only the host's release and 24.11 are known."""
    host = host_release()
    name = name or host
    if name not in _PORTS:
        raise SystemExit(f"dev-cluster: unknown Slurm release {name}; known: {', '.join(RELEASES)}")
    root = None if name == host else CACHE / f"{_SUITES[name]}-root"
    return Release(name, root, _SUITES[name], *_PORTS[name])


def remember(release: Release) -> None:
    STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    STATE_FILE.write_text(json.dumps({"release": release.name}) + "\n")


def forget() -> None:
    STATE_FILE.unlink(missing_ok=True)


def current(name: str | None = None) -> Release:
    """`name`, else the release `dev-cluster up` started last, else the host's."""
    if name:
        return get(name)
    try:
        return get(json.loads(STATE_FILE.read_text())["release"])
    except (OSError, ValueError, KeyError):
        return get()
