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

The rules in full: docs/admin-guide.md, "Install on every node, with the inventory".
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_hetero import __version__
from slurm_hetero.core import proc
from slurm_hetero.core.errors import HeteroError, ToolError
from slurm_hetero.core.writefile import write_synced

MARK = "# written by `slurm-hetero install`"
OWNER = "# owner: "  # the line naming the install.json a script belongs to
PIP_TIMEOUT_S = 1800.0
PIP = ("-m", "pip", "install", "-q", "--disable-pip-version-check")


@dataclass(frozen=True)
class Layout:
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
        return {
            "taskprolog": self.etc / "slurm-hetero-taskprolog",
            "health": self.etc / "slurm-hetero-health",
            "command": self.bin_dir / "slurm-hetero",
        }


def _exec(python: Path) -> str:
    """-I: the job's PYTHONPATH, user site-packages and working directory must not change which
    code runs."""
    return f"exec {shlex.quote(str(python))} -I -m slurm_hetero"


def taskprolog_command(python: Path, inventory: str, config: str | None) -> str:
    """The TaskProlog's commands (the dev cluster's chrooted prolog too). USR1/USR2 (a checkpoint
    request) reach the TaskProlog as well, and would kill it while Python starts."""
    config_arg = f" --config {shlex.quote(config)}" if config else ""
    return f"trap '' USR1 USR2\n{_exec(python)} task-prolog --inventory {shlex.quote(inventory)}{config_arg}"


def script_text(kind: str, python: Path, layout: Layout, config: str | None) -> str:
    """The shell script of `kind`."""
    body = {
        "taskprolog": taskprolog_command(python, str(layout.inventory), config),
        "health": f"{_exec(python)} health --inventory {shlex.quote(str(layout.inventory))}",
        "command": f'{_exec(python)} "$@"',
    }[kind]
    head = f"#!/bin/sh\n{MARK}; run it, do not edit it (an upgrade rewrites it)\n"
    return f"{head}{OWNER}{layout.manifest}\n{body}\n"


def slurm_conf_value(path: Path) -> str:
    """`path` as a slurm.conf value: quoted when it holds whitespace (Slurm ends a bare value there)."""
    text = str(path)
    return f'"{text}"' if any(c.isspace() for c in text) else text


def default_source() -> Path | None:
    """The checkout this package runs from, when it runs from one."""
    root = Path(__file__).resolve().parents[2]
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
    """Install (or `upgrade`) the venv and scripts; returns the new manifest."""
    named = {"--prefix": layout.prefix, "--slurm-etc": layout.etc, "--bin-dir": layout.bin_dir}
    named.update({"--site-dir": layout.site, "--python": python, "--source": source})
    for what, value in [*named.items(), ("--inventory", inventory_file or ""), ("--config", config or "")]:
        # a control character would split a script or slurm.conf line
        if bad := [c for c in str(value) if ord(c) < 32 or ord(c) == 127]:
            raise HeteroError(
                f"{what} {str(value)!r} holds the control character {bad[0]!r}; give a path without one"
            )
    if slurm_conf_value(layout.etc).count('"') > 2:
        raise HeteroError(
            f"--slurm-etc {layout.etc}: slurm.conf cannot name a path with a double quote and whitespace; "
            "give another"
        )
    _check_python(python)  # before the lock makes PREFIX: a refused install leaves nothing behind
    if not source.exists():
        raise HeteroError(f"--source {source} does not exist; give a checkout or a wheel")
    saved = os.umask(0o022)  # every job user reads the venv, the scripts and the directories made
    try:
        with _locked(layout):
            return _install(layout, python, source, inventory_file, config, pip_options, upgrade)
    except FileExistsError as e:  # mkdir of a path that is a file
        raise HeteroError(f"{e.filename} is a file, not a directory; move it or pass another path") from e
    except OSError as e:  # a read-only file system, ...
        raise HeteroError(
            f"cannot write {e.filename or layout.prefix}: {e.strerror or e}; nothing changed"
        ) from e
    finally:
        os.umask(saved)


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
    if old and config is None:
        config = old.get("config")
    if layout.current.exists() and not layout.current.is_symlink():
        raise HeteroError(
            f"{layout.current} is a directory install did not make; move it away or pass --prefix"
        )
    inventory_text = None
    if inventory_file:
        from slurm_hetero.inventory import document as inventory

        inventory.load(inventory_file)  # a bad inventory stops here, before anything is built
        inventory_text = inventory_file.read_bytes()
    scripts = layout.scripts()
    _check_owners(layout, old, scripts.values())
    for directory in {layout.etc, layout.bin_dir, *([layout.site] if inventory_text is not None else [])}:
        _open_dir(directory)
    venv = _new_venv_dir(layout)
    base = Path(old["venv"]) if old and old.get("python") == str(python) else None
    version = _build(venv, python, source, pip_options, base)
    texts = {
        path: script_text(kind, venv / "bin" / "python", layout, config).encode()
        for kind, path in scripts.items()
    }
    manifest = {
        "version": version,
        "python": str(python),
        "source": str(source),
        "venv": str(venv),
        "scripts": {kind: str(path) for kind, path in scripts.items()},
        "hashes": {str(path): hashlib.sha256(text).hexdigest() for path, text in texts.items()},
        "inventory": str(layout.inventory) if inventory_text is not None else (old or {}).get("inventory"),
        "config": config,
        "installed_by": __version__,
    }
    files = {path: (text, 0o755) for path, text in texts.items()}
    if inventory_text is not None:
        files[layout.inventory] = (inventory_text, 0o644)
    files[layout.manifest] = ((json.dumps(manifest, indent=2) + "\n").encode(), 0o644)  # renamed last
    _replace_all(files, venv)
    link = layout.current.with_name(f".{layout.current.name}.new")  # replaces the old one in one rename
    link.unlink(missing_ok=True)
    link.symlink_to(venv.relative_to(layout.prefix))
    os.replace(link, layout.current)
    manifest["removed_venvs"] = [str(p) for p in prune(layout, keep=[venv, *([base] if base else [])])]
    return manifest


def _check_owners(layout: Layout, old: dict | None, scripts: Iterable[Path]) -> None:
    """Refuse to rewrite a script another prefix's install wrote."""
    for path in scripts:
        try:
            text = path.read_text(errors="replace")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            continue
        if MARK not in text or f"{OWNER}{layout.manifest}\n" in text:
            continue
        owner = next((line[len(OWNER) :] for line in text.splitlines() if line.startswith(OWNER)), None)
        if owner is None and old and str(path) in old.get("scripts", {}).values():
            continue  # written by this install before scripts named their owner
        raise HeteroError(
            f"{path} belongs to the install of {owner or 'another prefix'}; uninstall that one or pass "
            "other --slurm-etc/--bin-dir; nothing changed"
        )


def _open_dir(directory: Path) -> None:
    """Make `directory` and open it to every user: the TaskProlog runs as the job's user."""
    directory.mkdir(parents=True, exist_ok=True)
    mode = directory.stat().st_mode
    if mode & 0o755 != 0o755:
        directory.chmod(stat.S_IMODE(mode) | 0o755)


def _replace_all(files: dict[Path, tuple[bytes, int]], venv: Path) -> None:
    """Stage every file beside its target, then rename them all; a failed write changes nothing
    (and removes `venv`)."""
    staged: list[tuple[str, Path]] = []
    target = venv
    try:
        for path, (data, mode) in files.items():
            target = Path(os.path.realpath(path)) if path.is_symlink() else path
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".new", dir=target.parent)
            os.close(fd)
            staged.append((tmp, target))
            write_synced(Path(tmp), data, mode)
    except OSError as e:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        shutil.rmtree(venv, ignore_errors=True)
        # a full disk names no file (a write, not an open): the one being written
        raise HeteroError(f"cannot write {e.filename or target}: {e.strerror or e}; nothing changed") from e
    for tmp, target in staged:
        os.replace(tmp, target)


def _check_python(python: Path) -> None:
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise HeteroError(f"--python {python} is not an executable file")
    if (closed := unreachable(python)) is not None:
        raise HeteroError(
            f"--python {python}: {closed} is not open to other users "
            f"({stat.filemode(closed.stat().st_mode)}), and the TaskProlog runs as the job's user; "
            "pass a system Python such as /usr/bin/python3"
        )
    if os.geteuid() == 0 and shutil.which("runuser"):
        # what the modes cannot tell: a wrapper that execs a closed Python, a libpython under /root
        try:
            proc.run(["runuser", "-u", "nobody", "--", str(python), "-I", "-c", "import sys"], 60.0)
        except ToolError as e:
            said = (e.stderr_tail.strip().splitlines() or [str(e)])[-1]
            raise HeteroError(
                f"--python {python}: the user nobody cannot run it ({said}), and the TaskProlog runs "
                "as the job's user; pass a system Python such as /usr/bin/python3"
            ) from e


def unreachable(path: Path) -> Path | None:
    """The first directory on the way to `path` (or the file) that other users cannot pass (read)."""
    real = Path(os.path.realpath(path))
    for directory in reversed(real.parents):
        if not directory.stat().st_mode & stat.S_IXOTH:
            return directory
    return None if real.stat().st_mode & stat.S_IROTH else real


def _new_venv_dir(layout: Layout) -> Path:
    for directory in (layout.prefix, layout.venvs):
        _open_dir(directory)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    venv, n = layout.venvs / stamp, 1
    while venv.exists():
        n += 1
        venv = layout.venvs / f"{stamp}-{n}"
    return venv


def _build(venv: Path, python: Path, source: Path, pip_options: Sequence[str], base: Path | None) -> str:
    """Build and check the venv; on any failure remove it and raise."""
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
    """Make everything readable by every user (a root umask of 077 is common)."""
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
    """Venv directory -> a PID (not `but`) whose argv[0] lies in it."""
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


_INCLUDE = re.compile(r"^\s*include\s+(\S+)", re.IGNORECASE)
_PATH = re.compile(r"/[^\s=,\"']*")


def _spellings(path: str) -> set[str]:
    """A path as written, resolved, and with only its directories resolved (a link to a venv's
    Python still names the venv)."""
    norm = os.path.normpath(path)
    return {
        norm,
        os.path.realpath(norm),
        os.path.join(os.path.realpath(os.path.dirname(norm)), os.path.basename(norm)),
    }


def slurm_conf_references(conf: Path, names: Sequence[str]) -> list[str]:
    """`FILE:LINE: text` of each line of slurm.conf (and its Includes) naming any of `names` or a
    path under one."""
    found: list[str] = []
    wanted = {spelling for name in names for spelling in _spellings(name)}
    for path in _conf_files(conf):
        for number, line in enumerate(_conf_text(path).splitlines(), 1):
            text = line.split("#", 1)[0]
            for word in _PATH.findall(text):
                if any(s == w or s.startswith(w.rstrip("/") + "/") for s in _spellings(word) for w in wanted):
                    found.append(f"{path}:{number}: {line.strip()}")
                    break
    return found


def _conf_text(path: Path) -> str:
    try:
        data = path.read_bytes()
        if b"\0" in data:
            raise ValueError("it holds NUL bytes")
        return data.decode()
    except (OSError, ValueError) as e:
        raise HeteroError(
            f"cannot check {path} for the scripts ({e}); fix it or pass --slurm-conf FILE; nothing removed"
        ) from e


def _conf_files(conf: Path, depth: int = 0) -> list[Path]:
    files = [conf]
    for line in _conf_text(conf).splitlines() if depth < 8 else []:
        if m := _INCLUDE.match(line):
            pattern = m.group(1) if m.group(1).startswith("/") else str(conf.parent / m.group(1))
            matched = sorted(Path("/").glob(pattern.lstrip("/")))
            if not matched and not any(c in pattern for c in "*?["):
                raise HeteroError(
                    f"{conf}: Include {m.group(1)}: no such file, so it cannot be checked for the "
                    "scripts; fix the line or pass --slurm-conf FILE; nothing removed"
                )
            for included in matched:
                if included.is_file():
                    files += _conf_files(included, depth + 1)
    return files


def uninstall(layout: Layout, slurm_confs: Sequence[Path]) -> list[str]:
    """Remove what install wrote, once no slurm.conf line names it; returns what was done."""
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
    hashes = manifest.get("hashes", {})
    for path in scripts:
        data = path.read_bytes() if path.is_file() else None
        if data is None:
            if path.exists():
                done.append(f"left {path} (not written by install)")
            continue
        written = hashes.get(str(path))
        if hashlib.sha256(data).hexdigest() == written if written else MARK.encode() in data:
            path.unlink()
            done.append(f"removed {path}")
        else:
            done.append(f"left {path} (not as install wrote it: edited or replaced; remove it yourself)")
    if layout.current.is_symlink():
        layout.current.unlink()
    shutil.rmtree(layout.venvs, ignore_errors=True)
    layout.manifest.unlink()
    done.append(f"removed {layout.venvs}")
    if with_inventory := manifest.get("inventory"):
        done.append(f"left {with_inventory} (site data)")
    return done
