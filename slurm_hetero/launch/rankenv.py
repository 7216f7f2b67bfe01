"""Every rank's layout document (`slurm_hetero.layout.RankLayout`) and environment, once the step
is laid out. Pure."""

from __future__ import annotations

import hashlib
import itertools
import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from slurm_hetero.core.model import Nic
from slurm_hetero.engine import comm
from slurm_hetero.engine.comm import Communicator, Member
from slurm_hetero.engine.layout import Layout, RankAssignment
from slurm_hetero.layout import GroupSpec, RankLayout

if TYPE_CHECKING:
    from slurm_hetero.launch.plan import LaunchOptions, Site


def group_keys(a: RankAssignment) -> dict[str, tuple[int, int]]:
    """Which tp, dp and pp group a rank is in."""
    return {"tp": (a.replica, a.stage), "dp": (a.stage, a.tp_rank), "pp": (a.replica, a.tp_rank)}


def group_ranks(ranked: Sequence[RankAssignment]) -> dict[str, dict[tuple[int, int], list[int]]]:
    """Members of every group, by group name and key (`group_keys`)."""
    out: dict[str, dict[tuple[int, int], list[int]]] = {"tp": {}, "dp": {}, "pp": {}}
    for a in ranked:
        for name, key in group_keys(a).items():
            out[name].setdefault(key, []).append(a.rank)
    return out


class Groups:
    """Group membership, one communicator per group, and each replica's (samples, sample offset)."""

    def __init__(
        self,
        ranked: Sequence[RankAssignment],
        nodes: Sequence[Site],
        override: str | None,
        samples: Sequence[tuple[int, int]],
    ) -> None:
        self.ranked, self.members, self.samples = ranked, group_ranks(ranked), samples
        self.site_of = {r: s for s in nodes for r in range(s.first_rank, s.first_rank + s.tasks)}
        self.nics: dict[str, Sequence[Nic]] = {s.name: s.node.record.nics for s in nodes}
        self.override = override
        self._cache: dict[tuple[int, ...], Communicator] = {}
        # One GroupSpec per group and NIC set, shared by its members (else quadratic in the ranks)
        self._specs: dict[tuple[str, tuple[int, int], str, tuple[Nic, ...]], GroupSpec] = {}
        self._local: dict[tuple[tuple[int, int], str], list[int]] = {}  # dp group's members by vendor
        for key, ranks in self.members["dp"].items():
            for r in ranks:
                self._local.setdefault((key, self.site_of[r].vendor.name), []).append(r)

    def communicator(self, ranks: Sequence[int]) -> Communicator:
        key = tuple(ranks)
        if key not in self._cache:
            sites = [self.site_of[r] for r in ranks]
            members = [Member(s.vendor, s.spec, s.name) for s in sites]
            self._cache[key] = comm.choose(members, self.nics, self.override)
        return self._cache[key]

    def specs(self, a: RankAssignment) -> tuple[GroupSpec, ...]:
        """The groups rank `a` is in (tp, dp, pp) and, where the dp group spans vendors, `dp_local`:
        its members of `a`'s vendor (`slurm_hetero.training` reduces gradients hierarchically)."""
        nics = tuple(self.site_of[a.rank].node.record.nics)
        keys = group_keys(a)
        out = [self._spec(name, key, "", self.members[name][key], nics) for name, key in keys.items()]
        dp = self.members["dp"][keys["dp"]]
        vendor = self.site_of[a.rank].vendor.name
        local = self._local[keys["dp"], vendor]
        if len(local) < len(dp):
            out.append(self._spec("dp_local", keys["dp"], vendor, local, nics))
        return tuple(out)

    def _spec(
        self, name: str, key: tuple[int, int], vendor: str, ranks: Sequence[int], nics: tuple[Nic, ...]
    ) -> GroupSpec:
        cache_key = (name, key, vendor, nics)
        if cache_key not in self._specs:
            chosen = self.communicator(ranks)
            env = comm.communicator_env(chosen, nics)
            spec = GroupSpec(name, tuple(sorted(ranks)), chosen.backend, str(chosen.kind), env)
            self._specs[cache_key] = spec
        return self._specs[cache_key]


@dataclass(frozen=True)
class PlanSummary:
    """What every rank's document repeats about the whole plan (without a model: nothing predicted)."""

    kind: str
    model: str
    global_batch: int
    num_layers: int
    num_replicas: int
    predicted_step_s: float = 0.0
    even_step_s: float | None = None
    bound_step_s: float = 0.0
    efficiency: float = 0.0


def summary_of(layout: Layout, model: str) -> PlanSummary:
    figures = (layout.predicted_step_s, layout.even_step_s, layout.bound_step_s, layout.efficiency)
    layers = layout.pipelines[0].stages[-1].layer_end
    return PlanSummary(str(layout.kind), model, layout.global_batch, layers, layout.replicas, *figures)


def replica_samples(counts: Sequence[int]) -> list[tuple[int, int]]:
    """(samples, first global sample) of each replica: contiguous slices in replica order."""
    return list(zip(counts, itertools.accumulate([0, *counts[:-1]])))


# The fields a rank's document copies from its assignment (the plan's summary gives its own).
FROM_ASSIGNMENT = tuple(
    "rank local_rank stage replica tp_rank tp_size layer_start layer_end micro_batch micro_batches "
    "grad_weight recompute".split()
)


def rank_document(
    a: RankAssignment, site: Site, plan: PlanSummary, groups: Groups, options: LaunchOptions, world: int
) -> RankLayout:
    """The SLURM_HETERO_LAYOUT document of one rank (version 1; keys fixed by the contract)."""
    samples, offset = groups.samples[a.replica]
    by_stage = {groups.ranked[r].stage: r for r in groups.members["pp"][(a.replica, a.tp_rank)]}
    costs = options.costs
    return RankLayout(
        **{name: getattr(a, name) for name in FROM_ASSIGNMENT},
        **{f.name: getattr(plan, f.name) for f in fields(plan)},
        world_size=world,
        local_world_size=site.tasks,
        node=site.name,
        type=site.type,
        vendor=site.vendor.name,
        num_stages=a.pp_size,
        samples=samples,
        sample_offset=offset,
        dtype=costs.dtype,
        zero_stage=costs.zero_stage,
        attention=costs.attention,
        recompute_mode=costs.recompute,
        prev_rank=by_stage.get(a.stage - 1),
        next_rank=by_stage.get(a.stage + 1),
        groups=groups.specs(a),
    )


# MASTER_PORT range 10000-32767: below Linux's ephemeral ports (32768-60999 by default), which any
# outgoing connection on the node (gloo's, slurmd's) may hold when rank 0 comes to listen.
PORT_BASE, PORT_SPAN = 10000, 22768
STEPS_PER_JOB = 64  # steps of one job that get ports apart from every other job's first steps


def master_port(job_id: str, step_id: int) -> int:
    """A port every rank derives alike from the job and step ids: the first 64 steps of 355
    consecutive jobs all get different ports."""
    job = int(job_id) if job_id.isdigit() and len(job_id) <= 10 else 0
    return PORT_BASE + (job * STEPS_PER_JOB + step_id) % PORT_SPAN


# What torchrun sets that a launcher without an elastic agent cannot know: dropped from the
# inherited environment, so a stale one never tells a framework it runs under torchelastic.
TORCHRUN_UNKNOWN_PREFIX = "TORCHELASTIC_"
TORCHRUN_ROLE = "default"  # torchrun's role name when none is given


def rank_env(
    doc: RankLayout, master: tuple[str, int], plan_id: str, layout_dir: str, node: tuple[int, int]
) -> dict[str, str]:
    """The torch.distributed variables (`node`: the rank's node index in Slurm's order, and the
    step's nodes), the layout file and the communicators' variables. Every torchrun variable the
    launcher knows is set, so none leaks in from the user's environment."""
    env = {
        "RANK": str(doc.rank),
        "WORLD_SIZE": str(doc.world_size),
        "LOCAL_RANK": str(doc.local_rank),
        "LOCAL_WORLD_SIZE": str(doc.local_world_size),
        "GROUP_RANK": str(node[0]),
        "NODE_RANK": str(node[0]),
        "GROUP_WORLD_SIZE": str(node[1]),
        "ROLE_NAME": TORCHRUN_ROLE,
        "ROLE_RANK": str(doc.rank),
        "ROLE_WORLD_SIZE": str(doc.world_size),
        "MASTER_ADDR": master[0],
        "MASTER_PORT": str(master[1]),
        "SLURM_HETERO_LAYOUT": f"{layout_dir}/rank-{doc.rank}.json",
        "SLURM_HETERO_PLAN_ID": plan_id,
    }
    for group in doc.groups:
        env.update(group.env)
    return env


def plan_id(
    summary: PlanSummary,
    ranked: Sequence[RankAssignment],
    nodes: Sequence[Site],
    options: LaunchOptions,
    master: tuple[str, int],
) -> str:
    """A digest of what decides every rank's document and environment, equal on every rank exactly
    when their inputs agree, and linear in the ranks (`layout_dir` left out: the node's $TMPDIR)."""
    row = operator.attrgetter(*(f.name for f in fields(RankAssignment)))
    table = {
        "summary": [getattr(summary, f.name) for f in fields(summary)],
        "ranks": [row(a) for a in ranked],
        "nodes": [
            [s.name, s.type, s.vendor.name, s.tasks, [repr(n) for n in s.node.record.nics]] for s in nodes
        ],
        "options": repr(replace(options, layout_dir="")),
        "master": list(master),
    }
    text = json.dumps(table, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
