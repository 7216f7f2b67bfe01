"""The launcher's supervisor: one rank's command as a child process, watched until it ends.

Output relay, signal forwarding, the peer-failure protocol and what is stopped when the command
ends follow docs/launch.md ("Supervision and failure modes"), which states the rules for users.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any

from slurm_hetero.core import proc
from slurm_hetero.core.errors import LaunchError, ToolError
from slurm_hetero.launch.early import CATCHING as _CATCHING
from slurm_hetero.launch.early import EARLY as _EARLY
from slurm_hetero.launch.early import PEER_FAILED, SLURM_DELIVERED, STOP_SIGNALS, let_pass
from slurm_hetero.launch.plan import RankPlan

logger = logging.getLogger("slurm_hetero.launch.run")  # the name the CLI's log lines show

FORWARDED = STOP_SIGNALS  # to the command's group and tree (`signal_tree`)
PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 10.0  # a command told to stop (SIGTERM) gets this long before SIGKILL
# The failing rank's detached `scancel` of the step, for a launcher that does not end
CANCEL_AFTER_S = STOP_GRACE_S + 10.0
PEER_FAILED_AGAIN_S = (2.0, 5.0)  # PEER_FAILED repeated for ranks that were still starting
# After a forwarded SIGTERM, the wait for a PEER_FAILED behind it (srun -K's SIGTERM can overtake
# it): inside Slurm's KillWait and before PEER_FAILED_AGAIN_S's first repeat.
PEER_FAILED_LATE_S = 3.0
KEEP_HANDLERS_WHEN_ENDING = False  # set by the `launch` command, which exits after the rank
RELAY_CHUNK = 64 * 1024  # the most output the relay holds at once, per stream


def relay_chunks(stream: IO[bytes], size: int = RELAY_CHUNK) -> Iterator[bytes]:
    """The stream's bytes in order, each piece a line or at most `size` bytes of one."""
    return iter(lambda: stream.readline(size), b"")


def _die_with_parent() -> None:
    """In the child: receive SIGTERM when the launcher dies (Linux prctl; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _join(threads: Sequence[threading.Thread], seconds: float) -> None:
    for thread in threads:
        thread.join(timeout=seconds)


def _wait_until(condition: Callable[[], bool], seconds: float) -> None:
    """Poll `condition` until it holds or `seconds` pass (signal handlers run between polls)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def _process_table(proc_root: str = "/proc") -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every live process; [] without /proc."""
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return []
    table = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, entry, "stat"), "rb") as f:
                stat = f.read(4096)
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after the command name, which may hold spaces
        if len(fields) > 2 and fields[1].isdigit() and fields[2].isdigit():
            table.append((int(entry), int(fields[1]), int(fields[2])))
    return table


def descendants(pid: int, table: Sequence[tuple[int, int, int]] | None = None) -> list[int]:
    """Every live process below `pid` in `table` (`_process_table()` when None)."""
    children: dict[int, list[int]] = {}
    for entry, parent, _group in _process_table() if table is None else table:
        children.setdefault(parent, []).append(entry)
    out, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children.get(child, ()))
    return out


def signal_tree(child: subprocess.Popen[bytes], signum: int, also: Sequence[int] = ()) -> list[int]:
    """Send `signum` to the command's process group, every process it started that left the group
    and the processes `also` (an earlier signal's tree); the processes signalled. The group goes
    first, at once: one by one, a shell lost its `sleep` being forked and ran its next command."""
    members: list[int] = []
    others = list(also)
    if child.poll() is None:  # not reaped: its pid, the group's id, is not reused
        table = _process_table()
        members = signal_group(child.pid, signum, table)
        others += descendants(child.pid, table)
    others = [pid for pid in dict.fromkeys(others) if pid not in members]  # one signal each
    return [*members, *signal_all(others, signum)]


def signal_group(group: int, signum: int, table: Sequence[tuple[int, int, int]] | None = None) -> list[int]:
    """Send `signum` to process group `group` if it has members; the members."""
    rows = _process_table() if table is None else table
    members = [pid for pid, _parent, pgrp in rows if pgrp == group]
    if members:
        with contextlib.suppress(OSError):  # ended meanwhile
            os.killpg(group, signum)
    return members


def pipe_holders(streams: Sequence[IO[bytes] | None]) -> list[int]:
    """The other processes holding a pipe of `streams` open; [] where /proc cannot be read."""
    try:
        pipes = {os.readlink(f"/proc/self/fd/{stream.fileno()}") for stream in streams if stream}
        entries = [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != os.getpid()]
    except (OSError, ValueError):
        return []
    holders = []
    for pid in entries:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(_link(f"/proc/{pid}/fd/{fd}") in pipes for fd in fds):
                holders.append(pid)
        except OSError:  # ended meanwhile, or another user's
            continue
    return holders


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def signal_all(pids: Sequence[int], signum: int) -> list[int]:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)
    return list(pids)


def _alive(pids: Sequence[int]) -> list[int]:
    return [pid for pid in pids if os.path.exists(f"/proc/{pid}")]


def _ignored_when_ending(failed: bool) -> tuple[int, ...]:
    """What the launcher ignores as it exits after the rank (SIG_IGN: interpreter shutdown puts
    Python handlers back to SIG_DFL): Slurm's USR1/USR2 always, and after a failure the stop
    signals too, so srun -K's SIGTERM does not make the exit 143."""
    if not KEEP_HANDLERS_WHEN_ENDING:
        return ()
    return (*(FORWARDED if failed else ()), *SLURM_DELIVERED)


class Supervisor:
    """Run one rank's command, relay its output, forward signals, and end the step on failure."""

    def __init__(
        self,
        rank: RankPlan,
        command: Sequence[str],
        env: Mapping[str, str],
        targets: Sequence[str],
        logs: Mapping[str, IO[bytes]] | None = None,
    ) -> None:
        """`logs`: open files for "out" and "err" (`--log-dir`); None: prefixed lines on our own."""
        self.rank, self.command, self.env, self.targets, self.logs = rank, command, env, targets, logs
        self.forwarded: int | None = None
        self.peer_failed = False  # another rank failed: this one was told to stop (PEER_FAILED)
        self.failed = False  # this rank's command failed: the step is being ended from here
        self.stopped: list[int] = []  # the command's tree as a stop signal or PEER_FAILED found it
        self.last_error = ""
        self.child: subprocess.Popen[bytes] | None = None

    def run(self) -> int:
        if _CATCHING[0] and _EARLY:
            return self._ended_before_start()
        try:
            child = subprocess.Popen(
                list(self.command), env=dict(self.env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
                start_new_session=True,  # a group of its own, for signal_tree
            )  # fmt: skip
        except OSError as e:
            raise LaunchError(f"cannot run {self.command[0]}: {e.strerror}") from e
        self.child = child
        previous = {s: signal.signal(s, self._forward) for s in FORWARDED}
        previous.update({s: signal.signal(s, let_pass) for s in SLURM_DELIVERED})
        previous[PEER_FAILED] = signal.signal(PEER_FAILED, self._peer_failed)
        late = list(_EARLY) if _CATCHING[0] else []  # came while the command was being started
        _CATCHING[0] = False
        for signum in late:
            (self._peer_failed if signum == PEER_FAILED else self._forward)(signum, None)
        try:  # handlers stay while the step is cancelled: its SIGTERM reaches this launcher too
            pumps = [self._pump(child.stdout, "out"), self._pump(child.stderr, "err")]
            code = child.wait()
            left = signal_group(child.pid, signal.SIGTERM)  # a shell's `cmd &`: it held the pipes open
            _join(pumps, 0.5)  # the last lines, unless grandchildren hold the pipes open
            if any(pump.is_alive() for pump in pumps):  # held by one outside the group (`setsid cmd &`)
                left += signal_all(pipe_holders([child.stdout, child.stderr]), signal.SIGTERM)
            if code != 0 and self.forwarded == signal.SIGTERM:  # PEER_FAILED's handler runs here
                _wait_until(lambda: self.peer_failed, PEER_FAILED_LATE_S)
            status = self.finish(code)
            # Stopped: exit within Slurm's KillWait even where an orphan keeps the pipes open
            _join(pumps, 0.5 if self.forwarded is not None or self.peer_failed or left else 5.0)
            if left:
                signal_group(child.pid, signal.SIGKILL)
                signal_all(_alive(left), signal.SIGKILL)
            return status
        finally:
            ignored = _ignored_when_ending(self.failed or self.peer_failed)
            for s, handler in previous.items():
                signal.signal(s, signal.SIG_IGN if s in ignored else handler)

    def _ended_before_start(self) -> int:
        """A stop signal or PEER_FAILED came while planning: the command is not started; exit as
        `run` would (0 after PEER_FAILED, waited for after a SIGTERM, else 128 + the signal)."""
        _wait_until(lambda: PEER_FAILED in _EARLY or signal.SIGTERM not in _EARLY, PEER_FAILED_LATE_S)
        for s in _ignored_when_ending(True):  # as `run` ends
            signal.signal(s, signal.SIG_IGN)
        _CATCHING[0] = False
        if PEER_FAILED in _EARLY:
            self.peer_failed = True
            return self.finish(-signal.SIGTERM)
        signum = next(s for s in _EARLY if s in STOP_SIGNALS)
        logger.info(
            "rank %d: %s before the command started; not started", self.rank.rank, signal.Signals(signum).name
        )
        return 128 + signum

    def _forward(self, signum: int, _frame: Any) -> None:
        """A stop signal for the command's group and tree; SIGTERM after PEER_FAILED is Slurm ending
        the step (srun -K): `_kill_now`."""
        first_term = signum == signal.SIGTERM and self.forwarded != signal.SIGTERM
        self.forwarded = signum
        child = self.child
        if child is None:
            return
        if first_term and self.peer_failed:
            self._kill_now(child)
        else:
            self.stopped = signal_tree(child, signum, _alive(self.stopped))

    def _peer_failed(self, _signum: int, _frame: Any) -> None:
        """Another rank failed: stop the command (SIGTERM, SIGKILL after STOP_GRACE_S). After a
        SIGTERM Slurm is ending the step and may kill us before STOP_GRACE_S (srun would report
        137): the command is killed at once."""
        if self.failed or self.peer_failed or self.child is None:
            return
        self.peer_failed = True
        child = self.child
        if self.forwarded == signal.SIGTERM:
            self._kill_now(child)
        elif child.poll() is None:
            self.stopped = stopped = signal_tree(child, signal.SIGTERM)
            timer = threading.Timer(STOP_GRACE_S, lambda: signal_tree(child, signal.SIGKILL, _alive(stopped)))
            timer.daemon = True
            timer.start()

    def _kill_now(self, child: subprocess.Popen[bytes]) -> None:
        logger.info("rank %d: the step is ending; killing the command", self.rank.rank)
        self.stopped = signal_tree(child, signal.SIGKILL, _alive(self.stopped))

    def _pump(self, stream: IO[bytes] | None, kind: str) -> threading.Thread:
        thread = threading.Thread(target=self._relay, args=(stream, kind), daemon=True)
        thread.start()
        return thread

    def _relay(self, stream: IO[bytes] | None, kind: str) -> None:
        """Copy the command's output to its sink, prefixed at line starts. A failing sink is
        reported once and the output drained from there, so the command never blocks."""
        if stream is None:
            return
        if self.logs is None:
            r = self.rank
            sink = (sys.stdout if kind == "out" else sys.stderr).buffer
            prefix = f"[rank {r.rank} {r.type} stage {r.stage}] ".encode()
        else:
            sink, prefix = self.logs[kind], b""
        working, at_start = True, True
        try:
            for chunk in relay_chunks(stream):
                if kind == "err" and chunk.strip():
                    self.last_error = chunk.decode(errors="replace").strip()
                if working:
                    working = self._write(sink, kind, prefix + chunk if at_start else chunk)
                    at_start = chunk.endswith(b"\n")
            if working and not at_start:
                self._write(sink, kind, b"\n")
        finally:
            if self.logs is not None:
                with contextlib.suppress(OSError):  # already reported: the data it held is dropped
                    sink.close()

    def _write(self, sink: IO[bytes], kind: str, data: bytes) -> bool:
        """Write and flush `data`; False, reported, when the sink fails (the rest is dropped)."""
        try:
            sink.write(data)
            sink.flush()
            return True
        except OSError as e:
            name = getattr(sink, "name", None)
            where = name if isinstance(name, str) else f"the rank's std{kind}"
            problem = f"cannot write {where}: {e.strerror or e}; output dropped from here"
        with contextlib.suppress(OSError):  # the launcher's own stderr is the sink that failed
            print(f"slurm-hetero: rank {self.rank.rank}: {problem}", file=sys.stderr, flush=True)
        return False

    def finish(self, code: int) -> int:
        """Report a failure (first), end the step, and return the launcher's exit code."""
        status, r = 128 - code if code < 0 else code, self.rank
        if code == 0:
            return 0
        if self.peer_failed:
            print(
                f"slurm-hetero: rank {r.rank} on {r.node} stopped: another rank of the step failed "
                "(its launcher named it); exit 0, so srun reports that rank's exit code",
                file=sys.stderr, flush=True,
            )  # fmt: skip
            return 0
        if self.forwarded is not None:
            logger.info("rank %d stopped after %s", self.rank.rank, signal.Signals(self.forwarded).name)
            return status
        line = (
            f"slurm-hetero: rank {r.rank} on {r.node} ({r.type}, stage {r.stage}) exited with code {status}"
        )
        with contextlib.suppress(ValueError):  # a signal number Python has no name for
            line += f" ({signal.Signals(-code).name})" if code < 0 else ""
        line += f": {self.last_error}" if self.last_error else ""
        print(line, file=sys.stderr, flush=True)
        self.failed = True
        end_step(self.targets)
        return status


def end_step(targets: Sequence[str]) -> None:
    """Tell every rank of the step (`targets`: its job.step ids) to stop (PEER_FAILED), and leave a
    detached process that repeats it (PEER_FAILED_AGAIN_S) and cancels the step (CANCEL_AFTER_S)."""
    if not targets:
        return
    again = ["scancel", f"--signal={PEER_FAILED.name[3:]}", *targets]
    try:
        proc.run(again, timeout=15)
    except ToolError as e:
        logger.warning("could not signal step %s: %s", " ".join(targets), e)
    try:  # again for ranks still starting (their handler not yet set: SIGURG is ignored)
        steps = [(delay, again) for delay in PEER_FAILED_AGAIN_S]
        proc.run_later([*steps, (CANCEL_AFTER_S, ["scancel", *targets])])
    except ToolError as e:
        logger.warning("could not leave a cancel of step %s behind: %s", " ".join(targets), e)
