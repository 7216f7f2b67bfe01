"""What `slurm-hetero sbatch` submits: the job's own request merged with the memory the fit engine
says a model needs (docs/user-guide.md has the merge rules), then checked by the job_submit hook
itself (`hook_check`) on the job_desc the release's sbatch sends. Pure. The wrapper's own type
checks cover what the hook leaves alone (a named type without gpumem).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from slurm_hetero.core.errors import RequestError, SbatchPlanError
from slurm_hetero.core.units import format_size
from slurm_hetero.engine.score import ClusterModel, TypeFacts
from slurm_hetero.slurm import syntax
from slurm_hetero.slurm.sbatchargs import Option, component_group, values
from slurm_hetero.submit import Job
from slurm_hetero.submit.hook import Hook, Outcome, Request
from slurm_hetero.submit.sbatch import (
    MEMORY_EXCLUSIVE,
    gres_names,
    het_mem_refusal,
    het_sent,
    job_from_options,
    node_range,
    task_count,
    texts_of,
)

MIB = 2**20
GIB = 2**30
Estimate = Callable[[int], "float | None"]  # devices -> bytes per device (None: no layout)


# ------------------------------------------------------------------------------- the cluster
def by_memory(types: Mapping[str, TypeFacts]) -> list[TypeFacts]:
    """The types, largest memory first (ties: name order)."""
    return sorted(types.values(), key=lambda f: (-f.memory_mib, f.name))


def largest(types: Mapping[str, TypeFacts]) -> str:
    if not types:
        return "the cluster has no GPUs"
    best = by_memory(types)[0]
    return f"largest device: {format_size(best.memory_mib)} on {best.name}"


# ---------------------------------------------------------------------------- the job's request
@dataclass(frozen=True)
class Component:
    """One het component as sbatch will send it: its options' last values and our request."""

    index: int
    options: Mapping[str, str | None]
    request: Request
    nodes: int
    tasks: int
    het: bool = False  # one of several components (sbatch A : B, #SBATCH hetjob)
    unread: RequestError | None = None  # why the hook cannot read the request (`request` is empty)

    @property
    def asks_devices(self) -> bool:
        return self.request.gpu_count is not None or self.request.asks

    @property
    def devices(self) -> int:
        """Devices of the whole component (Slurm's default: one per node when none is counted)."""
        count, scope = self.request.count, self.request.gpu_field
        if scope == "tres_per_job":
            return count
        return count * (self.tasks if scope == "tres_per_task" else self.nodes)

    @property
    def per_node(self) -> int:
        return math.ceil(self.devices / self.nodes)

    def named(self) -> str:
        return f"het component {self.index}" if self.het else "the job"


def _gpu_item(value: str | None) -> str | None:
    return f"gpu:{value}" if value else None


def component(index: int, options: Sequence[Option], hook: Hook, het: bool = False) -> Component:
    """A component's request from its options, read by the hook itself (`Hook.request`)."""
    v = values(options)
    fields = [
        ("tres_per_node", v.get("gres")),
        ("tres_per_job", _gpu_item(v.get("gpus"))),
        ("tres_per_node", _gpu_item(v.get("gpus-per-node"))),
        ("tres_per_task", _gpu_item(v.get("gpus-per-task"))),
    ]
    try:
        request, unread = hook.request(fields), None
    except RequestError as e:  # `plan_model` raises it; the hook, where it reads gpumem/gpucore
        request, unread = hook.request(()), RequestError(syntax.comment(e.text), e.reason)
    release = hook.release
    nodes = _least(lambda text: node_range(text, release)[0], v.get("nodes"))
    per_node = _least(lambda text: task_count("--ntasks-per-node", text, release), v.get("ntasks-per-node"))
    tasks = _least(lambda text: task_count("--ntasks", text, release), v.get("ntasks"), nodes * per_node)
    return Component(index, v, request, nodes, tasks, het, unread)


def _least(read: Callable[[str], int], text: str | None, default: int = 1) -> int:
    """A count as sbatch reads it, at least 1; `default` where not given or refused."""
    try:
        return default if text is None else max(1, read(text))
    except RequestError:
        return default


# ---------------------------------------------------------------------------------- decisions
@dataclass(frozen=True)
class Decision:
    """What one component gets: the gres to submit (None: unchanged) and the figures behind it."""

    index: int
    devices: int
    gres: str | None = None
    need_bytes: float | None = None
    note: str = ""
    hint: str = ""  # with a model: what would fit, for a refusal
    hook: Outcome | None = None  # the job_submit hook's decision (`hook_check`; None: not checked)


@dataclass(frozen=True)
class Suggestion:
    """How to ask for what fits: label (e.g. "with --zero 3") and a per-device estimate."""

    label: str
    estimate: Estimate


def would_fit(types: Mapping[str, TypeFacts], suggestions: Sequence[Suggestion], limit: int = 3) -> str:
    """`would fit: --gpus=a100_80g:2 (...)`, the fewest devices per type first, or what is largest."""
    for s in suggestions:
        found = []
        for facts in types.values():
            for count in range(1, facts.devices + 1):
                need = s.estimate(count)
                if need is not None and need <= facts.memory_mib * MIB:
                    found.append((count, -facts.memory_mib, facts, need))
                    break
        if found:
            found.sort(key=lambda f: (f[0], f[1], f[2].name))
            text = "; ".join(
                f"--gpus={f.name}:{n} ({need / GIB:.1f} GiB of {format_size(f.memory_mib)} each)"
                for n, _, f, need in found[:limit]
            )
            return f"would fit{' ' + s.label if s.label else ''}: {text}"
    return f"no device type of the cluster holds it at any count ({largest(types)})"


def _check_type(c: Component, types: Mapping[str, TypeFacts]) -> TypeFacts:
    gpu_type = c.request.gpu_type or ""
    facts = types.get(gpu_type)
    if facts is None:
        known = ", ".join(f.name for f in by_memory(types)) or "none"
        raise SbatchPlanError(
            f"{c.named()} asks for gpu type {gpu_type!r}, which the cluster lacks (types: {known})"
        )
    # without -N, Slurm may spread a job's or its tasks' devices over as many nodes as they need
    spread = c.options.get("nodes") is None and c.request.gpu_field != "tres_per_node"
    least = (1 if c.request.gpu_field == "tres_per_job" else c.request.count) if spread else c.per_node
    hosts = sum(s.nodes for s in facts.shapes if s.count >= least)
    if hosts < (1 if spread else c.nodes) or facts.devices < c.devices:
        where = "" if spread else f" on {c.nodes} node(s)"
        all_hosts, widest = sum(s.nodes for s in facts.shapes), max(s.count for s in facts.shapes)
        raise SbatchPlanError(
            f"{c.named()} asks for {c.devices} x {gpu_type}{where}; the cluster has {facts.devices} on "
            f"{all_hosts} host(s), at most {widest} per host"
        )
    return facts


def check_gpumem(c: Component, types: Mapping[str, TypeFacts]) -> Decision:
    """A component without a model: a type it names without gpumem/gpucore (the hook's to decide)
    must exist and hold its devices."""
    if c.request.gpu_type is not None and not c.request.asks:
        _check_type(c, types)
    return undecided(c)


def undecided(c: Component) -> Decision:
    """The component's request as given: its devices, nothing to change."""
    return Decision(c.index, c.devices if c.asks_devices else 0)


def plan_model(
    components: Sequence[Component],
    types: Mapping[str, TypeFacts],
    model: str,
    suggestions: Sequence[Suggestion],
    layout: str = "",
) -> list[Decision]:
    """Size every device-asking component (else component 0) for the model spread over all their
    devices: keep named types, add gpumem to the rest. `layout`: the user's degrees, for the error."""
    for c in components:
        if c.unread is not None:  # a request the model cannot be sized against
            raise c.unread
    asking = [c for c in components if c.asks_devices] or [components[0]]
    for c in asking:
        if c.request.gpumem_mib is not None:
            raise SbatchPlanError(
                f"{c.named()} already asks for gpumem:{format_size(c.request.gpumem_mib)}; "
                "drop it or drop --model"
            )
    devices = sum(c.devices for c in asking)
    need = suggestions[0].estimate(devices)
    if need is None:
        given = f" with {layout}" if layout else " with these options"
        raise SbatchPlanError(
            f"{devices} device(s) are no layout for {model}{given} (tp x pp must divide the device count)"
        )
    need_mib = math.ceil(need / MIB)
    hint = would_fit(types, suggestions)
    out = {c.index: Decision(c.index, 0) for c in components}
    for c in asking:
        what = f"{model} needs {need / GIB:.1f} GiB per device on {devices} device(s)"
        if c.request.gpu_type is not None:
            facts = _check_type(c, types)
            if need_mib > facts.memory_mib:
                raise SbatchPlanError(
                    f"{c.named()}: {what}; {c.request.gpu_type} has {format_size(facts.memory_mib)}; {hint}"
                )
            out[c.index] = Decision(c.index, c.devices, None, need, f"{what}: {c.request.gpu_type} holds it")
            continue
        item = f"gpumem:{format_size(need_mib)}"
        gres = ",".join(filter(None, [c.options.get("gres"), item]))
        out[c.index] = Decision(c.index, c.devices, gres, need, f"{what} -> --gres={gres}", hint)
    return [out[c.index] for c in components]


# ------------------------------------------------------------------------------ the hook's check
def sent_jobs(
    components: Sequence[Component], gres: Sequence[str | None], model: ClusterModel, hook: Hook, release: str
) -> list[Job] | None:
    """Each component's job_desc as the release's sbatch sends it; None where sbatch refuses a
    component the hook leaves alone (sbatch speaks for itself), SbatchPlanError with sbatch's words
    where it refuses one with gpumem/gpucore."""
    texts = [texts_of({**c.options, "gres": g}) for c, g in zip(components, gres)]
    carried, names = het_mem_refusal(texts), gres_names(model)
    jobs: list[Job] = []
    for k, (c, g, sent) in enumerate(zip(components, gres, het_sent(texts, release))):
        try:
            if k == carried:
                raise RequestError("sbatch", MEMORY_EXCLUSIVE)
            jobs.append(job_from_options(**sent, uid=None, slurm_release=release, names=names))  # not exempt
        except RequestError as e:
            if not hook.asks_us(g):
                return None
            raise SbatchPlanError(f"{c.named()}: {syntax.comment(e)}") from None
    return jobs


def hook_check(
    components: Sequence[Component], decisions: Sequence[Decision], jobs: Sequence[Job], hook: Hook
) -> list[Decision]:
    """The decisions with the job_submit hook's own (`Decision.hook`), or SbatchPlanError where it
    refuses a component; `jobs` go through the hook in order, as slurmctld's do."""
    out: list[Decision] = []
    for k, (c, d, job) in enumerate(zip(components, decisions, jobs)):
        outcome = hook.submit(job, k if len(jobs) > 1 else None)
        out.append(replace(d, hook=outcome))
        if outcome.ok:
            continue
        message = syntax.comment(outcome.message, 2000)
        if d.gres is None:
            raise SbatchPlanError(f"{c.named()}: {message}", out)
        raise SbatchPlanError(f"{c.named()}: {d.note}: {message}; {d.hint}", out)
    return out


# ------------------------------------------------------------------------------ the command line
def merged_argv(
    groups: Sequence[Sequence[Option]],
    decisions: Sequence[Decision],
    script: Sequence[str],
) -> list[str]:
    """sbatch's argv: the user's options with each changed component's `--gres` replaced, then the
    script; one group per component once a het job's gres changes."""
    changed = {d.index: d.gres for d in decisions if d.gres is not None}
    if not changed:
        words = [w for g in groups for w in (*(x for o in g for x in o.written), ":")][:-1]
        return ["sbatch", *words, *script]
    per_component = len(decisions) > 1 or len(groups) > 1
    out: list[str] = ["sbatch"]
    for k, d in enumerate(decisions if per_component else decisions[:1]):
        if k:
            out.append(":")
        kept = [o for o in component_group(groups, k) if o.name != "gres" or d.index not in changed]
        out += [w for o in kept for w in o.written]
        if d.index in changed:
            out.append(f"--gres={changed[d.index]}")
    return [*out, *script]
