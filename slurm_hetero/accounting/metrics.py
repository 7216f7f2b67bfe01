"""Prometheus metrics of the mixed cluster by device type and vendor (`slurm-hetero metrics`).

The families (`slurm_hetero_*`, labelled `type` and `vendor`) are listed in docs/admin-guide.md
("Metrics"). Pure: text of `scontrol show node -d -o`, `squeue` and the log in, families out.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from slurm_hetero.accounting.report import gpumem_asked, rewrite_reason
from slurm_hetero.slurm.sacct import NOTE_PREFIX, parse_refusals
from slurm_hetero.slurm.scontrol import gpu_entries, is_our_reason, parse_fields

# per Slurm command: a scrape ends inside Prometheus' default timeout (10 s) even when slurmctld hangs
SLURM_TIMEOUT_S = 4.0
SCONTROL = ["scontrol", "show", "node", "-d", "-o"]
# squeue: one line per pending job, fixed-width fields; the admin comment (free text) is last
_PENDING_FIELDS = "JobID:24,tres-per-node:300,tres-per-job:300,tres-per-task:300,tres-per-socket:300"
SQUEUE = ["squeue", "-h", "-a", "-t", "PD", "-O", f"{_PENDING_FIELDS},admin_comment:2000"]
_UNAVAILABLE = {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING", "MAINT"}
_REWRITE = re.compile(r"\] (?:\w+: )?slurm_hetero: [^:]*(?: edit of job \d+)?[^:]*: (.+ -> .+)$")
_TYPED = re.compile(r"gres[:/]gpu:([^:=,]+)[:=](\d+)")
_UNTYPED = re.compile(r"gres[:/]gpu[:=](\d+)")


@dataclass
class Snapshot:
    """What one scrape found."""

    total: Counter[str] = field(default_factory=Counter)
    alloc: Counter[str] = field(default_factory=Counter)
    drained: Counter[tuple[str, str]] = field(default_factory=Counter)
    drained_nodes: dict[str, str] = field(default_factory=dict)
    pending: Counter[str] = field(default_factory=Counter)
    pending_gpumem_mib: Counter[str] = field(default_factory=Counter)
    decisions: Counter[tuple[str, str]] | None = None


def _word(line: str, key: str) -> str:
    """The value of a one-word field of an `scontrol -o` line ("" when absent)."""
    at = line.find(f" {key}=")
    if at < 0:
        return ""
    start = at + len(key) + 2
    end = line.find(" ", start)
    return line[start:] if end < 0 else line[start:end]


def read_nodes(text: str, snap: Snapshot) -> None:
    """`scontrol show node -d -o` lines into devices per type (one-word fields only: it is megabytes)."""
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        gres = gpu_entries(_word(line, "Gres"))
        if not gres:
            continue
        for gpu_type, n in gres:
            snap.total[gpu_type] += n
        for gpu_type, n in gpu_entries(_word(line, "GresUsed")):
            snap.alloc[gpu_type] += n
        words = set(_word(line, "State").rstrip("*").upper().split("+"))
        if words & _UNAVAILABLE:
            fields = parse_fields(line)
            reason = fields.get("Reason", "")
            ours = is_our_reason(reason)
            for gpu_type, n in gres:
                snap.drained[(gpu_type, "slurm-hetero" if ours else "other")] += n
            if ours:
                snap.drained_nodes[fields["NodeName"].split(" ")[0]] = reason.split(" [")[0]


def read_pending(text: str, snap: Snapshot) -> None:
    """Pending jobs by the gpu type they ask, and the gpumem the hook recorded for them."""
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        tres = ",".join(parts[1:5])
        comment = parts[5] if len(parts) > 5 else ""
        typed, untyped = _TYPED.search(tres), _UNTYPED.search(tres)
        gpu_type = typed[1] if typed else ""
        devices = int(typed[2]) if typed else int(untyped[1]) if untyped else 0
        snap.pending[gpu_type] += 1
        at = comment.rfind(NOTE_PREFIX)
        asked = gpumem_asked(comment[at + len(NOTE_PREFIX) :].strip() if at >= 0 else None)
        if asked is not None:
            snap.pending_gpumem_mib[gpu_type] += asked * max(devices, 1)


def count_decisions(lines: Iterable[str], found: Counter[tuple[str, str]]) -> None:
    """Add the hook's rewrites (by policy) and refusals (by code) of these log lines to `found`."""
    for line in lines:
        if "slurm_hetero: " not in line:
            continue
        for refusal in parse_refusals([line]):
            found[("refusal", refusal.reason)] += 1
        if " -> " in line and "rejected [" not in line and (m := _REWRITE.search(line)):
            found[("rewrite", rewrite_reason(m.group(1)) or "rewritten")] += 1


def up(ok: bool) -> GaugeMetricFamily:
    """`slurm_hetero_up`: whether the scrape could read Slurm (the exporters' `up`-style gauge)."""
    return GaugeMetricFamily("slurm_hetero_up", "Whether this scrape could read Slurm", value=1 if ok else 0)


def families(snap: Snapshot, vendors: Mapping[str, str]) -> Iterator[Metric]:
    """The metric families of one snapshot; `vendors`: gpu type -> vendor (from the inventory)."""

    def vendor(gpu_type: str) -> str:
        return vendors.get(gpu_type, "" if not gpu_type else "unknown")

    def by_type(name: str, doc: str, counts: Mapping[str, float], scale: float = 1) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=["type", "vendor"])
        for gpu_type, value in sorted(counts.items()):
            family.add_metric([gpu_type, vendor(gpu_type)], value * scale)
        return family

    types = sorted(set(snap.total) | set(vendors))
    yield by_type("slurm_hetero_gpus", "Devices Slurm has configured", {t: snap.total[t] for t in types})
    yield by_type("slurm_hetero_gpus_alloc", "Devices allocated to jobs", {t: snap.alloc[t] for t in types})
    drained = GaugeMetricFamily(
        "slurm_hetero_gpus_drained", "Devices on drained or down nodes", labels=["type", "vendor", "by"]
    )
    for (gpu_type, by), n in sorted(snap.drained.items()):
        drained.add_metric([gpu_type, vendor(gpu_type), by], n)
    yield drained
    info = GaugeMetricFamily(
        "slurm_hetero_node_drained_info", "Nodes drained by slurm-hetero health", labels=["node", "reason"]
    )
    for node, reason in sorted(snap.drained_nodes.items()):
        info.add_metric([node, reason], 1)
    yield info
    yield by_type("slurm_hetero_jobs_pending", "Pending jobs by the gpu type they ask", snap.pending)
    yield by_type(
        "slurm_hetero_jobs_pending_gpumem_bytes",
        "gpumem asked by pending jobs (per device x devices)",
        snap.pending_gpumem_mib,
        scale=1 << 20,
    )
    if snap.decisions is not None:
        decisions = CounterMetricFamily(
            "slurm_hetero_hook_decisions",
            "The job_submit hook's rewrites and refusals",
            labels=["action", "reason"],
        )
        for (action, reason), n in sorted(snap.decisions.items()):
            decisions.add_metric([action, reason], n)
        yield decisions
