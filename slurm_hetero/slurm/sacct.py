"""Slurm's accounting through its CLIs: `sacct -P` job records, `scontrol show config`, and the
hook's refusal lines in slurmctld's log.

A rewritten job carries the hook's decision in its AdminComment, which slurmdbd stores; a refused
job never reaches slurmdbd, so its only record is the hook's line in slurmctld's log. The parsers
are pure; `jobs`, `config` and `LogTail` are the callers.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import BinaryIO

from slurm_hetero.core import proc
from slurm_hetero.core.errors import HeteroError, ParseError, ToolError

FIELDS = ("JobID", "User", "Partition", "State", "Submit", "Start", "End", "AllocTRES", "AdminComment")
NOTE_PREFIX = "slurm_hetero: "  # the hook's admin comment and log prefix (submit.NOTE_PREFIX)
_UNSET = ("", "Unknown", "None")
MAX_LOG_LINE = 1 << 16  # a longer log line is skipped: none of the hook's is near


@dataclass(frozen=True)
class JobRecord:
    """One allocation (`sacct -X`) as the report needs it."""

    job_id: str
    user: str
    partition: str
    state: str
    submit: datetime
    start: datetime | None  # None: never started
    end: datetime | None  # None: still running
    gpus: Mapping[str, int]  # gpu type -> devices allocated (from AllocTRES gres/gpu:TYPE=N)
    admin_comment: str = ""

    @property
    def decision(self) -> str | None:
        """The hook's decision recorded in the admin comment (the last one), else None."""
        at = self.admin_comment.rfind(NOTE_PREFIX)
        return self.admin_comment[at + len(NOTE_PREFIX) :] if at >= 0 else None


def command(since: datetime, until: datetime) -> list[str]:
    """Every user's allocations that were eligible or running in [since, until)."""
    window = ["-S", since.strftime("%Y-%m-%dT%H:%M:%S"), "-E", until.strftime("%Y-%m-%dT%H:%M:%S")]
    return ["sacct", "-a", "-X", "-P", "-n", *window, "-o", ",".join(FIELDS)]


def _time(value: str, field: str, job: str) -> datetime | None:
    if value in _UNSET:
        return None
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        raise ParseError(
            "slurm",
            "sacct",
            f"sacct printed {field}={value!r} for job {job}; unset SLURM_TIME_FORMAT (or set it to standard)",
        ) from None


def alloc_gpus(tres: str) -> dict[str, int]:
    """`billing=1,cpu=1,gres/gpu:l40s=1,gres/gpu=1,mem=500M` -> {"l40s": 1} (typed gpu items only)."""
    out: dict[str, int] = {}
    for item in tres.split(","):
        name, _, count = item.partition("=")
        if name.startswith("gres/gpu:") and count.isdigit():
            out[name[len("gres/gpu:") :]] = int(count)
    return out


def parse(text: str) -> list[JobRecord]:
    """`sacct -P -n -o FIELDS` lines -> records. AdminComment is last, so a `|` inside it stays in it."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", len(FIELDS) - 1)
        if len(parts) != len(FIELDS):
            raise ParseError(
                "slurm", "sacct", f"line has {len(parts)} fields, expected {len(FIELDS)}: {line[:200]!r}"
            )
        job_id, user, partition, state, submit, start, end, alloc, comment = parts
        submitted = _time(submit, "Submit", job_id)
        if submitted is None:
            raise ParseError("slurm", "sacct", f"no Submit time for job {job_id}")
        started = _time(start, "Start", job_id)
        jobs.append(
            JobRecord(
                job_id=job_id,
                user=user,
                partition=partition,
                state=state.split()[0] if state else state,  # `CANCELLED by 0`
                submit=submitted,
                start=started,
                end=_time(end, "End", job_id) if started else None,
                gpus=alloc_gpus(alloc),
                admin_comment=comment,
            )
        )
    return jobs


def jobs(since: datetime, until: datetime, timeout: float = 120.0) -> list[JobRecord]:
    return parse(proc.run(command(since, until), timeout=timeout))


# squeue: a queued (pending or running) job's id and admin comment, fixed width, the comment last
QUEUED = ["squeue", "-h", "-a", "-O", "JobID:32,admin_comment:4000"]


def with_queued_comments(jobs: list[JobRecord], timeout: float = 30.0) -> list[JobRecord]:
    """`jobs` with the admin comment of those not ended read from squeue: slurmdbd gets AdminComment
    only when a job ends (22.05, 24.11), so sacct prints it empty until then."""
    if all(j.end is not None or j.admin_comment for j in jobs):
        return jobs
    queued = {}
    for line in proc.run(QUEUED, timeout=timeout).splitlines():
        job_id, _, comment = line.strip().partition(" ")
        comment = comment.strip()
        if job_id and comment and comment != "(null)":
            queued[job_id] = comment
    return [
        replace(j, admin_comment=queued[j.job_id])
        if j.end is None and not j.admin_comment and j.job_id in queued
        else j
        for j in jobs
    ]


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config` / `sacctmgr show config` lines `Key   = value` -> {Key: value}."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def config(timeout: float = 30.0) -> dict[str, str]:
    return parse_config(proc.run(["scontrol", "show", "config"], timeout=timeout))


def dbd_config(timeout: float = 30.0) -> dict[str, str]:
    """slurmdbd's settings as sacctmgr reports them ({} when it cannot say)."""
    try:
        return parse_config(proc.run(["sacctmgr", "show", "config"], timeout=timeout))
    except ToolError:
        return {}


# `[2026-11-29T02:44:15.123] slurm_hetero: uid 1000: rejected [NODE_TOO_SMALL]: gpumem:2T: ...`
_REFUSAL = re.compile(
    r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?\] (?:\w+: )?"
    r"slurm_hetero: (.*?): rejected \[(\w{1,32})\]: (.*)$"  # the hook's codes are short words
)


@dataclass(frozen=True)
class Refusal:
    when: datetime
    where: str  # `uid 1000`, `uid 1000 edit of job 7`, with a het component
    reason: str  # the hook's reason code: request, constraint, partition, NODE_TOO_SMALL, ...
    message: str


def parse_refusals(lines: Iterable[str]) -> list[Refusal]:
    """The hook's refusal lines of a slurmctld log (other lines are skipped)."""
    out = []
    for line in lines:
        if m := _REFUSAL.match(line):
            when = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")
            out.append(Refusal(when, m.group(2), m.group(3), m.group(4)))
    return out


class LogTail:
    """slurmctld's log, line by line, from where the last `lines()` stopped; a rotated log (another
    inode, or shorter than what was read) from its start; a line without its newline waits."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file_id: tuple[int, int] | None = None
        self.offset = 0

    def _open(self) -> BinaryIO:
        try:  # O_NONBLOCK: a FIFO without a writer is refused, not waited on
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        except FileNotFoundError:
            raise HeteroError(f"{self.path}: no such slurmctld log") from None
        except OSError as e:
            raise HeteroError(f"{self.path}: cannot read slurmctld log: {e.strerror or e}") from None
        f = os.fdopen(fd, "rb")
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            f.close()
            raise HeteroError(f"{self.path}: slurmctld log is not a regular file; give the log file")
        return f

    def check(self) -> None:
        """Refuse an unreadable log in one line (before serving, not at every scrape)."""
        self._open().close()

    def lines(self) -> Iterator[str]:
        with self._open() as f:
            info = os.fstat(f.fileno())
            if (info.st_dev, info.st_ino) != self.file_id or info.st_size < self.offset:
                self.file_id, self.offset = (info.st_dev, info.st_ino), 0
            f.seek(self.offset)
            skipping = False  # inside a line longer than MAX_LOG_LINE
            while True:
                raw = f.readline(MAX_LOG_LINE)
                if not raw.endswith(b"\n") and len(raw) < MAX_LOG_LINE:
                    return  # the end, or a line still being written: read again next time
                self.offset += len(raw)
                if skipping or not raw.endswith(b"\n"):
                    skipping = not raw.endswith(b"\n")
                    continue
                yield raw.decode("utf-8", errors="replace").rstrip("\n")
