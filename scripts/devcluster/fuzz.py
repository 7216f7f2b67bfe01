"""The submit fuzz: random requests through the real sbatch/scontrol of a running dev cluster (hook
and cli_filter installed), each checked against `request explain`: the same job_submit.lua run
through lupa (slurm_hetero.submit.hook), on the job_desc the release's sbatch sends.

A request is one or more components (`sbatch A : B` makes a heterogeneous job), each a dict of
sbatch options (-N N or MIN-MAX, -n, --ntasks-per-node, --gpus* counts or TYPE:N, --gres mixes, -C
with &, | and [], -p one partition or a list, or none, -c, --cpus-per-gpu, --mem*, -w, -x, some
values malformed), with an optional --array. Every one is submitted held (-H) by a plain user. Checked:

- the decision: sbatch refuses it (the predicted refusal's text, sbatch's own or the hook's
  message, is in its output), or accepts it where explain accepts every component;
- the message: explain's message for each component that the hook rewrote or refused is in what
  the client printed (item 8: one text);
- the stored request: TresPerNode/Job/Task and Features of each component equal explain's job;
- edits: `scontrol update jobid=J gres=...` of some accepted jobs is refused or rewritten as
  the hook's slurm_job_modify says on the job's record (24.11 also prints the message; 22.05 drops log_user
  text from slurm_job_modify, SchedMD bug 14539);
- slurmctld answers `scontrol ping` at the end;
- a sample of accepted, rewritten jobs is released and must start (RUNNING, COMPLETING or
  COMPLETED), not pend forever.

Used by scripts/fuzz_submit (the full run) and tests/integration (a sample). Not pure: it runs
the cluster's clients through a `Runner`.
"""

from __future__ import annotations

import random
import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from slurm_hetero.core import hostlist, units
from slurm_hetero.core.errors import HeteroError, RequestError
from slurm_hetero.engine.score import ClusterModel
from slurm_hetero.submit import Job, job_from_options
from slurm_hetero.submit.hook import Hook, Outcome
from slurm_hetero.submit.sbatch import (
    MEMORY_EXCLUSIVE,
    gres_names,
    het_mem_refusal,
    het_sent,
    read_options,
)

Runner = Callable[..., subprocess.CompletedProcess]  # (argv, user=None) -> completed, text
Options = dict[str, str]
FLAGS = {
    "gres": "--gres",
    "gpus": "--gpus",
    "gpus_per_node": "--gpus-per-node",
    "gpus_per_task": "--gpus-per-task",
    "partition": "--partition",
    "constraint": "--constraint",
    "nodes": "--nodes",
    "ntasks": "--ntasks",
    "ntasks_per_node": "--ntasks-per-node",
    "cpus_per_task": "--cpus-per-task",
    "cpus_per_gpu": "--cpus-per-gpu",
    "mem_per_gpu": "--mem-per-gpu",
    "mem": "--mem",
    "mem_per_cpu": "--mem-per-cpu",
    "mincpus": "--mincpus",
    "overcommit": "--overcommit",  # a flag: given without its value
    "nodelist": "--nodelist",
    "exclude": "--exclude",
}
SIZES = [
    "512",
    "1G",
    "10G",
    "20G",
    "20g",
    "30G",
    "40G",
    "45G",
    "60G",
    "70G",
    "80G",
    "200G",
    "abc",
    "1.5G",
    "9E",
]
STARTED = ("RUNNING", "COMPLETING", "COMPLETED")


@dataclass
class Request:
    components: list[Options]
    array: str | None = None


@dataclass
class Report:
    counts: Counter = field(default_factory=Counter)
    mismatches: list[tuple[str, Any, str]] = field(default_factory=list)

    def miss(self, kind: str, what: Any, detail: str) -> None:
        self.mismatches.append((kind, what, detail))
        self.counts["mismatches"] += 1

    def summary(self) -> str:
        order = (
            "requests",
            "accepted",
            "refused",
            "components",
            "het",
            "arrays",
            "edits",
            "released",
            "started",
        )
        shown = [f"{k} {self.counts[k]}" for k in order]
        shown += [f"{k} {v}" for k, v in sorted(self.counts.items()) if k not in order]
        return ", ".join(shown)


# ----------------------------------------------------------------------------- generation


def _constraint(rng: random.Random, features: list[str]) -> str:
    pick = lambda: rng.choice(features) if rng.random() < 0.95 else "nosuch"  # noqa: E731
    forms = ["{a}", "{a}&{b}", "{a}|{b}", "[{a}|{b}]", "{a}&[{b}|{c}]", "({a}|{b})&{c}", "{a}*2"]
    return rng.choice(forms).format(a=pick(), b=pick(), c=pick())


def _nodes(rng: random.Random, names: list[str]) -> str:
    """A -w/-x value: one or two of the cluster's nodes, sometimes one it does not have."""
    picked = rng.sample(names, min(len(names), rng.choice([1, 1, 2])))
    return ",".join(picked) if rng.random() < 0.9 else "nosuchn1"


def _node_fields(rng: random.Random, options: Options, nodes: list[str]) -> None:
    """-c, --cpus-per-gpu, --mincpus, -O, one of --mem/--mem-per-cpu/--mem-per-gpu, -w/-x (some
    malformed)."""
    if rng.random() < 0.12:
        options["cpus_per_task"] = rng.choice(["1", "2", "4", "8", "16", "64", "0", "x"])
    elif rng.random() < 0.05:
        options["cpus_per_gpu"] = rng.choice(["1", "2", "8", "64"])
    # above 4, 24.11 pends a gres job's --mincpus itself (Resources, typed too): not drawn
    if rng.random() < 0.04:
        options["mincpus"] = rng.choice(["2", "4", "0", "x"])
    if rng.random() < 0.04:
        options["overcommit"] = "yes"
    roll = rng.random()
    if roll < 0.08:
        options["mem"] = rng.choice(
            ["1000", "8G", "15G", "16000", "100G", "3T", "abc", "1.5G", "10GB", "8796093022208T"]
        )
    elif roll < 0.12:
        options["mem_per_cpu"] = rng.choice(["500", "2G", "4G", "300G", "x", "2048K"])
    elif roll < 0.16:
        options["mem_per_gpu"] = rng.choice(["1G", "4G", "16G", "600G", "1.5G"])
    roll = rng.random()
    if nodes and roll < 0.05:
        options["nodelist"] = _nodes(rng, nodes)
    elif nodes and roll < 0.08:
        options["exclude"] = _nodes(rng, nodes)


def random_component(
    rng: random.Random,
    types: list[str],
    features: list[str],
    partitions: list[str],
    nodes: list[str] | None = None,
) -> Options:
    items = []
    if rng.random() < 0.85:
        items.append(f"gpumem:{rng.choice(SIZES)}")
    if rng.random() < 0.2:
        items.append(f"gpucore:{rng.choice(['10', '30', '50', '100', '0', '101', 'x'])}")
    if rng.random() < 0.2:
        items.append(
            f"gpu:{rng.choice(types)}:{rng.choice('124')}"
            if rng.random() < 0.5
            else f"gpu:{rng.choice('123')}"
        )
    options = {"gres": ",".join(items)} if items else {}
    roll = rng.random()
    count = lambda choices: (  # noqa: E731
        f"{rng.choice(types)}:{rng.choice(choices)}" if rng.random() < 0.3 else rng.choice(choices)
    )
    if roll < 0.15:
        options["gpus"] = count(["1", "2", "4", "8"])
    elif roll < 0.25:
        options["gpus_per_node"] = count(["1", "2"])
    elif roll < 0.4:
        options["gpus_per_task"] = count(["1", "2"])
    roll = rng.random()
    if roll < 0.25:
        options["partition"] = rng.choice(partitions)
    elif roll < 0.32 and len(partitions) > 1:
        options["partition"] = ",".join(rng.sample(partitions, 2))
    roll = rng.random()
    if roll < 0.25:
        options["nodes"] = rng.choice(["1", "2", "3"])
    elif roll < 0.32:
        options["nodes"] = rng.choice(["1-2", "2-3", "1-3", "2-2", "3-1", "0-2", "1-x"])
    if rng.random() < 0.35:
        options["ntasks"] = rng.choice(["1", "2", "4"])
    if rng.random() < 0.2:
        options["ntasks_per_node"] = rng.choice(["1", "2"])
    if rng.random() < 0.25:
        options["constraint"] = _constraint(rng, features)
    _node_fields(rng, options, nodes or [])
    return options


def random_request(
    rng: random.Random,
    types: list[str],
    features: list[str],
    partitions: list[str],
    nodes: list[str] | None = None,
) -> Request:
    count = 2 if rng.random() < 0.1 else 1
    components = [random_component(rng, types, features, partitions, nodes) for _ in range(count)]
    array = rng.choice(["0-1", "0-2", "1,3"]) if count == 1 and rng.random() < 0.08 else None
    return Request(components, array)


def unknown_exclusion(model: ClusterModel, options: Options) -> bool:
    """Whether a component's -x (as sent, `het_sent`) names a host no device node has: the hook
    does not count it and slurmctld refuses the job."""
    try:
        hosts = hostlist.expand(options.get("exclude") or "")
    except HeteroError:
        return False  # one the hook cannot read: its own refusal
    if not hosts:
        return False
    known = {h for f in model.types.values() for s in f.shapes for r in s.hosts for h in hostlist.expand(r)}
    return any(host not in known for host in hosts)


def sbatch_refusals(read: list[str], predicted: list[Outcome | str], carried: int | None) -> list[str]:
    """sbatch's own refusals of a request, the one it prints first first: those of reading the
    options (every component's, before any check), then each component's checks in order, where
    the carried --mem refusal is component `carried`'s (`het_mem_refusal`). The hook sees the job
    only when this is empty."""
    checked: list[Outcome | str] = list(predicted)
    if carried is not None:
        checked[carried:] = [MEMORY_EXCLUSIVE]
    return [*read[:1], *(p for p in checked if isinstance(p, str))]


def sbatch_argv(request: Request) -> list[str]:
    argv = ["sbatch", "-H", "--parsable", "-o", "/dev/null"] + (
        [f"--array={request.array}"] if request.array else []
    )
    for i, options in enumerate(request.components):
        argv += [":"] if i else []
        argv += [FLAGS[k] if k == "overcommit" else f"{FLAGS[k]}={v}" for k, v in options.items()]
    return argv + ["--wrap", "true"]


# ----------------------------------------------------------------------------- prediction


def predict(
    model: ClusterModel,
    hook: Hook,
    options: Options,
    uid: int,
    release: str,
    offset: int | None = None,
) -> Outcome | str:
    """The hook's outcome for one component (`offset`: its het_job_offset in a het job, components
    in order), or the text of sbatch's own refusal."""
    try:  # as `request explain` reads the options (sbatch's reading of -N, -n, -c and the rest)
        job = job_from_options(**options, uid=uid, slurm_release=release, names=gres_names(model))
    except RequestError as e:
        return e.reason
    return hook.submit(job, offset)


def read_refusal(options: Options, release: str) -> str | None:
    """sbatch's refusal while it reads these options (`read_options`), or None."""
    try:
        read_options(options, release)
    except RequestError as e:
        return e.reason
    return None


_KEY = re.compile(r"(?:^|\s)([A-Z][A-Za-z:/]*)=")


def parse_oneliner(line: str) -> dict[str, str]:
    """`scontrol show -o` fields; values may hold spaces (Comment=..., AdminComment=...)."""
    keys = list(_KEY.finditer(line))
    return {
        m.group(1): line[m.end() : (keys[i + 1].start() if i + 1 < len(keys) else len(line))].strip()
        for i, m in enumerate(keys)
    }


def _value(fields: dict[str, str], key: str) -> str | None:
    value = fields.get(key, "")
    return None if value in ("", "(null)") else value


STORED = (
    ("tres_per_node", "TresPerNode"),
    ("tres_per_job", "TresPerJob"),
    ("tres_per_task", "TresPerTask"),
    ("features", "Features"),
)


def stored_view(fields: dict[str, str]) -> dict[str, str | None]:
    return {name: _value(fields, key) for name, key in STORED}


def _pending_view(fields: dict[str, str]) -> tuple[str | None, ...]:
    """What says why a record waits: its state and reason, nodes, tasks and partition."""
    return tuple(fields.get(k) for k in ("JobState", "Reason", "NumNodes", "NumTasks", "Partition"))


def _memory(fields: dict[str, str], key: str) -> int | None:
    """scontrol's MinMemoryNode / MinMemoryCPU (`12000M`, `16G`) in MiB; None when 0 or absent."""
    value = _value(fields, key)
    try:
        return units.parse_size(value) if value and value != "0" else None
    except RequestError:
        return None


def record_of(fields: dict[str, str], uid: int, min_nodes: int | None) -> Job:
    """The job record as slurm_job_modify's job_rec shows it: no num_tasks / ntasks_per_node, and
    min_nodes as submitted (scontrol's NumNodes is slurmctld's estimate: `-n4 --ntasks-per-node=2`
    shows 2 where 22.05's job_rec.min_nodes is 1). job_rec's cpus_per_tres / mem_per_tres are
    scontrol's CpusPerTres / MemPerTres, same text (`gres:gpu:2`, 24.11 `gres/gpu:2`), and its
    min_mem_per_node / min_mem_per_cpu scontrol's MinMemoryNode / MinMemoryCPU, its pn_min_cpus
    MinCPUsNode. ReqNodeList /
    ExcNodeList are read too, though job_rec has neither (`Hook.modify` leaves them out, as Slurm
    does)."""
    view = stored_view(fields)
    return Job(
        tres_per_node=view["tres_per_node"],
        tres_per_job=view["tres_per_job"],
        tres_per_task=view["tres_per_task"],
        features=view["features"],
        partition=_value(fields, "Partition"),
        admin_comment=_value(fields, "AdminComment"),
        cpus_per_tres=_value(fields, "CpusPerTres"),
        mem_per_tres=_value(fields, "MemPerTres"),
        min_mem_per_node=_memory(fields, "MinMemoryNode"),
        min_mem_per_cpu=_memory(fields, "MinMemoryCPU"),
        pn_min_cpus=int(fields["MinCPUsNode"]) if fields.get("MinCPUsNode", "").isdigit() else None,
        req_nodes=_value(fields, "ReqNodeList"),
        exc_nodes=_value(fields, "ExcNodeList"),
        user_id=uid,
        min_nodes=min_nodes or 1,
    )


# ----------------------------------------------------------------------------- the run


@dataclass
class Fuzz:
    run: Runner  # run(argv, user=None) on the cluster
    model: ClusterModel
    hook: Hook  # job_submit.lua for the cluster (`submit.hook.cluster_hook`)
    release: str
    user: str
    uid: int
    report: Report = field(default_factory=Report)

    def show(self, job_id: str) -> dict[str, dict[str, str]]:
        """Every record of a job (het components and array tasks: one each), by JobId."""
        out = self.run(["scontrol", "show", "job", "-o", job_id])
        return {f["JobId"]: f for f in map(parse_oneliner, out.stdout.splitlines()) if "JobId" in f}

    def submit(self, request: Request) -> tuple[str, list[Outcome]] | None:
        """Submit one request and check it; the job id and explain's outcomes when accepted."""
        counts, report = self.report.counts, self.report
        counts["requests"] += 1
        counts["components"] += len(request.components)
        counts["het"] += len(request.components) > 1
        counts["arrays"] += request.array is not None
        predicted: list[Outcome | str] = []
        read = [read_refusal(c, self.release) for c in request.components]
        read = [r for r in read if r]  # sbatch reads every component's options before checking any
        carried = het_mem_refusal(request.components)  # that component's check, after every read
        sent = het_sent(request.components, self.release)
        for offset, component in enumerate(sent):  # the hook keeps what earlier components take
            het_offset = offset if len(sent) > 1 else None
            predicted.append(predict(self.model, self.hook, component, self.uid, self.release, het_offset))
        run = self.run(sbatch_argv(request), self.user)
        refusals: list[Outcome | str] = list(sbatch_refusals(read, predicted, carried))
        refusals = refusals or [p for p in predicted if isinstance(p, Outcome) and not p.ok]
        what = (request.components, request.array)
        if refusals:
            counts["refused"] += 1
            text = refusals[0] if isinstance(refusals[0], str) else refusals[0].message
            counts["refused by sbatch" if isinstance(refusals[0], str) else "refused by the hook"] += 1
            if run.returncode == 0:
                report.miss("accepted but predicted refusal", what, text)
                self.run(["scancel", run.stdout.strip().split(";")[0]])
            elif text not in run.stderr and not self.earlier_refused(request, predicted, refusals[0]):
                report.miss("refused, other message", what, f"{run.stderr.strip()!r} lacks {text!r}")
            return None
        outcomes = [p for p in predicted if isinstance(p, Outcome)]
        if run.returncode != 0:
            counts["refused"] += 1
            untouched = [c for c, o in zip(request.components, outcomes) if o.action != "rewrite"]
            if any(unknown_exclusion(self.model, c) for c in sent):
                # the hook leaves -x names no node has to slurmctld ("Invalid node name specified")
                counts["refused by slurmctld (unknown -x name)"] += 1
            elif len(untouched) < len(outcomes) and not any(map(self.refused_alone, untouched)):
                report.miss("refused but predicted accept", what, run.stderr.strip())
            else:  # slurmctld refuses a component the hook leaves alone (e.g. a feature no node has)
                counts["refused by slurmctld (untouched)"] += 1
            return None
        counts["accepted"] += 1
        job_id = run.stdout.strip().split(";")[0]
        for outcome in outcomes:
            if outcome.action == "rewrite" and outcome.message not in run.stderr:
                report.miss("other message", what, f"{run.stderr.strip()!r} lacks {outcome.message!r}")
        records = self.show(job_id)
        for offset, outcome in enumerate(outcomes):
            if len(outcomes) > 1:
                key = next((k for k, f in records.items() if f.get("HetJobOffset") == str(offset)), None)
            else:
                key = next(iter(records), None)
            if key is None:
                report.miss("no record", what, job_id)
                continue
            want = {name: getattr(outcome.job, name) for name, _ in STORED}
            if stored_view(records[key]) != want:
                report.miss("stored request differs", what, f"{stored_view(records[key])} != {want}")
        return job_id, outcomes

    def earlier_refused(
        self, request: Request, predicted: Sequence[Outcome | str], refusal: Outcome | str
    ) -> bool:
        """Whether slurmctld refuses a het component the hook leaves alone before the hook's
        refusal of a later one: slurmctld checks each component after its hook call, in order
        (24.11 seed 20261129: a constraint naming no feature in component 0 was refused before
        the hook saw component 1's `gpumem:abc`)."""
        if isinstance(refusal, str) or refusal not in predicted:
            return False
        earlier = zip(request.components, predicted[: predicted.index(refusal)])
        untouched = [c for c, p in earlier if isinstance(p, Outcome) and p.action == "untouched"]
        if any(map(self.refused_alone, untouched)):
            self.report.counts["refused by slurmctld (untouched)"] += 1
            return True
        return False

    def refused_alone(self, component: Options) -> bool:
        """Whether slurmctld refuses this component submitted on its own (held, then cancelled)."""
        run = self.run(sbatch_argv(Request([component])), self.user)
        if run.returncode == 0:
            self.run(["scancel", run.stdout.strip().split(";")[0]])
        return run.returncode != 0

    def edit(
        self, job_id: str, submitted: Job, gres: str | None, lists: Mapping[str, str] | None = None
    ) -> None:
        """`scontrol update jobid=J [gres=...] [excnodelist=...] [reqnodelist=...]` as the user,
        against the hook's slurm_job_modify on the record; `lists`: Job field (exc_nodes,
        req_nodes) -> hosts."""
        self.report.counts["edits"] += 1
        lists = dict(lists or {})
        fields = next(iter(self.show(job_id).values()))
        record = record_of(fields, self.uid, submitted.min_nodes)
        edit = job_from_options(gres=gres, slurm_release=self.release) if gres else Job()
        edit = replace(edit, submit_uid=self.uid, **lists)
        predicted = self.hook.modify(edit, record)
        argv = ["scontrol", "update", f"jobid={job_id}"] + ([f"gres={gres}"] if gres else [])
        argv += [f"{_UPDATE_KEYS[name]}={hosts}" for name, hosts in sorted(lists.items())]
        run = self.run(argv, self.user)
        what = (job_id, gres, lists, record, submitted)  # as submitted too: the record lacks its tasks
        after = stored_view(next(iter(self.show(job_id).values())))
        if not predicted.ok:
            self.report.counts["edits refused"] += 1
            if run.returncode == 0:
                self.report.miss("edit accepted but predicted refusal", what, predicted.message)
            elif self.release != "22.05" and predicted.message not in run.stderr:
                self.report.miss("edit refused, other message", what, run.stderr.strip())
            if after != stored_view(fields):
                self.report.miss("refused edit changed the job", what, str(after))
            return
        if run.returncode != 0:
            self.report.miss("edit refused but predicted accept", what, run.stderr.strip())
            return
        want = {name: getattr(predicted.job, name) for name, _ in STORED}
        if predicted.action == "rewrite" and after != want:
            self.report.miss("edited request differs", what, f"{after} != {want}")

    def release_and_wait(self, job_ids: list[str], timeout: float = 300.0) -> None:
        """Release held jobs; each must start (array tasks and het components included)."""
        if not job_ids:
            return
        self.report.counts["released"] += len(job_ids)
        self.run(["scontrol", "release", *job_ids])
        waiting, deadline = set(job_ids), time.monotonic() + timeout
        states: dict[str, dict[str, Any]] = {}
        while waiting and time.monotonic() < deadline:
            time.sleep(1.0)
            for job_id in sorted(waiting):
                records = self.show(job_id)
                states[job_id] = {k: (*_pending_view(f), stored_view(f)) for k, f in records.items()}
                if records and all(view[0] in STARTED for view in states[job_id].values()):
                    waiting.discard(job_id)
                    self.report.counts["started"] += 1
        for job_id in sorted(waiting):
            self.report.miss("released job did not start", job_id, str(states.get(job_id)))


# scontrol update's keys for the edit's node lists
_UPDATE_KEYS = {"exc_nodes": "excnodelist", "req_nodes": "reqnodelist"}


def random_edit(rng: random.Random, nodes: list[str]) -> tuple[str | None, dict[str, str]]:
    """An edit: gpumem (sometimes with a gpu count), -x or -w of one or two of the cluster's nodes
    (-x sometimes empty: `excnodelist=` clears it, sometimes with `reqnodelist=`), or both."""
    gres = f"gpumem:{rng.choice(SIZES[:12])}" + (",gpu:2" if rng.random() < 0.2 else "")
    lists: dict[str, str] = {}
    kind = rng.random()
    if kind < 0.5:
        return gres, lists
    name = "exc_nodes" if rng.random() < 0.6 else "req_nodes"
    picked = rng.sample(nodes, min(len(nodes), rng.choice((1, 1, 2))))
    lists[name] = "" if name == "exc_nodes" and rng.random() < 0.15 else ",".join(picked)
    if lists[name] == "" and rng.random() < 0.5:  # both lists stated (none): a type move may be decided
        lists["req_nodes"] = ""
    return (gres if kind < 0.75 else None), lists


def run_fuzz(
    fuzz: Fuzz, requests: int, seed: int, release_sample: int = 20, edit_share: float = 0.1
) -> Report:
    """The whole fuzz on a running cluster; the features and partitions come from sinfo."""
    sinfo = fuzz.run(["sinfo", "-h", "-N", "-o", "%R|%f|%N"]).stdout.split()
    partitions = sorted({line.split("|")[0] for line in sinfo})
    features = sorted({f for line in sinfo for f in line.split("|")[1].split(",") if f != "(null)"})
    nodes = sorted({line.split("|")[2] for line in sinfo})
    types = sorted(fuzz.model.types)
    rng = random.Random(seed)
    rewritten: list[str] = []
    held: list[str] = []
    for _ in range(requests):
        request = random_request(rng, types, features, partitions, nodes)
        accepted = fuzz.submit(request)
        if accepted is None:
            continue
        job_id, outcomes = accepted
        held.append(job_id)
        if len(request.components) == 1 and rng.random() < edit_share:
            gres, lists = random_edit(rng, nodes)
            fuzz.edit(job_id, outcomes[0].job, gres, lists)
        elif any("gpumem" in c.get("gres", "") or "gpucore" in c.get("gres", "") for c in request.components):
            rewritten.append(job_id)
    if "UP" not in fuzz.run(["scontrol", "ping"]).stdout:
        fuzz.report.miss("slurmctld down", None, "scontrol ping")
    sample = sorted(rng.sample(rewritten, min(release_sample, len(rewritten))), key=int)
    others = [j for j in held if j not in sample]
    for start in range(0, len(others), 200):
        fuzz.run(["scancel", *others[start : start + 200]])
    fuzz.release_and_wait(sample)
    if sample:
        fuzz.run(["scancel", *sample])
    return fuzz.report
