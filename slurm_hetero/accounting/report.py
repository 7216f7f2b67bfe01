"""What the mixed cluster did in a time window, by device type (`slurm-hetero report`). Pure: sacct
records, refusals and capacity in, a JSON document out; the figures: docs/admin-guide.md.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from pathlib import Path
from typing import Any

from slurm_hetero.core import hostlist
from slurm_hetero.core.errors import HeteroError, RequestError
from slurm_hetero.core.model import SlurmNode
from slurm_hetero.core.units import parse_size
from slurm_hetero.engine.score import ScoringOptions, TypeFacts, compile_model
from slurm_hetero.slurm.sacct import JobRecord, Refusal

GROUPINGS = ("type", "vendor", "partition", "user")
# `gpumem:20G -> gres:gpu:l40s:1 (best-fit) [vendor nvidia: ...]`, `... -> gres:shard:5 constraint l40s
# (best-fit, shares of l40s)`: the policy opens the first parentheses after the arrow
_POLICY = re.compile(r" -> [^(]*\(([^,()]*)")


def capacity(nodes: Sequence[SlurmNode]) -> Mapping[str, TypeFacts]:
    """Devices and memory per gpu type as the hook schedules them (healthy devices, every host)."""
    return compile_model(nodes, ScoringOptions()).types


def hours_inside(job: JobRecord, since: datetime, until: datetime, now: datetime) -> float:
    """Hours the job ran inside [since, until) (a running job runs until `now`)."""
    if job.start is None:
        return 0.0
    end = min(job.end or now, until)
    return max(0.0, (end - max(job.start, since)).total_seconds() / 3600)


def gpumem_asked(decision: str | None) -> int | None:
    """MiB per device of the gpumem request the hook recorded (`gpumem:20G,gpucore:50 -> ...`)."""
    if not decision or " -> " not in decision:
        return None
    request = decision.split(" -> ", 1)[0]
    for item in request.split(","):
        name, _, value = item.strip().partition(":")
        if name == "gpumem":
            try:
                return parse_size(value.split(":")[-1])
            except RequestError:
                return None
    return None


def rewrite_reason(decision: str | None) -> str | None:
    if not decision or " -> " not in decision:
        return None
    m = _POLICY.search(decision)
    return m.group(1).strip() if m else "rewritten"


@dataclass
class _Row:
    device_hours: float = 0.0
    jobs: int = 0
    waits: list[float] = field(default_factory=list)
    stranded_gib_hours: float = 0.0


def _key(job: JobRecord, gpu_type: str, by: str, caps: Mapping[str, TypeFacts]) -> tuple[str, ...]:
    if by == "type":
        return (gpu_type,)
    if by == "vendor":
        return (caps[gpu_type].vendor if gpu_type in caps else "?",)
    return (job.partition if by == "partition" else job.user, gpu_type)


def _row_doc(
    key: tuple[str, ...], row: _Row, by: str, caps: Mapping[str, TypeFacts], hours: float
) -> dict[str, Any]:
    types = [t for t, c in caps.items() if c.vendor == key[0]] if by == "vendor" else [key[-1]]
    devices = sum(caps[t].devices for t in types if t in caps)
    waits = row.waits
    doc: dict[str, Any] = {by: key[0]} if len(key) == 1 else {by: key[0], "type": key[1]}
    doc.update(
        devices=devices,
        device_hours=round(row.device_hours, 6),
        share=round(row.device_hours / (devices * hours), 6) if devices and hours else None,
        jobs=row.jobs,
        wait_mean_s=round(sum(waits) / len(waits), 1) if waits else None,
        wait_max_s=round(max(waits), 1) if waits else None,
        stranded_gib_hours=round(row.stranded_gib_hours, 6),
    )
    return doc


def off_type_jobs(jobs: Sequence[JobRecord]) -> list[dict[str, Any]]:
    """Per user: jobs on a single type other than the one most of the user's jobs ran on."""
    by_user: dict[str, Counter[str]] = {}
    for job in jobs:
        if len(job.gpus) == 1:
            by_user.setdefault(job.user, Counter())[next(iter(job.gpus))] += 1
    out = []
    for user, counts in sorted(by_user.items()):
        typical = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
        for gpu_type, n in sorted(counts.items()):
            if gpu_type != typical:
                out.append({"user": user, "typical": typical, "ran_on": gpu_type, "jobs": n})
    return out


def build(
    jobs: Sequence[JobRecord],
    refusals: Sequence[Refusal] | None,
    caps: Mapping[str, TypeFacts],
    since: datetime,
    until: datetime,
    now: datetime,
    by: str = "type",
) -> dict[str, Any]:
    """The report document. `refusals` None: slurmctld's log was not read."""
    if by not in GROUPINGS:
        raise HeteroError(f"--by {by}: choose one of {', '.join(GROUPINGS)}")
    hours = (until - since).total_seconds() / 3600
    rows: dict[tuple[str, ...], _Row] = {}
    if by in ("type", "vendor"):  # idle types and vendors get their (empty) row too
        rows.update({(t if by == "type" else c.vendor,): _Row() for t, c in caps.items()})
    inside = [j for j in jobs if j.submit < until and (j.end is None or j.end >= since)]
    for job in inside:
        asked = gpumem_asked(job.decision)
        ran = hours_inside(job, since, until, now)
        started_inside = job.start is not None and since <= job.start < until
        for gpu_type, count in job.gpus.items():
            row = rows.setdefault(_key(job, gpu_type, by, caps), _Row())
            row.jobs += 1
            row.device_hours += count * ran
            if started_inside and job.start is not None:
                row.waits.append((job.start - job.submit).total_seconds())
            if asked is not None and gpu_type in caps:
                spare = max(0, caps[gpu_type].memory_mib - asked)
                row.stranded_gib_hours += spare / 1024 * count * ran
    submitted = [j for j in inside if since <= j.submit < until]
    rewrites = Counter(r for r in (rewrite_reason(j.decision) for j in submitted) if r)
    refused = [r for r in refusals or [] if since <= r.when < until]
    return {
        "since": since.isoformat(timespec="seconds"),
        "until": until.isoformat(timespec="seconds"),
        "hours": hours,
        "by": by,
        "jobs": len(inside),
        "gpu_jobs": sum(1 for j in inside if j.gpus),
        "rows": [_row_doc(key, row, by, caps, hours) for key, row in sorted(rows.items())],
        "capacity": {
            t: {"vendor": c.vendor, "devices": c.devices, "memory_mib": c.memory_mib} for t, c in caps.items()
        },
        "rewrites": dict(sorted(rewrites.items())),
        "refusals": None if refusals is None else dict(sorted(Counter(r.reason for r in refused).items())),
        "off_type": off_type_jobs([j for j in inside if j.start is not None]),
    }


def disagreement(source: Path | str, nodes: Iterable[SlurmNode], slurm: Mapping[str, Any]) -> str | None:
    """Where the inventory (`source`) and Slurm's nodes (host -> NodeGres) differ, in one line, or None."""
    ours: dict[str, Counter[str]] = {}
    for node in nodes:
        per_type = Counter(d.type for d in node.devices)
        if not per_type:  # no healthy device: Slurm has the node without gpus (gres render)
            continue
        for host in hostlist.expand(node.name) if node.hosts > 1 else [node.name]:
            ours[host] = per_type
    theirs = {name: Counter({t: n for t, n in g.gpus}) for name, g in slurm.items() if g.gpus}

    def text(counts: Counter[str] | None) -> str:
        return ",".join(f"gpu:{t}:{n}" for t, n in sorted(counts.items())) if counts else "nothing"

    differ = [
        f"{host}: inventory {text(ours.get(host))}, Slurm {text(theirs.get(host))}"
        for host in sorted(set(ours) | set(theirs))
        if ours.get(host) != theirs.get(host)
    ]
    if not differ:
        return None
    more = f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
    return (
        f"{source} disagrees with Slurm's nodes: {differ[0]}{more}; pass the inventory the "
        "cluster was rendered from, or re-render (gres render) and reconfigure"
    )


def render_text(doc: Mapping[str, Any], table: Any) -> str:
    """The document as terminal tables (`table(rows, columns)` aligns them)."""
    by = doc["by"]
    key_cols = [(by.upper(), lambda r: r[by])] + (
        [("TYPE", lambda r: r["type"])] if by in ("partition", "user") else []
    )
    num = [
        ("DEVICES", "devices", 0),
        ("DEVICE_H", "device_hours", 2),
        ("SHARE_%", "share", -1),
        ("JOBS", "jobs", 0),
        ("WAIT_MEAN_S", "wait_mean_s", 0),
        ("WAIT_MAX_S", "wait_max_s", 0),
        ("STRANDED_GIB_H", "stranded_gib_hours", 2),
    ]
    columns = [(h, get, str, False) for h, get in key_cols] + [
        (h, itemgetter(k), _fmt(digits), True) for h, k, digits in num
    ]
    parts = [
        f"{doc['since']} .. {doc['until']} ({doc['hours']:g} h): "
        f"{doc['jobs']} jobs, {doc['gpu_jobs']} on gpus",
        table(doc["rows"], columns),
    ]
    if doc["rewrites"]:
        parts.append("rewrites by the hook: " + ", ".join(f"{k} {v}" for k, v in doc["rewrites"].items()))
    if doc["refusals"] is not None:
        refused = ", ".join(f"{k} {v}" for k, v in doc["refusals"].items()) or "none"
        parts.append(f"refusals by the hook: {refused}")
    for row in doc["off_type"]:
        parts.append(
            f"off-type: {row['user']} usually runs on {row['typical']}; "
            f"{row['jobs']} job(s) on {row['ran_on']}"
        )
    return "\n".join(parts)


def _fmt(digits: int) -> Any:
    def fmt(value: Any) -> str:
        if value is None:
            return "-"
        if digits < 0:
            return f"{100 * value:.1f}"
        return f"{value:.{digits}f}"

    return fmt
