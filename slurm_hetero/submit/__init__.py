"""What the job_submit hook does with a job, in Python. Pure.

`explain` is the reference that `job_submit/job_submit.lua` repeats over the generated table
(`slurm_hetero.submit.tables`); `request explain` prints it, and the tests run both on the same
jobs and require the same answer. One job component at a time: Slurm calls the hook once per
heterogeneous job component.

The steps, for a job whose TRES fields carry a gpumem or gpucore item (others are untouched):

1. Exempt submitters (by uid) are left alone.
2. The items of `tres_per_node`, `tres_per_job`, `tres_per_task`, `tres_per_socket` are checked
   in that order (`slurm_hetero.units`); the first bad one rejects the job.
3. `engine.score.decide` picks the device type (or the adequate types, or shards).
4. The new item replaces the request: `gres:gpu:TYPE:N`, `gres:gpu:N` (any-fit) or
   `gres:shard:S`, in the form the request came in (24.11: `gres/gpu:TYPE:N`; `gres/gpu:TYPE=N`
   for a request written with `=`). It goes first into
   `tres_per_node`, or into `tres_per_task`/`tres_per_socket` when the count came from there.
   The old gpu item and, unless sharing, the gpumem/gpucore items are removed from every field.
5. any-fit and shards add their types to the job's constraint (`FEATURES&(a|b)`); the decision
   goes to the admin comment and the message to the user and slurmctld's log.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from slurm_hetero.engine.reasons import FitReport, render
from slurm_hetero.engine.score import Choice, ClusterModel, Need, decide
from slurm_hetero.errors import RequestError
from slurm_hetero.units import COLON, SLASH, SLASH_COLON, Request, has_ours, parse_fields, split_items

FIELDS = ("tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket")
IN_PLACE = ("tres_per_task", "tres_per_socket")  # counts from these stay there
NOTE_PREFIX = "slurm_hetero: "
_FEATURE = re.compile(r"[A-Za-z0-9_.\-]+")
_ITEM_FORMS = {  # (kind, form) -> new item; kinds as in engine.score.Choice
    ("gpu", COLON): "gres:gpu:%s:%s",
    ("gpu", SLASH_COLON): "gres/gpu:%s:%s",
    ("gpu", SLASH): "gres/gpu:%s=%s",
    ("any", COLON): "gres:gpu:%s",
    ("any", SLASH_COLON): "gres/gpu:%s",
    ("any", SLASH): "gres/gpu=%s",
    ("shard", COLON): "gres:shard:%s",
    ("shard", SLASH_COLON): "gres/shard:%s",
    ("shard", SLASH): "gres/shard=%s",
}


@dataclass(frozen=True)
class Job:
    """The job_desc fields the hook reads and writes (None: unset)."""

    tres_per_node: str | None = None
    tres_per_job: str | None = None
    tres_per_task: str | None = None
    tres_per_socket: str | None = None
    partition: str | None = None
    features: str | None = None
    admin_comment: str | None = None
    submit_uid: int | None = None
    user_id: int | None = None

    def fields(self) -> list[tuple[str, str | None]]:
        return [(name, getattr(self, name)) for name in FIELDS]


@dataclass(frozen=True)
class HookOptions:
    exempt_uids: frozenset[int] = frozenset({0})
    fail_policy: str = "open"


@dataclass(frozen=True)
class Outcome:
    """What the hook does: `ok` (accept) or reject, why, and the job as Slurm then stores it."""

    ok: bool
    action: str  # untouched | exempt | rewrite | reject
    message: str  # user message ('' when untouched or exempt)
    job: Job
    choice: Choice | None = None
    report: FitReport | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok, "action": self.action, "message": self.message}
        # a rejected job is not written: no new field values to show
        out |= {
            name: getattr(self.job, name) if self.ok else None
            for name in (*FIELDS, "features", "admin_comment")
        }
        choice = self.choice
        out["choice"] = (
            None
            if choice is None
            else {
                "kind": choice.kind,
                "types": list(choice.types),
                "count": choice.count,
                "policy": choice.policy,
                "mode": choice.mode,
                "constraint": list(choice.constraint),
            }
        )
        out["report"] = None if self.report is None else self.report.as_dict()
        return out


def constraint_features(features: str | None) -> frozenset[str] | None:
    """Features a plain `a&b` constraint requires (empty when none); None for anything else
    (`|`, brackets, counts), which the hook does not filter on and never extends."""
    if not features:
        return frozenset()
    names = features.split("&")
    return frozenset(names) if all(_FEATURE.fullmatch(n) for n in names) else None


def need_of(request: Request, job: Job) -> Need:
    return Need(
        request.text,
        request.gpumem_mib,
        request.gpucore,
        request.count,
        request.gpu_type,
        request.gpu_count is not None,
        job.partition,
        constraint_features(job.features),
        request.memory_items,
    )


def new_item(choice: Choice, form: str) -> str:
    """The TRES item that replaces the request."""
    args = (choice.types[0], choice.count) if choice.kind == "gpu" else (choice.count,)
    return _ITEM_FORMS[(choice.kind, form)] % args


def _kept(text: str | None, keep_ours: bool) -> list[str]:
    """A field's items without the gpu item, (unless `keep_ours`) the gpumem/gpucore items, and empty
    items (24.11 hands `--gres=gpumem:20G,,` over as `gres/gpumem:20G,gres/,gres/`)."""
    dropped = lambda i: i.name == "gpu" or (i.ours and not keep_ours) or i.body == ""  # noqa: E731
    return [i.text for i in split_items(text) if not dropped(i)]


def rewrite_fields(job: Job, request: Request, choice: Choice, item: str) -> dict[str, str | None]:
    """New values of the four TRES fields."""
    target = request.gpu_field if request.gpu_field in IN_PLACE else "tres_per_node"
    out = {}
    for name, text in job.fields():
        items = _kept(text, choice.kind == "shard")
        items = [item, *items] if name == target else items
        out[name] = ",".join(items) or (text if not text else None)  # '' stays '', emptied -> unset
    return out


def with_constraint(features: str | None, constraint: Sequence[str]) -> str | None:
    """The job's constraint AND one of `constraint` (unchanged when that is empty)."""
    if not constraint:
        return features
    either = "|".join(constraint)
    if not features:
        return either
    return f"{features}&{either}" if len(constraint) == 1 else f"{features}&({either})"


def note(request: Request, choice: Choice, item: str) -> str:
    """The decision in one line, for the user, slurmctld's log and the admin comment."""
    if choice.kind == "any":
        return render("rewrite_any", request.text, item, "|".join(choice.constraint), choice.policy)
    if choice.kind == "shard":
        feature, gpu_type = choice.constraint[0], choice.types[0]
        return render("rewrite_shard", request.text, item, feature, choice.policy, gpu_type)
    return render("rewrite", request.text, item, choice.policy)


def _rewritten(job: Job, request: Request, choice: Choice) -> Outcome:
    item = new_item(choice, request.form)
    message = note(request, choice, item)
    comment = NOTE_PREFIX + message
    changes: dict[str, Any] = {
        **rewrite_fields(job, request, choice, item),
        "features": with_constraint(job.features, choice.constraint),
        "admin_comment": f"{job.admin_comment}; {comment}" if job.admin_comment else comment,
    }
    return Outcome(True, "rewrite", message, replace(job, **changes), choice=choice)


def is_exempt(job: Job, options: HookOptions) -> bool:
    return any(uid is not None and uid in options.exempt_uids for uid in (job.submit_uid, job.user_id))


def explain(model: ClusterModel, options: HookOptions, job: Job) -> Outcome:
    """What the hook does with one job (component)."""
    if is_exempt(job, options):
        return Outcome(True, "exempt", "", job)
    if not has_ours(job.fields()):
        return Outcome(True, "untouched", "", job)
    try:
        request = parse_fields(job.fields(), model.types)
    except RequestError as e:
        return Outcome(False, "reject", str(e), job)
    result = decide(model, need_of(request, job))
    if isinstance(result, FitReport):
        return Outcome(False, "reject", result.message, job, report=result)
    return _rewritten(job, request, result)


# ------------------------------------------------------------------------- command-line requests


# The prefix each release's sbatch puts on TRES items (measured on 22.05 and 24.11).
RELEASE_PREFIX = {"22.05": "gres:", "24.11": "gres/"}


def _gres_items(spec: str, prefix: str) -> list[str]:
    """`--gres=gpu:a100:1,gpumem:90G` as sbatch stores it: `gres:gpu:a100:1,gres:gpumem:90G`."""
    return [s if s.startswith(("gres:", "gres/")) else f"{prefix}{s}" for s in spec.split(",")]


def job_from_options(
    gres: str | None = None,
    gpus: str | None = None,
    gpus_per_node: str | None = None,
    gpus_per_task: str | None = None,
    partition: str | None = None,
    constraint: str | None = None,
    uid: int | None = None,
    slurm_release: str = "22.05",
) -> Job:
    """The job_desc that sbatch of `slurm_release` (22.05 or 24.11) would send for these options."""
    if slurm_release not in RELEASE_PREFIX:
        raise ValueError(f"unknown Slurm release {slurm_release}; known: {', '.join(RELEASE_PREFIX)}")
    pre = RELEASE_PREFIX[slurm_release]
    per_node = (_gres_items(gres, pre) if gres else []) + (
        [f"{pre}gpu:{gpus_per_node}"] if gpus_per_node else []
    )
    return Job(
        tres_per_node=",".join(per_node) or None,
        tres_per_job=f"{pre}gpu:{gpus}" if gpus else None,
        tres_per_task=f"{pre}gpu:{gpus_per_task}" if gpus_per_task else None,
        partition=partition,
        features=constraint,
        submit_uid=uid,
        user_id=uid,
    )
