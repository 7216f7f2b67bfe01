"""Run a command against the dev cluster with its release's tools, as a given user.

For the host's release the command runs as it is (after dropping to the user). For a chrooted
release the child enters the root first (chroot, then the working directory if the root has it,
else `/`), then drops to the user, so `sbatch` is the root's sbatch talking to the root's munged.
Always an argv list: nothing here goes through a shell. The root sees the host's /tmp, /dev and
the checkout at the same paths (`troot.mount`), so job scripts, output files and `--chdir` work
unchanged on either release.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from scripts.devcluster.release import Release

# PATH inside a root: the slurm-hetero venv first (`srun slurm-hetero launch` finds it), then Debian's.
ROOT_PATH = "/opt/slurm-hetero/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Host-only settings that would point a root's Python or loader at the host's files.
_DROP = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD")


def passwd_entry(root: Path | None, user: str | int) -> tuple[str, int, int, str]:
    """(name, uid, gid, home) of a user from the host's passwd, or from a root's /etc/passwd."""
    if root is None:
        entry = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
        return entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir
    for line in (root / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if len(fields) >= 7 and (fields[0] == user or (isinstance(user, int) and fields[2] == str(user))):
            return fields[0], int(fields[2]), int(fields[3]), fields[5]
    raise KeyError(f"no user {user} in {root}/etc/passwd")


def share_user(root: Path, name: str) -> None:
    """Give a root the host's passwd and group lines of `name` (same ids), when it lacks them:
    slurmctld and slurmd in the root resolve job users there."""
    passwd, group = root / "etc" / "passwd", root / "etc" / "group"
    if any(ln.split(":")[0] == name for ln in passwd.read_text().splitlines()):
        return  # the root's own (system users such as munge may have other ids there)
    entry = pwd.getpwnam(name)
    fields = [name, "x", str(entry.pw_uid), str(entry.pw_gid), entry.pw_gecos, entry.pw_dir, entry.pw_shell]
    with passwd.open("a") as out:
        out.write(":".join(fields) + "\n")
    gids = {ln.split(":")[2] for ln in group.read_text().splitlines() if ln.count(":") >= 3}
    if str(entry.pw_gid) not in gids:
        import grp

        with group.open("a") as out:
            out.write(f"{grp.getgrgid(entry.pw_gid).gr_name}:x:{entry.pw_gid}:\n")


def _groups(root: Path | None, name: str, gid: int) -> list[int]:
    if root is None:
        return os.getgrouplist(name, gid)
    groups = {gid}
    for line in (root / "etc" / "group").read_text().splitlines():
        fields = line.split(":")
        if len(fields) >= 4 and name in fields[3].split(","):
            groups.add(int(fields[2]))
    return sorted(groups)


def prepare(
    release: Release,
    user: str | int | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> tuple[dict[str, str], Callable[[], None] | None]:
    """The environment and the in-child setup (chroot, chdir, drop to `user`) for a client command.
    `user` None: the caller, unchanged."""
    env = dict(os.environ if env is None else env)
    cwd = cwd or os.getcwd()
    if release.root is not None:
        env = {k: v for k, v in env.items() if k not in _DROP}
        env["PATH"] = ROOT_PATH
    identity = None
    if user is not None:
        if release.root is not None and not isinstance(user, int):
            share_user(release.root, user)
        name, uid, gid, home = passwd_entry(release.root, user)
        if (uid, gid) != (os.getuid(), os.getgid()):
            identity = (uid, gid, _groups(release.root, name, gid))
            env.update(HOME=home, USER=name, LOGNAME=name)
    root = release.root
    if root is None and identity is None:
        return env, None

    def setup() -> None:  # runs in the child between fork and exec
        if root is not None:
            os.chroot(root)
            os.chdir(cwd if os.path.isdir(cwd) else "/")
        else:
            os.chdir(cwd)
        if identity is not None:
            uid, gid, groups = identity
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)

    return env, setup


def run(
    release: Release,
    argv: list[str],
    user: str | int | None = None,
    *,
    stdin: str | None = None,
    timeout: float | None = None,
    check: bool = False,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    **kw: Any,
) -> subprocess.CompletedProcess:
    """Run a client command (captured, text) against the release's cluster."""
    child_env, setup = prepare(release, user, env, cwd)
    return subprocess.run(
        list(argv),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        env=child_env,
        preexec_fn=setup,
        cwd=cwd if setup is None else None,  # else setup changes directory (inside a root, as the user)
        **kw,
    )


def exec_(release: Release, argv: list[str], user: str | int | None = None) -> None:
    """Replace this process with the client command (what `dev-cluster run` does)."""
    env, setup = prepare(release, user)
    if setup is not None:
        setup()
    os.execvpe(argv[0], list(argv), env)
