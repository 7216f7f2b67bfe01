"""The Debian root that carries a Slurm release the host does not have (Debian 13: Slurm 24.11).

Built once with debootstrap (about a minute; 1.3 GB with Debian's CPU torch for the training
test) into a temporary directory and renamed into place when complete, so an interrupted build is
never used. Inside it: slurmctld, slurmd, the client tools, munge, python3 and a venv
(/opt/slurm-hetero/venv, Debian's python3-torch visible) with slurm-hetero's dependencies. The
package itself is installed from the checkout on every `up` (`install_checkout`), so jobs and the
TaskProlog run the code under test.

While a cluster runs, the root has /proc, /dev (fake GPUs included), /tmp and the checkout mounted
at the host's paths; `unmount` takes them away again (and a rebuild refuses to delete a root that
still has anything mounted).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import tomllib

from scripts.devcluster.release import Release

REPO = Path(__file__).resolve().parents[2]
MIRROR = os.environ.get("SLURM_HETERO_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = [
    "slurmctld",
    "slurmd",
    "slurm-client",
    "munge",
    "python3",
    "python3-venv",
    "python3-pip",
    "python3-torch",  # the uneven-training test; Debian's build is CPU-only and matches the root's python3
    "ca-certificates",
]
VENV = "/opt/slurm-hetero/venv"
BUILD_DEPS = ["hatchling>=1.18"]
COMPLETE = ".slurm-hetero-complete"
_DEBIAN_CA = "/etc/ssl/certs/ca-certificates.crt"


def log(message: str) -> None:
    print(f"[dev-cluster {time.strftime('%T')}] {message}", file=sys.stderr, flush=True)


def _run(*argv: str, **kw) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False, **kw)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip()[-3000:]
        raise SystemExit(f"dev-cluster: {' '.join(argv[:6])} ... failed ({result.returncode}):\n{tail}")
    return result


@contextlib.contextmanager
def shared_umask() -> Iterator[None]:
    """Umask 022 while files are made for every user of the root (slurmd's tasks run as them):
    under the caller's 077 pip installed the package 0600 in dirs 0700, and every non-root task's
    TaskProlog failed on 24.11."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def in_root(root: Path, *argv: str, **kw) -> subprocess.CompletedProcess:
    """Run argv inside `root` as root (needs /proc and /dev mounted for most tools), under umask
    022 (`shared_umask`)."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
    env["DEBIAN_FRONTEND"] = "noninteractive"
    with shared_umask():
        return _run("chroot", str(root), *argv, env=env, **kw)


def runtime_deps() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def recipe() -> str:
    """What a complete root holds; a root built from another recipe is rebuilt."""
    return f"suite packages: {' '.join(PACKAGES)}\n"


def ensure_root(release: Release) -> Path:
    """The release's root, built when missing or incomplete."""
    root = release.root
    assert root is not None
    marker = root / COMPLETE
    if marker.exists() and marker.read_text().startswith(recipe()):
        return root
    unmount(root)
    _ensure_debootstrap()
    temp = root.with_name(f"{root.name}.tmp-{os.getpid()}")
    for old in [*root.parent.glob(f"{root.name}.tmp-*"), root]:
        unmount(old)
        _remove(old)
    started = time.monotonic()
    log(f"building {root} (Debian {release.suite}: Slurm {release.name}) with debootstrap")
    root.parent.mkdir(parents=True, exist_ok=True)
    _run(
        "debootstrap",
        "--variant=minbase",
        "--include=" + ",".join(PACKAGES),
        release.suite,
        str(temp),
        MIRROR,
    )
    try:
        mount(temp, with_checkout=False)
        shutil.copyfile("/etc/resolv.conf", temp / "etc" / "resolv.conf")
        in_root(temp, "python3", "-m", "venv", "--system-site-packages", VENV)
        _pip(temp, *runtime_deps(), *BUILD_DEPS)
    finally:
        unmount(temp)
    (temp / "etc" / "slurm").mkdir(parents=True, exist_ok=True)
    (temp / COMPLETE).write_text(recipe() + f"python deps: {' '.join(runtime_deps())}\n")
    temp.rename(root)
    log(f"built {root} in {time.monotonic() - started:.0f}s")
    return root


def _pip(root: Path, *args: str) -> None:
    """pip in the root's venv, trusting the host's CA bundle (a site's TLS proxy lives there)."""
    bundle = Path(os.environ.get("PIP_CERT") or ssl.get_default_verify_paths().cafile or _DEBIAN_CA)
    cert = []
    if bundle.is_file():
        shutil.copyfile(bundle, root / "etc" / "slurm-hetero-host-ca.crt")
        cert = ["--cert", "/etc/slurm-hetero-host-ca.crt"]
    quiet = ["-q", "--disable-pip-version-check", "--no-input"]
    in_root(root, f"{VENV}/bin/python", "-m", "pip", "install", *quiet, *cert, *args)


def _ensure_debootstrap() -> None:
    if shutil.which("debootstrap"):
        return
    log("apt-get install debootstrap")
    _run("apt-get", "update", "-q")
    _run(
        "apt-get",
        "install",
        "-y",
        "-q",
        "debootstrap",
        env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
    )


def _remove(path: Path) -> None:
    if not path.exists():
        return
    if _mounts_under(path):
        raise SystemExit(f"dev-cluster: {path} still has mounts; not deleting it")
    shutil.rmtree(path)


def sync_deps(root: Path) -> None:
    """Install the runtime dependencies again when pyproject.toml changed them."""
    marker = root / COMPLETE
    line = f"python deps: {' '.join(runtime_deps())}\n"
    text = marker.read_text()
    if line in text:
        return
    log("installing changed runtime dependencies into the root's venv")
    shutil.copyfile("/etc/resolv.conf", root / "etc" / "resolv.conf")
    _pip(root, *runtime_deps())
    marker.write_text(recipe() + line)


def install_packages(root: Path, packages: list[str]) -> None:
    """Debian packages a feature needs (`--accounting`: mariadb-server, slurmdbd) into a built root,
    on first use, without starting their daemons (policy-rc.d)."""
    log(f"apt-get install {' '.join(packages)} in {root}")
    shutil.copyfile("/etc/resolv.conf", root / "etc" / "resolv.conf")
    policy = root / "usr" / "sbin" / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    try:
        in_root(root, "apt-get", "update", "-q")
        in_root(root, "apt-get", "install", "-y", "-q", "--no-install-recommends", *packages)
    finally:
        policy.unlink()


def install_checkout(root: Path) -> None:
    """pip install the checkout this script runs from into the root's venv (no deps, no build
    isolation), readable by every user whatever the caller's umask."""
    with shared_umask():
        _install_checkout(root)


def _install_checkout(root: Path) -> None:
    src = root / "opt" / "slurm-hetero" / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    # what the wheel takes from outside the package (the Lua hooks, docs/launch.md)
    forced = project["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    for name in ("pyproject.toml", "README.md", *forced):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "slurm_hetero", src / "slurm_hetero", ignore=ignore)
    _pip(root, "--no-deps", "--no-build-isolation", "--force-reinstall", "/opt/slurm-hetero/src")


def processes(root: Path) -> list[int]:
    """PIDs of the processes running inside `root` (their root directory is it): what the dev
    cluster started there (munged, slurmctld, slurmds, slurmstepds and their jobs)."""
    target, own = str(root.resolve()), os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            if os.readlink(entry / "root") == target:
                found.append(int(entry.name))
        except OSError:  # gone, or a zombie
            continue
    return found


# ---------------------------------------------------------------------------------------- mounts


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    points = []
    for line in Path("/proc/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point.startswith(prefix):
            points.append(point)
    return points


def _is_mounted(point: Path) -> bool:
    return str(point) in {ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines()}


def mount(root: Path, with_checkout: bool = True) -> None:
    """/proc, /dev (recursively: fake GPUs, /dev/shm, /dev/pts), /tmp and the checkout, at the
    host's paths. Idempotent."""
    plan: list[tuple[list[str], Path, bool]] = [
        (["-t", "proc", "proc"], root / "proc", False),
        (["--rbind", "/dev"], root / "dev", False),
        (["--bind", "/tmp"], root / "tmp", False),
    ]
    if with_checkout:
        plan.append((["--bind", str(REPO)], root / REPO.relative_to("/"), True))
    for args, point, read_only in plan:
        if _is_mounted(point):
            continue
        point.mkdir(parents=True, exist_ok=True)
        _run("mount", *args, str(point))
        if read_only:
            _run("mount", "-o", "remount,bind,ro", str(point))


def unmount(root: Path) -> None:
    """Everything mounted under `root`, deepest first."""
    if not root.exists():
        return
    for point in sorted(_mounts_under(root), key=len, reverse=True):
        if subprocess.run(["umount", point], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    left = _mounts_under(root)
    if left:
        raise SystemExit(f"dev-cluster: could not unmount {left}")
