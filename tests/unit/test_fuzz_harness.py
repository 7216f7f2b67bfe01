"""The real-Slurm fuzz's own bookkeeping (scripts/devcluster/fuzz.py), against a scripted sbatch."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from scripts.devcluster import fuzz
from slurm_hetero.submit import Job, Outcome

UNKNOWN_FEATURE = {"constraint": "(amd|nosuch)&lab_big"}
REWRITTEN = {"gres": "gpumem:60G", "ntasks": "2"}


def _outcome(options: dict[str, str]) -> Outcome:
    action = "rewrite" if "gres" in options else "untouched"
    return Outcome(True, action, "rewritten" if action == "rewrite" else "", Job())


def _harness(monkeypatch: pytest.MonkeyPatch, refuses: Any) -> tuple[fuzz.Fuzz, list[list[str]]]:
    """A Fuzz whose sbatch refuses the argv for which `refuses(argv)` is true."""
    calls: list[list[str]] = []

    def run(argv: list[str], user: str | None = None) -> subprocess.CompletedProcess:
        calls.append(argv)
        if argv[0] == "sbatch" and refuses(argv):
            return subprocess.CompletedProcess(argv, 1, "", "sbatch: error: Invalid feature specification")
        return subprocess.CompletedProcess(argv, 0, "42\n", "rewritten")

    monkeypatch.setattr(
        fuzz, "predict", lambda model, hook, options, uid, release, taken=None: _outcome(options)
    )
    return fuzz.Fuzz(run, None, None, "22.05", "nobody", 65534), calls  # type: ignore[arg-type]


def test_a_het_job_refused_for_its_untouched_components_feature_is_slurmctlds_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """22.05 seed 7: component 0 (untouched by the hook) names a feature no node has; slurmctld
    refuses the whole het job. That is not the hook's mismatch: the component alone is refused too."""
    harness, calls = _harness(monkeypatch, lambda argv: any("nosuch" in a for a in argv))
    assert harness.submit(fuzz.Request([UNKNOWN_FEATURE, REWRITTEN])) is None
    assert harness.report.mismatches == []
    assert harness.report.counts["refused by slurmctld (untouched)"] == 1
    assert ":" not in calls[1] and any("nosuch" in a for a in calls[1])  # the component, on its own


def test_a_het_job_refused_although_its_untouched_component_alone_is_accepted_is_a_mismatch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness, calls = _harness(monkeypatch, lambda argv: ":" in argv)
    assert harness.submit(fuzz.Request([UNKNOWN_FEATURE, REWRITTEN])) is None
    assert [m[0] for m in harness.report.mismatches] == ["refused but predicted accept"]
    assert ["scancel", "42"] in calls  # the probe job does not stay queued
