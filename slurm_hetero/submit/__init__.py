"""What the job_submit hook does with a job, in Python. Pure.

`explain` is the reference that `job_submit/job_submit.lua` repeats over the generated table
(`slurm_hetero.submit.tables`); `request explain` prints it, and the tests run both on the same
jobs and require the same answer. One job component at a time: Slurm calls the hook once per
heterogeneous job component, in order; components never share a node, so a later component is
decided on the nodes its earlier ones leave (`taken`, `het_taken`).

The steps, for a job whose TRES fields carry a gpumem or gpucore item (others are untouched):

1. Exempt submitters (by uid) are left alone.
2. The items of `tres_per_node`, `tres_per_job`, `tres_per_task`, `tres_per_socket` are checked
   in that order (`slurm_hetero.units`); the first bad one rejects the job.
3. `engine.score.decide` picks the device type (or the adequate types, or shards).
4. The new item replaces the request: `gres:gpu:TYPE:N`, `gres:gpu:N` (any-fit) or
   `gres:shard:S`, in the form the request came in (24.11: `gres/gpu:TYPE:N`; `gres/gpu:TYPE=N`
   for a request written with `=`). It goes first into the field the count came from
   (`tres_per_job` for `--gpus`, per task, per socket, per node), else into `tres_per_node`.
   The type must hold the whole job: `min_nodes` (or `num_tasks` / `ntasks_per_node`) nodes, each
   with the devices, CPUs and memory one node needs (see `devices_per_node`, `node_needs`); that
   node count goes into an unset `min_nodes` / `max_nodes` (`pinned_nodes`). gpumem/gpucore with
   -w is refused: the hook picks a type, not nodes; the hosts -x names are not counted
   (`excluded`).
   The old gpu item and, unless sharing, the gpumem/gpucore items are removed from every field.
5. any-fit and shards add their types to the job's constraint (`FEATURES&(a|b)`); the decision
   goes to the admin comment and the message to the user and slurmctld's log.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from slurm_hetero import hostlist
from slurm_hetero.engine import constraint
from slurm_hetero.engine.reasons import CODE_ORDER, FitReport, ReasonCode, clipped, one_line, render
from slurm_hetero.engine.score import Choice, ClusterModel, Need, ceil_div, decide, holds, nodes_with
from slurm_hetero.errors import InventoryError, RequestError
from slurm_hetero.slurm.syntax import MAX_HOSTLIST, split_top
from slurm_hetero.units import COLON, SLASH, SLASH_COLON, Request, has_ours, parse_fields, split_items

FIELDS = ("tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket")
IN_PLACE = ("tres_per_job", "tres_per_task", "tres_per_socket")  # counts from these keep their scope
UNSET = 65534  # Slurm's NO_VAL16; NO_VAL (32-bit) and INFINITE are larger: any count >= it is unset
NO_VAL = 4294967294  # memory (MiB) at or above it is unset (NO_VAL, NO_VAL64, INFINITE64)
NOTE_PREFIX = "slurm_hetero: "
# The Slurm error a rejection returns (the client prints its text on its last line), by what was
# wrong: the request grammar, the --constraint grammar, or the furthest check that the best type
# failed (reason codes in check order). The hook returns `slurm[NAME]` where the release exports
# NAME (24.11 exports every ESLURM_*; 22.05 only a few, ESLURM_INVALID_NODE_COUNT among ours), else
# slurm.ERROR ("Unspecified error").
# The numbers of the errors a rejection returns (slurm/slurm_errno.h; the same in every release
# since 2.x): where the release's Lua API does not export the name (22.05 has no
# ESLURM_INVALID_GRES), the hook returns the number, which slurmctld hands to the client alike.
SLURM_ERRNO = {
    "ESLURM_INVALID_PARTITION_NAME": 2000,
    "ESLURM_INVALID_NODE_COUNT": 2006,
    "ESLURM_INVALID_NODE_NAME": 2018,
    "ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE": 2014,
    "ESLURM_INVALID_FEATURE": 2029,
    "ESLURM_INVALID_GRES": 2072,
}
REQUEST_CODE = "ESLURM_INVALID_GRES"
CONSTRAINT_CODE = "ESLURM_INVALID_FEATURE"
PARTITION_CODE = "ESLURM_INVALID_PARTITION_NAME"  # slurmctld's own error for such a job
NODE_NAME_CODE = "ESLURM_INVALID_NODE_NAME"  # slurmctld's own error for an -x it cannot read
REASON_CODES: dict[ReasonCode, str] = {
    ReasonCode.TYPE_EXCLUDED: "ESLURM_INVALID_GRES",
    ReasonCode.MISSING_FEATURE: "ESLURM_INVALID_FEATURE",
    ReasonCode.INSUFFICIENT_MEMORY: "ESLURM_INVALID_GRES",
    ReasonCode.TOO_FEW_DEVICES: "ESLURM_INVALID_GRES",
    ReasonCode.NODE_TOO_SMALL: "ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE",
    ReasonCode.TOO_FEW_NODES: "ESLURM_INVALID_NODE_COUNT",
}
_FEATURE = re.compile(r"[A-Za-z0-9_.\-]+")
# hosts one -x may name: the hook expands it for each job while slurmctld holds its job lock
MAX_EXCLUDED = 4_096  # at most ~6 ms of Lua 5.1 (lupa) for 4,096 names; 16,384 took 23 ms
# characters of an -x the hook reads: names, ranges, and Slurm's separators (comma, space, tab,
# newline outside brackets; measured on 22.05: `-x ',a100n1, l40sn1'` excludes a100n1,l40sn1)
_EXCLUDE = re.compile(r"[A-Za-z0-9_.\-\[\], \t\n]*")
_SEPARATORS = re.compile(r"[ \t\n]+")
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
    min_nodes: int | None = None  # -N
    num_tasks: int | None = None  # -n
    ntasks_per_node: int | None = None  # --ntasks-per-node
    max_nodes: int | None = None  # -N's upper bound (-N N: N)
    cpus_per_task: int | None = None  # -c
    cpus_per_tres: str | None = None  # --cpus-per-gpu: `gres:gpu:N`
    mem_per_tres: str | None = None  # --mem-per-gpu (MiB): `gres:gpu:N`
    min_mem_per_node: int | None = None  # --mem (MiB)
    min_mem_per_cpu: int | None = None  # --mem-per-cpu (MiB)
    req_nodes: str | None = None  # -w / --nodelist
    exc_nodes: str | None = None  # -x / --exclude
    het_job_id: int | None = None  # an edit's job record: its het job's id (0 / None: not heterogeneous)

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
    code: str | None = None  # a rejection's Slurm error name (ESLURM_...), see REASON_CODES

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok, "action": self.action, "message": self.message}
        out["code"] = self.code
        # a rejected job is not written: no new field values to show
        out |= {
            name: getattr(self.job, name) if self.ok else None
            for name in (*FIELDS, "features", "admin_comment", "min_nodes", "max_nodes")
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


def check_features(features: str | None, known: frozenset[str]) -> None:
    """RequestError naming the first feature of the constraint that no node has (slurmctld
    refuses such a job after the hook: "Invalid feature specification"); no check without `known`."""
    for name in _FEATURE.findall(features or "") if known else ():
        if name not in known:
            raise RequestError(f"--constraint={features}", render("constraint_unknown", name))


def _count(value: int | None) -> int | None:
    """A job_desc count, or None when Slurm's value means unset (nil, 0, NO_VAL16, NO_VAL)."""
    return value if value is not None and 0 < value < UNSET else None


def job_nodes(job: Job) -> int:
    """Nodes the job spans: -N, or more when tasks over tasks per node need more."""
    tasks, per_node = _count(job.num_tasks), _count(job.ntasks_per_node)
    by_tasks = ceil_div(tasks, per_node) if tasks and per_node else 1
    return max(_count(job.min_nodes) or 1, by_tasks)


def tasks_per_node(job: Job, nodes: int) -> int:
    """Tasks on each node: --ntasks-per-node, else the tasks spread over the nodes."""
    tasks = _count(job.num_tasks)
    return _count(job.ntasks_per_node) or (ceil_div(tasks, nodes) if tasks else 1)


def _amount(value: int | None) -> int:
    """A job_desc memory figure (MiB), 0 when Slurm's value means unset (nil, 0, NO_VAL...)."""
    return value if value is not None and 0 < value < NO_VAL else 0


def item_count(text: str | None, name: str) -> int:
    """N of the first `name` item of a TRES field, after its last `:` or `=`: `--cpus-per-gpu` /
    `--mem-per-gpu` (`gres:gpu:N`, `gres/gpu:N`, `gres/gpu=N`; name `gpu`), 24.11's -c in
    tres_per_task (`cpu=N`; name `cpu`); 0 when there is none or it is unreadable."""
    for item in split_items(text):
        if item.name == name:
            value = item.body.replace("=", ":").split(":")[-1]
            return int(value) if value.isdigit() and value.isascii() and len(value) <= 12 else 0
    return 0


def node_needs(job: Job, nodes: int, each: int) -> tuple[int, int]:
    """(CPUs, MiB of memory) each node of the job needs: tasks per node x CPUs per task (-c, or
    24.11's `cpu=N` in tres_per_task, which an edit's job record still shows), or CPUs per gpu x
    its devices; --mem, or memory per gpu x devices, or per CPU x its CPUs."""
    per_task = _count(job.cpus_per_task) or item_count(job.tres_per_task, "cpu") or 1
    cpus = max(tasks_per_node(job, nodes) * per_task, item_count(job.cpus_per_tres, "gpu") * each)
    memory = max(
        _amount(job.min_mem_per_node),
        item_count(job.mem_per_tres, "gpu") * each,
        _amount(job.min_mem_per_cpu) * cpus,
    )
    return cpus, memory


def devices_per_node(request: Request, job: Job, nodes: int) -> int:
    """Devices each node needs: a job total spread over the nodes, per task times tasks per
    node, else the per-node (or per-socket) count."""
    if request.gpu_field == "tres_per_job":
        return ceil_div(request.count, nodes)
    if request.gpu_field == "tres_per_task":
        return request.count * tasks_per_node(job, nodes)
    return request.count


def excluded_hosts(spec: str) -> list[str] | None:
    """The hosts of an -x hostlist (`a1,b[1-3,5]`), or None when the hook cannot read it or it
    names more than MAX_EXCLUDED (as `job_submit.lua`'s `hostlist_names`). Empty items and
    spaces, tabs or newlines between items are skipped, as Slurm reads them (`,a1,,b2 c3`)."""
    if len(spec) > MAX_HOSTLIST or not _EXCLUDE.fullmatch(spec):
        return None
    try:
        items = [part for item in split_top(spec) for part in _SEPARATORS.split(item) if part]
    except ValueError:
        return None
    plain = ",".join(items)
    try:
        hostlist.count(plain, MAX_EXCLUDED)  # expand takes a name without "[" or "," as it is: "n]"
        return hostlist.expand(plain, MAX_EXCLUDED)
    except InventoryError:
        return None


def exclude_refusal(spec: str) -> str:
    """Why the hook cannot read this -x: longer than it reads, or malformed / naming too many
    hosts; the value shown shortened (`reasons.clipped`)."""
    size = len(spec.encode())  # bytes, as Lua counts them
    if size > MAX_HOSTLIST:
        return render("exclude_long", clipped(spec), size, MAX_HOSTLIST)
    return render("exclude_bad", clipped(spec), MAX_EXCLUDED)


_HOST_SHAPES: dict[int, tuple[ClusterModel, dict[str, list[tuple[str, int]]]]] = {}


def host_shapes(model: ClusterModel) -> dict[str, list[tuple[str, int]]]:
    """Host name -> (type, shape index) of each type the host has (cached for the last few models)."""
    cached = _HOST_SHAPES.get(id(model))
    if cached is not None and cached[0] is model:
        return cached[1]
    out: dict[str, list[tuple[str, int]]] = {}
    for name, facts in model.types.items():
        for index, shape in enumerate(facts.shapes):
            for record in shape.hosts:
                for host in hostlist.expand(record):
                    out.setdefault(host, []).append((name, index))
    if len(_HOST_SHAPES) >= 8:
        _HOST_SHAPES.clear()
    _HOST_SHAPES[id(model)] = (model, out)
    return out


def excluded(
    model: ClusterModel, request: Request, spec: str | None, also: frozenset[str] = frozenset()
) -> dict[str, tuple[int, ...]]:
    """Per type, the nodes of each shape that -x names (`Need.excluded`; names no node has are
    left to slurmctld, which refuses them), with the hosts `also` names (a heterogeneous job's
    earlier components' -w hosts, `Taken.hosts`), each host counted once; RequestError for an -x
    the hook cannot read."""
    hosts = excluded_hosts(spec or "")
    if hosts is None:
        raise RequestError(request.text, exclude_refusal(spec or ""))
    by_host, counts = host_shapes(model), dict[str, list[int]]()
    for host in set(hosts) | also:
        for name, index in by_host.get(host, ()):
            counts.setdefault(name, [0] * len(model.types[name].shapes))[index] += 1
    return {name: tuple(counts[name]) for name in sorted(counts)}


def misfit_host(model: ClusterModel, need: Need, spec: str) -> str | None:
    """Of the hosts an edit's -w names that the table knows, one that no shape lets hold the job's
    devices (its type, the devices each node needs, the CPUs and memory, the constraint): the
    shortest name, then the first in byte order; None when each can. Hosts the table does not
    know, and a -w the hook cannot read, are left to slurmctld (as `job_submit.lua`)."""
    by_host, misfits = host_shapes(model), []
    for host in excluded_hosts(spec) or ():
        places = by_host.get(host)
        shapes = [(name, model.types[name].shapes[i]) for name, i in places or ()]
        if places and not any(
            need.gpu_type in (None, name)
            and shape.count >= need.each
            and holds(shape, need)
            and any(constraint.satisfies(alt, shape.features) for alt in need.match)
            for name, shape in shapes
        ):
            misfits.append(host)
    return min(misfits, key=lambda h: (len(h), h.encode()), default=None)


def need_of(
    request: Request,
    job: Job,
    whole: bool = False,
    taken: Mapping[str, int] | None = None,
    gone: Mapping[str, tuple[int, ...]] | None = None,
) -> Need:
    """The engine's view of the job (`whole`: whole devices only, never shards; `gone`: the
    nodes -x excludes, `excluded`); RequestError for a constraint the hook cannot read."""
    nodes = job_nodes(job)
    plain = constraint_features(job.features)
    each = devices_per_node(request, job, nodes)
    cpus, memory = node_needs(job, nodes, each)
    return Need(
        request.text,
        request.gpumem_mib,
        request.gpucore,
        request.count,
        request.gpu_type,
        request.gpu_count is not None or whole,
        job.partition,
        plain,
        request.memory_items,
        nodes,
        each,
        constraint.parse(job.features) if plain is None and job.features else None,
        frozenset(_FEATURE.findall(job.features or "")),
        cpus,
        memory,
        dict(taken or {}),
        dict(gone or {}),
    )


def new_item(choice: Choice, form: str) -> str:
    """The TRES item that replaces the request."""
    args = (choice.types[0], choice.count) if choice.kind == "gpu" else (choice.count,)
    return _ITEM_FORMS[(choice.kind, form)] % args


def _kept(text: str | None, keep_ours: bool) -> list[str]:
    """A field's items without the gpu and shard items (the new item replaces them: a request that
    cli_filter.lua already rewrote to `shard:S,gpumem:M` is decided again to the same, not to
    `shard:S,shard:S,...`), (unless `keep_ours`) the gpumem/gpucore items, and empty items (24.11
    hands `--gres=gpumem:20G,,` over as `gres/gpumem:20G,gres/,gres/`)."""
    dropped = lambda i: i.name in ("gpu", "shard") or (i.ours and not keep_ours) or i.body == ""  # noqa: E731
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
    """The job's constraint AND one of `constraint` (unchanged when that is empty or already the
    constraint's last term, as after cli_filter.lua made the same decision)."""
    if not constraint:
        return features
    either = "|".join(constraint)
    if not features:
        return either
    tail = f"&{either}" if len(constraint) == 1 else f"&({either})"
    return features if features == either or features.endswith(tail) else features + tail


def note(request: Request, choice: Choice, item: str) -> str:
    """The decision in one line, for the user, slurmctld's log and the admin comment (with the
    vendor scope, when one was applied)."""
    if choice.kind == "any":
        text = render("rewrite_any", request.text, item, "|".join(choice.constraint), choice.policy)
    elif choice.kind == "shard":
        feature, gpu_type = choice.constraint[0], choice.types[0]
        text = render("rewrite_shard", request.text, item, feature, choice.policy, gpu_type)
    else:
        text = render("rewrite", request.text, item, choice.policy)
    return text + (render("scope", *choice.scope) if choice.scope else "")


def pinned_nodes(job: Job) -> dict[str, int]:
    """The node count the decision assumed (`job_nodes`), written where the job leaves it open
    (min_nodes, max_nodes unset), so Slurm cannot spread the job over more nodes than the type
    was checked for. Measured on 24.11: `-n4 --gpus-per-task=1` typed to a100_80g without -N ends
    in "Requested node configuration is not available"; with -N1 it runs."""
    nodes = job_nodes(job)
    return {name: nodes for name in ("min_nodes", "max_nodes") if _count(getattr(job, name)) is None}


def _rewritten(job: Job, request: Request, choice: Choice) -> Outcome:
    item = new_item(choice, request.form)
    message = note(request, choice, item)
    comment = NOTE_PREFIX + message
    changes: dict[str, Any] = {
        **pinned_nodes(job),
        **rewrite_fields(job, request, choice, item),
        "features": with_constraint(job.features, choice.constraint),
        "admin_comment": f"{job.admin_comment}; {comment}" if job.admin_comment else comment,
    }
    return Outcome(True, "rewrite", message, replace(job, **changes), choice=choice)


def partition_refusal(model: ClusterModel, partition: str | None) -> str | None:
    """The message refusing a job whose partition list names a partition the model does not know
    (or none: `-p ,`), else None. slurmctld refuses such a job after the hook ("Invalid partition
    name specified"), and the hook must not decide it as if it were in the default partition."""
    stray = model.unknown_partition(partition)
    if stray is None:
        return None
    known = ", ".join(model.known_partitions())
    text = render("partition_unknown", stray, known) if stray else render("partition_none", known)
    return f"--partition={partition}: {text}"


def report_code(report: FitReport) -> str:
    """The Slurm error of a request nothing fits: that of the furthest check any type failed."""
    failed = [c for c in CODE_ORDER if report.counts.get(c, 0) > 0]
    return REASON_CODES[failed[-1]] if failed else REQUEST_CODE


def is_exempt(job: Job, options: HookOptions) -> bool:
    return any(uid is not None and uid in options.exempt_uids for uid in (job.submit_uid, job.user_id))


@dataclass(frozen=True)
class Taken:
    """What a heterogeneous job's earlier components take (`het_taken`); components never share a
    node. `nodes`: per type, the nodes they take that no -w names (a rewrite's node count of the
    type it chose, a typed component's of its type, less its own -w hosts of that type);
    `chosen`: of those, the ones on a type the hook chose (its rewrites), for `het_typed`;
    `hosts`: the hosts their -w names. Slurm also gives every later component those hosts in its
    exc_nodes, so they are counted with its -x, once (`excluded`), never again in `nodes`."""

    nodes: Mapping[str, int] = field(default_factory=dict)
    chosen: Mapping[str, int] = field(default_factory=dict)
    hosts: frozenset[str] = frozenset()


def as_taken(taken: Taken | Mapping[str, int] | None) -> Taken:
    """`taken` as a `Taken` (a plain mapping: nodes per type, none chosen, no -w hosts)."""
    return taken if isinstance(taken, Taken) else Taken(dict(taken or {}))


def _added(counts: Mapping[str, int], name: str, nodes: int) -> dict[str, int]:
    out = dict(counts)
    if nodes > 0:
        out[name] = out.get(name, 0) + nodes
    return out


def named_hosts(model: ClusterModel, spec: str | None, name: str | None = None) -> frozenset[str]:
    """The hosts a -w hostlist names that the model knows (of type `name`, when given); none for
    a list the hook cannot read (slurmctld's to refuse)."""
    if not spec:
        return frozenset()
    by_host, hosts = host_shapes(model), excluded_hosts(spec)
    return frozenset(
        h for h in hosts or () if h in by_host and (name is None or any(t == name for t, _ in by_host[h]))
    )


def sole_type(model: ClusterModel, job: Job) -> str | None:
    """The one type whose nodes could hold a component that asks for devices without naming a type
    (`--gres=gpu:1 -C l40s`, `--gpus=1`): the only type with a node that satisfies its constraint
    and has its devices per node and the CPUs and memory it needs per node. None where several
    (or none) could, or the request or constraint cannot be read: Slurm then picks among them and
    the hook cannot know which. The partition and the vendor scope steer the hook's own choices,
    not where Slurm places such a job, so they narrow nothing here."""
    try:
        request = parse_fields(job.fields(), model.types)
        need = need_of(request, job)
    except RequestError:
        return None
    if request.gpu_field is None or request.gpu_type is not None:
        return None
    fit = [name for name, facts in model.types.items() if nodes_with(facts, need, need.each) > 0]
    return fit[0] if len(fit) == 1 else None


def het_taken(taken: Taken | Mapping[str, int] | None, outcome: Outcome, model: ClusterModel) -> Taken:
    """`taken` after one more component of a heterogeneous job: a rewrite takes its node count of
    the chosen type (any-fit: of the first adequate type, the one node weights favour), a
    component left as it is its node count of the gpu type it names (or, without a type, of the
    one type that could hold it, `sole_type`), less the hosts of that type its -w names: those go
    to `Taken.hosts` with the rest of its -w (each node counted once)."""
    before = as_taken(taken)
    nodes, chosen, hosts = before.nodes, before.chosen, before.hosts
    if outcome.action == "rewrite" and outcome.choice is not None:
        name = outcome.choice.types[0]
        nodes = _added(nodes, name, job_nodes(outcome.job))
        chosen = _added(chosen, name, job_nodes(outcome.job))
    elif outcome.ok:
        # a component left as it is still takes its nodes of the type it names (gpu:l40s:1);
        # two gpu items or a malformed one: slurmctld refuses it
        try:
            typed = parse_fields(outcome.job.fields()).gpu_type
        except RequestError:
            typed = ""  # left to slurmctld
        typed = sole_type(model, outcome.job) if typed is None else typed
        if typed:
            named = len(named_hosts(model, outcome.job.req_nodes, typed))
            nodes = _added(nodes, typed, job_nodes(outcome.job) - named)
        hosts = hosts | named_hosts(model, outcome.job.req_nodes)
    return Taken(nodes, chosen, hosts)


def het_typed(model: ClusterModel, job: Job, taken: Taken | Mapping[str, int] | None) -> Outcome | None:
    """The refusal of a heterogeneous job's later component that the hook leaves alone but that
    names a gpu type (`--gres=gpu:l40s:1`, `--gpus=l40s:1`, ...), where the types the hook chose
    for earlier components (`Taken.chosen`) leave that type too few nodes for it: components never
    share a node, so the job could never start (adversarial pass, 24.11: `--gres=gpumem:20G :
    --gres=gpu:l40s:1` with one l40s node, both PENDING on Resources on an idle cluster). The
    type's nodes are counted less those its -x (and the earlier components' -w, `Taken.hosts`)
    name, each once. Only the node count is checked, only where the hook's own choices make the
    difference, and not for a component with its own -w (Slurm excludes those hosts from the
    other components); else None (the component is left to Slurm)."""
    held = as_taken(taken)
    if not held.chosen or job.req_nodes:
        return None
    try:
        request = parse_fields(job.fields(), model.types)
    except RequestError:
        return None  # two gpu items, a malformed or unknown one: slurmctld's to refuse
    name = request.gpu_type
    if name is None or not held.chosen.get(name):
        return None
    try:
        gone = excluded(model, request, job.exc_nodes, held.hosts)
    except RequestError:
        return None  # an -x the hook cannot read: slurmctld's
    nodes = job_nodes(job)
    each = devices_per_node(request, job, nodes)
    need = Need(request.text, per_node=each, excluded=gone)
    have = nodes_with(model.types[name], need, each, less_excluded=True)
    used, mine = held.nodes.get(name, 0), held.chosen[name]
    left = have - used
    if left >= nodes or left + mine < nodes:
        return None
    text = render("het_typed", name, have, each, used, mine, nodes)
    return Outcome(
        False, "reject", f"{request.text}: {text}", job, code=REASON_CODES[ReasonCode.TOO_FEW_NODES]
    )


def told(outcome: Outcome) -> Outcome:
    """The outcome with its message as the hook tells it: one line (`reasons.one_line`)."""
    return replace(outcome, message=one_line(outcome.message))


def explain(
    model: ClusterModel,
    options: HookOptions,
    job: Job,
    held: str | None = None,
    check: bool = False,
    taken: Taken | Mapping[str, int] | None = None,
) -> Outcome:
    """What the hook does with one job (component), its message as the user sees it (`told`)."""
    return told(_explain(model, options, job, held, check, taken))


def _explain(
    model: ClusterModel,
    options: HookOptions,
    job: Job,
    held: str | None = None,
    check: bool = False,
    taken: Taken | Mapping[str, int] | None = None,
    tasks_hidden: bool = False,
    prefer: str | None = None,
) -> Outcome:
    """What the hook does with one job (component); `held`: the devices an edited job already
    asks for (`held_devices`): whole devices stay whole (untyped ones untyped), shards shards.
    `check`: only whether the devices the job holds still fit it (an edit of its node or task
    count): untouched when they do, else refused (`edit_counts`). `taken`: for a heterogeneous
    job's later component, the nodes of each type its earlier components take (`het_taken`; the
    hook remembers them within one submission). `tasks_hidden`: an edit that cannot see the job's
    task count (Slurm's job record has none): devices per task are then refused (`edit_tasks`)."""
    if is_exempt(job, options):
        return Outcome(True, "exempt", "", job)
    if not has_ours(job.fields()) and not check:
        return het_typed(model, job, taken) or Outcome(True, "untouched", "", job)
    try:
        request = parse_fields(job.fields(), model.types)
    except RequestError as e:
        return Outcome(False, "reject", str(e), job, code=REQUEST_CODE)
    if tasks_hidden and request.gpu_field == "tres_per_task":
        return Outcome(False, "reject", f"{request.text}: {render('edit_tasks')}", job, code=REQUEST_CODE)
    if request.gpu_field == "tres_per_socket":
        # devices per socket x sockets per node: the table knows no sockets, so no type can be checked
        message = f"{request.text}: {render('per_socket', ', '.join(sorted(model.types)))}"
        return Outcome(False, "reject", message, job, code=REQUEST_CODE)
    refusal = partition_refusal(model, job.partition)
    if refusal is not None:
        return Outcome(False, "reject", refusal, job, code=PARTITION_CODE)
    if job.req_nodes and not check:
        message = f"{request.text}: {render('node_list', ', '.join(sorted(model.types)))}"
        return Outcome(False, "reject", message, job, code=REQUEST_CODE)
    held_nodes = as_taken(taken)
    try:
        gone = excluded(model, request, job.exc_nodes, held_nodes.hosts)
    except RequestError as e:  # an -x the hook cannot read: slurmctld's own error for it
        return Outcome(False, "reject", str(e), job, code=NODE_NAME_CODE)
    try:
        # --cpus-per-gpu / --mem-per-gpu need gpu items: slurmctld refuses them beside shards
        whole = held in ("typed", "untyped") or bool(job.cpus_per_tres or job.mem_per_tres)
        need = replace(need_of(request, job, whole, held_nodes.nodes, gone), prefer=prefer)
        check_features(job.features, model.features)
    except RequestError as e:
        return Outcome(False, "reject", str(e), job, code=CONSTRAINT_CODE)
    if request.gpu_field == "tres_per_job" and request.count < need.nodes:
        # slurmctld refuses a job total below min_nodes (which the rewrite pins): --gpus < -N
        message = f"{request.text}: {render('job_total', request.count, need.nodes, need.nodes)}"
        return Outcome(False, "reject", message, job, code=REQUEST_CODE)
    misfit = misfit_host(model, need, job.req_nodes) if check and job.req_nodes else None
    if misfit is not None:
        message = f"{request.text}: {render('edit_hosts', misfit, need.each)}"
        return Outcome(False, "reject", message, job, code=REASON_CODES[ReasonCode.NODE_TOO_SMALL])
    result = decide(model, need)
    if held == "untyped" and isinstance(result, Choice) and result.kind == "gpu":
        result = replace(result, kind="any", constraint=(model.types[result.types[0]].feature,))
    if held == "shard" and isinstance(result, Choice) and result.kind != "shard":
        return Outcome(False, "reject", f"{request.text}: {render('edit_shards')}", job, code=REQUEST_CODE)
    if isinstance(result, FitReport):
        message = render("edit_counts", result.message) if check else result.message
        return Outcome(False, "reject", message, job, report=result, code=report_code(result))
    if check:
        return Outcome(True, "untouched", "", job)
    return _rewritten(job, request, result)


# ------------------------------------------------------------------------------------ edits

# cpus_per_tres / mem_per_tres: job_rec carries them on 22.05 and 24.11 (slurm_lua.c; dev cluster),
# and with them a request gets whole devices (slurmctld refuses shards beside them)
_VIEW_STRINGS = (*FIELDS, "features", "partition", "admin_comment", "cpus_per_tres", "mem_per_tres")
_VIEW_COUNTS = ("min_nodes", "num_tasks", "ntasks_per_node")
# --mem / --mem-per-cpu: job_rec carries them (min_mem_per_node, min_mem_per_cpu; 22.05 and 24.11)
_VIEW_AMOUNTS = ("min_mem_per_node", "min_mem_per_cpu")
# -w / -x: job_rec has neither (slurm_lua.c, 22.05 and 24.11), so only an edit's own count
_VIEW_EDIT = ("req_nodes", "exc_nodes")
# not in job_rec either (cpus_per_task: only pn_min_cpus, which --mincpus also sets)
_VIEW_UNREAD = ("max_nodes", "cpus_per_task")


_OUR_CONSTRAINT = re.compile(r" constraint ([^ ]+) \(")


def our_constraint(comment: str | None) -> str | None:
    """The constraint our last rewrite added (`l40s`, `a100_80g|h100`), from the last note in
    the admin comment (`... -> gres:shard:5 constraint l40s (...)`); None when it added none."""
    at = (comment or "").rfind(NOTE_PREFIX)
    found = _OUR_CONSTRAINT.search(comment[at:]) if comment and at >= 0 else None
    return found.group(1) if found else None


def without(features: str | None, added: str | None) -> str | None:
    """`features` without the part `with_constraint` appended (None when nothing is left)."""
    if features is None or added is None:
        return features
    if features == added:
        return None
    for tail in (f"&{added}", f"&({added})"):
        if len(features) > len(tail) and features.endswith(tail):
            return features[: -len(tail)]
    return features


def untyped(text: str | None) -> str | None:
    """`text` with every gpu item's type dropped: `gres:gpu:l40s:2` -> `gres:gpu:2`,
    `gres/gpu:l40s=2` -> `gres/gpu=2`, `gres:gpu:l40s` -> `gres:gpu` (other items unchanged)."""
    if not text:
        return text
    out = []
    for item in split_items(text):
        tokens, value = item.body.partition("=")[0].split(":"), item.body.partition("=")[2]
        piece = item.text
        if item.name == "gpu" and "=" in item.body and len(tokens) == 2:
            piece = f"{item.prefix}gpu={value}"
        elif item.name == "gpu" and "=" not in item.body and len(tokens) == 3:
            piece = f"{item.prefix}gpu:{tokens[2]}"
        elif item.name == "gpu" and "=" not in item.body and len(tokens) == 2 and not tokens[1].isdigit():
            piece = f"{item.prefix}gpu"
        out.append(piece)
    return ",".join(out)


def edited_view(edit: Job, record: Job, again: bool | None = None) -> Job:
    """The job as edited: the edit's fields where set (non-empty), the record's elsewhere; the
    owner from the record, the editor as submitter. Slurm's job record has no num_tasks or
    ntasks_per_node for the hook: pass None there for what a real record gives. An edit that
    asks for gpumem/gpucore is decided as a submission with the job's device count and scope:
    the record's gpu items lose their type (`untyped`), so the type is chosen again (`again`:
    whether to, by default when the edit asks for gpumem/gpucore)."""
    again = has_ours(edit.fields()) if again is None else again
    values: dict[str, Any] = {n: getattr(edit, n) or getattr(record, n) for n in _VIEW_STRINGS}
    for name in FIELDS if again else ():
        values[name] = getattr(edit, name) or untyped(getattr(record, name))
    if (
        again
        and edit.tres_per_node
        and not any(i.name == "gpu" for _, t in edit.fields() for i in split_items(t))
    ):
        # `scontrol update gres=gpumem:30G` replaces the whole field: the job's per-node device count
        # (--gres=gpu:2, --gpus-per-node=2; the hook never picks a count itself) stays, as 22.05 merges it
        # (a count of 1 is the default: not written again)
        items = split_items(untyped(record.tres_per_node) or "")
        counts = [(i.text, re.search(r"[:=](\d+)$", i.text)) for i in items if i.name == "gpu"]
        held = [text for text, count in counts if count and int(count.group(1)) > 1]
        values["tres_per_node"] = ",".join([edit.tres_per_node, *held])
    values |= {n: _count(getattr(edit, n)) or _count(getattr(record, n)) for n in _VIEW_COUNTS}
    values |= {n: getattr(edit if _amount(getattr(edit, n)) else record, n) for n in _VIEW_AMOUNTS}
    values |= {n: getattr(edit, n) or None for n in _VIEW_EDIT}
    values |= dict.fromkeys(_VIEW_UNREAD)  # the edit view (slurm_job_modify) does not read these
    ours = our_constraint(record.admin_comment)
    if not edit.features:
        # decided again: the record's constraint, less what our last rewrite added; checked: the
        # job's whole constraint (an untyped job's type is only there: l40s|a100_80g)
        values["features"] = without(record.features, ours) if again else record.features
    elif not again and ours:  # a new constraint: still on the types our rewrite chose
        values["features"] = with_constraint(edit.features, ours.split("|"))
    return replace(record, **values, submit_uid=edit.submit_uid, user_id=record.user_id)


def held_devices(record: Job) -> str | None:
    """How a job asks for devices: "shard" (a shard item), "typed" (a gpu item with a type),
    "untyped" (`gpu:N` only) or None. Slurm 22.05 refuses an update between gpu and shard
    requests, either way, and from an untyped gpu request to a typed one ("Invalid generic
    resource (gres) specification", "... with and without type identification", even from root
    and without the hook): so an edit keeps a job on whole devices or on shards (else it is
    refused), and an untyped one untyped (the type goes into the constraint)."""
    items = [item for _, text in record.fields() for item in split_items(text)]
    if any(item.name == "shard" for item in items):
        return "shard"
    gpu = [item for item in items if item.name == "gpu"]
    if not gpu:
        return None
    tokens = [item.body.split("=")[0].split(":") for item in gpu]
    return "typed" if any(len(t) > 1 and not t[1].isdigit() for t in tokens) else "untyped"


def typed_held(record: Job) -> tuple[str, str] | tuple[None, None]:
    """The type of the job's first typed gpu item, in any form, and the prefix of its field
    (`gres:`, `gres/`); (None, None): none."""
    for _, text in record.fields():
        for item in split_items(text):
            tokens = item.body.partition("=")[0].split(":")
            if item.name == "gpu" and len(tokens) > 1 and not tokens[1].isdigit():
                return tokens[1], item.prefix
    return None, None


def held_type(record: Job) -> str | None:
    """The type of the job's first typed gpu item, when Slurm stored it in 22.05's `gres:` form
    (None otherwise). Slurm 22.05 merges an update's GRES into the job's (`gres_job_state_validate`
    starts from a copy of the job's list and cannot set a count to 0), so a new type is added
    beside the old one: the job then asks for both (ran on the old type's node, or never
    started). 24.11 builds the list again from the fields."""
    name, prefix = typed_held(record)
    return name if prefix == "gres:" else None


def fit_edit(edit: Job) -> bool:
    """Whether an edit changes what the devices a job holds must fit: the node or task count (-N,
    -n, --ntasks-per-node), the node lists (-w, -x), the partition or the constraint."""
    counts = any(_count(getattr(edit, n)) for n in _VIEW_COUNTS)
    return counts or any(getattr(edit, n) for n in _VIEW_EDIT) or bool(edit.partition or edit.features)


def explain_edit(model: ClusterModel, options: HookOptions, edit: Job, record: Job) -> Outcome:
    """What `slurm_job_modify` does with an edit, its message as the user sees it (`told`)."""
    return told(_explain_edit(model, options, edit, record))


def _explain_edit(model: ClusterModel, options: HookOptions, edit: Job, record: Job) -> Outcome:
    """What `slurm_job_modify` does with an edit (`scontrol update`) of a job. An edit whose own
    TRES fields carry gpumem/gpucore: the job as edited (`edited_view`) goes through `explain`,
    on whole devices when the job holds some (`held_devices`), and on 22.05 on the type it holds
    (`held_type`). An edit of the node or task count, the partition or the constraint of a job
    this hook rewrote (`fit_edit`): the devices it holds are checked against the job as edited
    (`explain(check=True)`), and the edit refused when they no longer fit; a new constraint keeps
    the one our rewrite added (ANDed), so the job stays on the types chosen for its gpumem.
    Other edits are untouched. The job in the outcome is what Slurm then stores: an update cannot
    clear a field, so an emptied one keeps the record's value, and the admin comment is not
    changed (users may not)."""
    view = edited_view(edit, record)
    held = held_devices(record)
    if not has_ours(edit.fields()):
        ours = NOTE_PREFIX in (record.admin_comment or "")
        if not (fit_edit(edit) and held and ours):
            return Outcome(True, "untouched", "", view)
        return replace(_explain(model, options, view, held, check=True), job=view)
    # Slurm's job record has no num_tasks / ntasks_per_node: unknown unless the edit sets one
    hidden = view.num_tasks is None and view.ntasks_per_node is None
    # Slurm's job_rec has no exc_nodes or req_nodes: without the edit's own -x and -w, a job holding a
    # type keeps it when it fits, and another type is refused (the job's -x may exclude it, or its -w
    # name none of its hosts, given at submission or by an earlier edit: it would never start)
    known = edit.exc_nodes is not None and edit.req_nodes is not None  # "" (excnodelist=): none
    prefer = None if known else typed_held(record)[0]
    outcome = _explain(model, options, view, held, tasks_hidden=hidden, prefer=prefer)
    if outcome.action != "rewrite":  # nothing written: the edit over the record
        return replace(outcome, job=edited_view(edit, record, again=False))
    after, choice = outcome.job, outcome.choice
    if record.het_job_id and record.het_job_id < NO_VAL:
        # Slurm shows an edit no other component of the job: a new type could land beside theirs
        text = parse_fields(view.fields(), model.types).text
        return Outcome(False, "reject", f"{text}: {render('edit_het')}", view, code=REQUEST_CODE)
    old = held_type(record)
    if choice is not None and old is not None and choice.types[0] != old:
        text = parse_fields(view.fields(), model.types).text
        message = f"{text}: {render('edit_type', old, choice.types[0])}"
        return Outcome(False, "reject", message, view, code=REQUEST_CODE)
    if choice is not None and prefer is not None and choice.types[0] != prefer:
        text = parse_fields(view.fields(), model.types).text
        message = f"{text}: {render('edit_hidden', prefer, choice.types[0])}"
        return Outcome(False, "reject", message, view, code=REQUEST_CODE)
    kept: dict[str, Any] = {n: getattr(after, n) or getattr(record, n) for n in FIELDS}
    restore = not edit.features and view.features != record.features
    if choice is not None and not choice.constraint and restore:
        # drop the constraint we added before; an update cannot clear a field, so an empty one
        # becomes the chosen type's own feature, which every node of the type has
        kept["features"] = view.features or model.types[choice.types[0]].feature
    kept |= {n: getattr(record, n) for n in ("min_nodes", "max_nodes")}  # an edit does not pin nodes
    return replace(outcome, job=replace(after, **kept, admin_comment=view.admin_comment))


# what sbatch sends for command-line options (re-exported: `request explain` and the tests start there)
from slurm_hetero.submit.sbatch import RELEASE_PREFIX, job_from_options, sbatch_counts  # noqa: E402,F401
