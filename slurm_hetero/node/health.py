"""`slurm-hetero health`: this node's live devices against the inventory; drain on a fault.

Run by Slurm's HealthCheckProgram on every compute node (Python 3.9); only our own
`slurm-hetero:` drains are resumed. The faults: docs/admin-guide.md, "Health checks that drain".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from slurm_hetero.core.journal import audit
from slurm_hetero.core.model import Device, Health, NodeInventory
from slurm_hetero.slurm import scontrol
from slurm_hetero.slurm.scontrol import DRAIN_PREFIX, SlurmNodeRecord

logger = logging.getLogger(__name__)

MEMORY_TOLERANCE = 0.98  # a device showing less than this share of its inventory memory is a fault
REASON_LIMIT = 240  # Slurm keeps reasons short; the full list goes to the log


@dataclass(frozen=True)
class Fault:
    subject: str  # `nvidia 1 (/dev/nvidia1)`, or the vendor whose devices cannot be asked
    what: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.what}"


@dataclass(frozen=True)
class HealthReport:
    node: str
    faults: tuple[Fault, ...]
    actions: tuple[tuple[str, ...], ...] = ()  # scontrol argv run (or, with --dry-run, to run)
    notes: tuple[str, ...] = ()


def device_faults(expected: Device, found: Device | None) -> list[str]:
    """What is wrong with one device now, against its inventory record."""
    if found is None:
        return ["missing"]
    faults = []
    if found.health != Health.OK:
        faults.append(found.health_reason or "reported unhealthy")
    if expected.memory_mib and found.memory_mib and found.memory_mib < expected.memory_mib * MEMORY_TOLERANCE:
        faults.append(f"memory {found.memory_mib} MiB, inventory {expected.memory_mib} MiB")
    now = {(link.peer, link.kind): link.count for link in found.links}
    for link in expected.links:
        if (count := now.get((link.peer, link.kind), 0)) < link.count:
            faults.append(f"{link.kind} to {link.peer} {count}/{link.count} links")
    return faults


def compare(
    expected: NodeInventory, found: Sequence[Device], unasked: Mapping[str, str] | None = None
) -> list[Fault]:
    """Faults of the node's healthy devices; `unasked`: vendor -> why its devices could not be asked."""
    unasked = unasked or {}
    by_key = {(d.vendor, d.index): d for d in found}
    faults = [Fault(vendor, why) for vendor, why in sorted(unasked.items())]
    for device in expected.devices:
        if device.health != Health.OK or device.vendor in unasked:
            continue  # render left a known bad device out already
        for what in device_faults(device, by_key.get((device.vendor, device.index))):
            faults.append(Fault(f"{device.vendor} {device.index} ({device.file})", what))
    return faults


def drain_reason(faults: Sequence[Fault]) -> str:
    """The faults as one drain reason, cut to what Slurm keeps."""
    text = f"{DRAIN_PREFIX} " + "; ".join(str(f) for f in faults)
    text = text.replace("=", ":")  # scontrol reads `reason=` up to the end, but keep it plain
    text = text.encode("ascii", "backslashreplace").decode()  # a garbled tool's U+FFFD, escaped
    return text if len(text) <= REASON_LIMIT else text[: REASON_LIMIT - 3] + "..."


def act(
    node: str, faults: Sequence[Fault], record: SlurmNodeRecord | None, dry_run: bool, whole: bool = True
) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """Drain on faults, resume our own drain when healthy and `whole` (every vendor was checked)."""
    if record is None:
        return (), (f"node {node} is not known to Slurm: nothing drained or resumed",)
    if faults:
        reason = drain_reason(faults)
        if (
            record.reason
            and not record.drained_by_us
            and ("DRAIN" in record.states or "DOWN" in record.states)
        ):
            return (), (f"node {node} is already drained by an admin ({record.reason}); left as it is",)
        if record.drained_by_us and record.reason == reason:
            return (), ()
        return (tuple(scontrol.drain(node, reason, dry_run)),), ()
    if record.drained_by_us and not whole:
        return (), (f"node {node} stays drained ({record.reason}): only some of its vendors were checked",)
    if record.drained_by_us:
        return (tuple(scontrol.resume(node, dry_run)),), ()
    return (), ()


def check(
    node: str,
    expected: NodeInventory,
    found: Sequence[Device],
    record: Callable[[str], SlurmNodeRecord | None],
    dry_run: bool = False,
    unasked: Mapping[str, str] | None = None,
    whole: bool = True,
) -> HealthReport:
    """Compare, then drain or resume; `record` is read after the faults are logged, so a Slurm that
    cannot be asked fails with them said."""
    faults = compare(expected, found, unasked)
    journal = audit("slurm-hetero-health")
    for fault in faults:
        logger.warning("%s: %s", node, fault)
        journal.warning("node %s: %s", node, fault)
    actions, notes = act(node, faults, record(node), dry_run, whole)
    return HealthReport(node, tuple(faults), actions, notes)
