"""Node install: a venv that Slurm's hooks run, the scripts that point at it, and the inventory.

Compute nodes may run Python 3.9 (RHEL/Rocky 9) and refuse system-wide pip (PEP 668, Debian 12),
so node-side commands run from a venv of their own. The layout (every directory configurable):

  PREFIX/venvs/<stamp>/            one venv per install or upgrade; install.json names the current
  PREFIX/venv                      a link to the current one, for people and scripts (not the hooks)
  PREFIX/install.json              what install wrote: uninstall removes exactly that
  ETC/slurm-hetero-taskprolog      slurm.conf TaskProlog=
  ETC/slurm-hetero-health          slurm.conf HealthCheckProgram=
  BIN/slurm-hetero                 the command, for users and admins
  SITE/inventory.yaml              --inventory, always mode 0644 (the TaskProlog runs as the job's user)

Upgrades never change a venv a process runs from: the new venv is built beside the current one
(from a hard-linked copy of it when the interpreter is the same, so only the new package is
fetched), checked to start, and only then do the scripts name it (each replaced by a rename).
A task that read the old script runs the old venv to its end; old venvs are removed once no
process runs from them, keeping the previous one. Uninstall refuses while any slurm.conf line
names a script or venv it would remove, and names the line (no dangling TaskProlog).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_hetero import __version__, proc
from slurm_hetero.errors import HeteroError, ToolError
from slurm_hetero.writefile import write_bytes_atomic

MARK = "# written by `slurm-hetero install`"
PIP_TIMEOUT_S = 1800.0
PIP = ("-m", "pip", "install", "-q", "--disable-pip-version-check")


@dataclass(frozen=True)
class Layout:
    """Where an install lives and what it writes."""

    prefix: Path = Path("/opt/slurm-hetero")
    etc: Path = Path("/etc/slurm")
    bin_dir: Path = Path("/usr/local/bin")
    site: Path = Path("/etc/slurm-hetero")

    @property
    def manifest(self) -> Path:
        return self.prefix / "install.json"

    @property
    def venvs(self) -> Path:
        return self.prefix / "venvs"

    @property
    def current(self) -> Path:
        return self.prefix / "venv"

    @property
    def inventory(self) -> Path:
        return self.site / "inventory.yaml"

    def scripts(self) -> dict[str, Path]:
        """Script kind -> path."""
        return {
            "taskprolog": self.etc / "slurm-hetero-taskprolog",
            "health": self.etc / "slurm-hetero-health",
            "command": self.bin_dir / "slurm-hetero",
        }


def script_text(kind: str, python: Path, layout: Layout, config: str | None) -> str:
    """The shell script of `kind`. -I: the job's PYTHONPATH, PYTHONHOME, user site-packages and
    working directory must not change which code runs (nor fail its start, so the task)."""
    config_arg = f" --config {config}" if config else ""
    run = f"exec {python} -I -m slurm_hetero"
    body = {
        "taskprolog": f"{run} task-prolog --inventory {layout.inventory}{config_arg}",
        "health": f"{run} health --inventory {layout.inventory}",
        "command": f'{run} "$@"',
    }[kind]
    return f"#!/bin/sh\n{MARK}; run it, do not edit it (an upgrade rewrites it)\n{body}\n"


def default_source() -> Path | None:
    """The checkout this package runs from, when it runs from one."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "job_submit").is_dir() else None


def read_manifest(layout: Layout) -> dict | None:
    try:
        return json.loads(layout.manifest.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise HeteroError(f"cannot read {layout.manifest}: {e}; fix or remove it") from e


@contextlib.contextmanager
def _locked(layout: Layout) -> Iterator[None]:
    """One install, upgrade or uninstall at a time in PREFIX (another is refused, not queued)."""
    layout.prefix.mkdir(parents=True, exist_ok=True)
    with open(layout.prefix / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HeteroError(f"another install runs in {layout.prefix}; wait for it to end") from None
        yield


def install(
    layout: Layout,
    python: Path,
    source: Path,
    inventory_file: Path | None = None,
    config: str | None = None,
    pip_options: Sequence[str] = (),
    upgrade: bool = False,
) -> dict:
    """Install (or, with `upgrade`, replace) the venv and scripts; returns the new manifest."""
    with _locked(layout):
        return _install(layout, python, source, inventory_file, config, pip_options, upgrade)


def _install(
    layout: Layout,
    python: Path,
    source: Path,
    inventory_file: Path | None,
    config: str | None,
    pip_options: Sequence[str],
    upgrade: bool,
) -> dict:
    old = read_manifest(layout)
    if old and not upgrade:
        raise HeteroError(f"already installed in {layout.prefix} ({old['version']}); pass --upgrade")
    if upgrade and not old:
        raise HeteroError(f"nothing installed in {layout.prefix} to upgrade; run install without --upgrade")
    _check_python(python)
    if layout.current.exists() and not layout.current.is_symlink():
        raise HeteroError(
            f"{layout.current} is a directory install did not make; move it away or pass --prefix"
        )
    if not source.exists():
        raise HeteroError(f"--source {source} does not exist; give a checkout or a wheel")
    inventory_text = _read_inventory(inventory_file) if inventory_file else None
    saved = os.umask(0o022)  # every job user reads the venv and the scripts
    try:
        venv = _new_venv_dir(layout)
        base = Path(old["venv"]) if old and old.get("python") == str(python) else None
        version = _build(venv, python, source, pip_options, base)
        if inventory_text is not None:
            layout.inventory.parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(layout.inventory, inventory_text, mode=0o644)
        scripts = layout.scripts()
        for kind, path in scripts.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(
                path, script_text(kind, venv / "bin" / "python", layout, config).encode(), mode=0o755
            )
        manifest = {
            "version": version,
            "python": str(python),
            "source": str(source),
            "venv": str(venv),
            "scripts": {kind: str(path) for kind, path in scripts.items()},
            "inventory": str(layout.inventory)
            if inventory_text is not None
            else (old or {}).get("inventory"),
            "config": config,
            "installed_by": __version__,
        }
        write_bytes_atomic(layout.manifest, (json.dumps(manifest, indent=2) + "\n").encode(), mode=0o644)
        _link(layout.current, venv.relative_to(layout.prefix))
        manifest["removed_venvs"] = [str(p) for p in prune(layout, keep=[venv, *([base] if base else [])])]
        return manifest
    finally:
        os.umask(saved)


def _link(link: Path, target: Path) -> None:
    """Point `link` at `target`, replacing the old link in one rename."""
    temp = link.with_name(f".{link.name}.new")
    temp.unlink(missing_ok=True)
    temp.symlink_to(target)
    os.replace(temp, link)


def _check_python(python: Path) -> None:
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise HeteroError(f"--python {python} is not an executable file")
    closed = unreachable(python)
    if closed is not None:
        raise HeteroError(
            f"--python {python}: {closed} is not open to other users "
            f"({stat.filemode(closed.stat().st_mode)}), and the TaskProlog runs as the job's user; "
            "pass a system Python such as /usr/bin/python3"
        )


def unreachable(path: Path) -> Path | None:
    """The first directory on the way to `path` (or the file itself) that other users cannot
    pass or read; None when every user can run it."""
    real = Path(os.path.realpath(path))
    for directory in reversed(real.parents):
        if not directory.stat().st_mode & stat.S_IXOTH:
            return directory
    return None if real.stat().st_mode & stat.S_IROTH else real


def _read_inventory(path: Path) -> bytes:
    from slurm_hetero import inventory

    inventory.load(path)  # a bad inventory stops here, before anything is built
    return path.read_bytes()


def _new_venv_dir(layout: Layout) -> Path:
    layout.venvs.mkdir(parents=True, exist_ok=True)
    for directory in (layout.prefix, layout.venvs):
        directory.chmod(directory.stat().st_mode | 0o755)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    venv, n = layout.venvs / stamp, 1
    while venv.exists():
        n += 1
        venv = layout.venvs / f"{stamp}-{n}"
    return venv


def _build(venv: Path, python: Path, source: Path, pip_options: Sequence[str], base: Path | None) -> str:
    """Build and check the venv; on any failure remove it and raise (nothing else changed)."""
    py = str(venv / "bin" / "python")
    try:
        if base is not None and (base / "bin" / "python").exists():
            # hard links: a file of the current venv is never written in place (pip replaces files)
            shutil.copytree(base, venv, symlinks=True, copy_function=os.link)
            proc.run([py, *PIP, "--force-reinstall", "--no-deps", *pip_options, str(source)], PIP_TIMEOUT_S)
            try:
                proc.run([py, "-m", "pip", "check"], PIP_TIMEOUT_S)
            except ToolError:  # the new version needs other dependencies
                proc.run([py, *PIP, *pip_options, str(source)], PIP_TIMEOUT_S)
        else:
            proc.run([str(python), "-m", "venv", str(venv)], PIP_TIMEOUT_S)
            proc.run([py, *PIP, *pip_options, str(source)], PIP_TIMEOUT_S)
        _open_to_all(venv)
        out = proc.run([py, "-I", "-m", "slurm_hetero", "--version"], 120.0)
    except BaseException as e:
        shutil.rmtree(venv, ignore_errors=True)
        if isinstance(e, (ToolError, OSError)):
            raise HeteroError(f"building {venv} failed, nothing changed: {e}") from e
        raise
    return out.split()[-1] if out.split() else "?"


def _open_to_all(root: Path) -> None:
    """Directories 0755-ish and files readable by every user (a root umask of 077 is common)."""
    for directory, _, files in os.walk(root):
        for path in [directory, *(os.path.join(directory, f) for f in files)]:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                continue
            want = st.st_mode | stat.S_IROTH | stat.S_IRGRP
            if stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXUSR:
                want |= stat.S_IXOTH | stat.S_IXGRP
            if want != st.st_mode:
                os.chmod(path, stat.S_IMODE(want))


def prune(layout: Layout, keep: Iterable[Path]) -> list[Path]:
    """Remove the venvs under PREFIX/venvs other than `keep` that no process runs from."""
    kept = {Path(p) for p in keep}
    busy = busy_venvs(layout.venvs)
    removed = []
    for venv in sorted(layout.venvs.iterdir()) if layout.venvs.is_dir() else []:
        if venv not in kept and venv not in busy and not venv.name.startswith("."):
            shutil.rmtree(venv)
            removed.append(venv)
    return removed


def busy_venvs(venvs: Path, but: int | None = None) -> dict[Path, int]:
    """Venv directory -> a PID (other than `but`) whose program (argv[0]) lies in it."""
    prefix = str(venvs) + "/"
    found: dict[Path, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == but:
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if argv0.startswith(prefix):
            found.setdefault(venvs / argv0[len(prefix) :].split("/", 1)[0], int(entry.name))
    return found


# ------------------------------------------------------------------------------ uninstall

_INCLUDE = re.compile(r"^\s*include\s+(\S+)", re.IGNORECASE)


def slurm_conf_references(conf: Path, names: Sequence[str]) -> list[str]:
    """`FILE:LINE: text` for each line of slurm.conf (and the files it Includes) naming any of
    `names` (script or directory paths), comments aside."""
    found: list[str] = []
    pattern = re.compile("|".join(re.escape(n) + r"(?![\w.-])" for n in names))
    for path in _conf_files(conf):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            text = line.split("#", 1)[0]
            if pattern.search(text):
                found.append(f"{path}:{number}: {line.strip()}")
    return found


def _conf_files(conf: Path, depth: int = 0) -> list[Path]:
    files = [conf]
    for line in conf.read_text(errors="replace").splitlines() if depth < 8 else []:
        m = _INCLUDE.match(line)
        if m:
            pattern = m.group(1) if m.group(1).startswith("/") else str(conf.parent / m.group(1))
            for included in sorted(Path("/").glob(pattern.lstrip("/"))):
                if included.is_file():
                    files += _conf_files(included, depth + 1)
    return files


def uninstall(layout: Layout, slurm_confs: Sequence[Path]) -> list[str]:
    """Remove what install wrote, once no slurm.conf line names it; returns what it did."""
    if read_manifest(layout) is None:
        raise HeteroError(f"nothing installed in {layout.prefix} (no {layout.manifest.name})")
    with _locked(layout):
        done = _uninstall(layout, slurm_confs)
    (layout.prefix / ".lock").unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        layout.prefix.rmdir()
    return done


def _uninstall(layout: Layout, slurm_confs: Sequence[Path]) -> list[str]:
    manifest = read_manifest(layout)
    if manifest is None:
        raise HeteroError(f"nothing installed in {layout.prefix} (no {layout.manifest.name})")
    confs = [c for c in slurm_confs if c.is_file()]
    if not confs:
        raise HeteroError(
            f"no slurm.conf at {', '.join(map(str, slurm_confs))} to check for the scripts; "
            "pass --slurm-conf FILE (configless nodes: slurmd's cached copy); nothing removed"
        )
    scripts = [Path(p) for p in manifest["scripts"].values()]
    lines = [ref for c in confs for ref in slurm_conf_references(c, [*map(str, scripts), str(layout.prefix)])]
    if lines:
        raise HeteroError(
            "Slurm still runs what uninstall would remove: "
            + "; ".join(lines)
            + ". Remove these lines, run `scontrol reconfigure`, then uninstall again; nothing removed"
        )
    busy = busy_venvs(layout.venvs, but=os.getpid())  # uninstall may run from the venv itself
    if busy:
        venv, pid = next(iter(busy.items()))
        raise HeteroError(f"process {pid} runs from {venv}; wait for it to end; nothing removed")
    done = []
    for path in scripts:
        if path.is_file() and MARK in path.read_text(errors="replace"):
            path.unlink()
            done.append(f"removed {path}")
        elif path.exists():
            done.append(f"left {path} (not written by install)")
    if layout.current.is_symlink():
        layout.current.unlink()
    shutil.rmtree(layout.venvs, ignore_errors=True)
    layout.manifest.unlink()
    done.append(f"removed {layout.venvs}")
    with_inventory = manifest.get("inventory")
    if with_inventory:
        done.append(f"left {with_inventory} (site data)")
    return done
