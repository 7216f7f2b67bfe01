"""Every rank's layout document and environment for one Slurm step. Pure: JobEnv, inventory and
catalog in, `LaunchPlan` out; every rank computes the same plan from the same inputs (the rules:
docs/launch.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Union

from slurm_hetero.core import hostlist
from slurm_hetero.core.devicespec import Catalog, DeviceSpec
from slurm_hetero.core.errors import LaunchPlanError, NodeLaunchError, RequestError
from slurm_hetero.core.model import ClusterInventory, SlurmDevice, SlurmNode, VendorTraits
from slurm_hetero.engine import comm
from slurm_hetero.engine.comm import Member
from slurm_hetero.engine.devicegroups import (
    MeasuredShapes,
    estimate_note,
    gemm_half,
    resolve_measured,
    spec_group,
    sustained_tflops,
    with_network,
    with_shapes,
)
from slurm_hetero.engine.layout import (
    DEFAULT_TP_SIZES,
    SEARCHED_MICRO_BATCHES,
    Layout,
    LayoutKind,
    LayoutSpec,
    RankAssignment,
    assign_ranks,
    check_batch,
    check_limits,
    even_bounds,
    layout_from_split,
    solve,
)
from slurm_hetero.engine.modelcost import SOLVER_SETTINGS, CostSettings, usable_tp_sizes
from slurm_hetero.engine.schedule import DeviceGroup, Shape, StepModel
from slurm_hetero.engine.shapes import candidate_shapes
from slurm_hetero.inventory.modelconfigs import layer_costs_for, load_model
from slurm_hetero.inventory.nodes import NodeBuilder, host_records
from slurm_hetero.launch.rankenv import (
    TORCHRUN_UNKNOWN_PREFIX,
    Groups,
    PlanSummary,
    master_port,
    plan_id,
    rank_document,
    rank_env,
    replica_samples,
    summary_of,
)
from slurm_hetero.launch.runnable import MIXED_TP, search_kinds, unrunnable_reason
from slurm_hetero.layout import RankLayout
from slurm_hetero.slurm import syntax
from slurm_hetero.slurm.jobenv import SLURM_VISIBLE, SLURM_VISIBLE_OF_FLAG, JobEnv, TaskDevices
from slurm_hetero.vendors import vendor_traits

GIB = 2**30


@dataclass(frozen=True)
class LaunchOptions:
    """What the user asked for; `measured` maps device type to sustained TFLOPS."""

    model: str | None
    global_batch: int = 512
    seq: int | None = None
    micro_batch: int | None = None  # None: searched (SEARCHED_MICRO_BATCHES); 1 without a model
    costs: CostSettings = SOLVER_SETTINGS
    measured: Mapping[str, float] = field(default_factory=dict)
    gemm_half: Mapping[str, float] = field(default_factory=dict)  # calibrate's GEMM size curve by type
    shapes: Mapping[str, MeasuredShapes] = field(default_factory=dict)  # the per-shape profile by type
    network: Mapping[str, float] = field(default_factory=dict)  # the profile's network_gbs by type
    even: bool = False
    backend_override: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    network_gbs: float | None = None
    tp_sizes: tuple[int, ...] = DEFAULT_TP_SIZES  # as `plan` searches (inside nodes only)
    layout_dir: str = "/tmp/slurm-hetero"
    kinds: tuple[LayoutKind, ...] = ()  # families asked for; () what `plan` searches (`runnable`)

    def __post_init__(self) -> None:
        """Checked here once, for the CLI and library callers alike."""
        counts = {"--global-batch": self.global_batch, "--seq": self.seq, "--micro-batch": self.micro_batch}
        for flag, count in counts.items():
            if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
                raise LaunchPlanError(f"{flag}: must be a positive integer, got {count!r}")
        check_batch(self.global_batch, self.micro_batch)
        if not self.tp_sizes or any(t < 1 for t in self.tp_sizes):
            raise LaunchPlanError(f"--tp-sizes: must be positive integers, got {self.tp_sizes!r}")
        rates = {
            "--network-gbs": self.network_gbs,
            **{f"--measured {k}": v for k, v in self.measured.items()},
        }
        for flag, rate in rates.items():
            if rate is not None and not (isinstance(rate, (int, float)) and 0 < rate < math.inf):
                raise LaunchPlanError(f"{flag}: must be a finite number > 0, got {rate!r}")
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise LaunchPlanError(f"--master-port: must be in 1-65535, got {self.master_port!r}")
        if self.master_addr is not None:
            try:
                syntax.address(self.master_addr)
            except ValueError as e:
                raise LaunchPlanError(f"--master-addr: {e}") from None


@dataclass(frozen=True)
class Site:
    """One node of the step (devices of one type)."""

    name: str
    index: int
    first_rank: int
    tasks: int
    node: SlurmNode

    @property
    def devices(self) -> tuple[SlurmDevice, ...]:
        return self.node.devices

    @property
    def spec(self) -> DeviceSpec:
        return self.devices[0].spec

    @property
    def type(self) -> str:
        return self.devices[0].type

    @property
    def vendor(self) -> VendorTraits:
        return self.devices[0].vendor


@dataclass(frozen=True)
class RankPlan:
    rank: int
    node: str
    type: str
    stage: int
    layout: RankLayout
    env: dict[str, str]


@dataclass(frozen=True)
class LaunchPlan:
    job_id: str
    step_id: int
    layout: Layout | None  # None without a model (even data parallel, nothing predicted)
    ranks: tuple[RankPlan, ...]
    plan_id: str
    notes: tuple[str, ...] = ()  # warnings every rank derives alike (estimated device speeds)


# -- nodes ----------------------------------------------------------------------------------------


def node_records(inventory: ClusterInventory, names: Sequence[str], catalog: Catalog) -> dict[str, SlurmNode]:
    found = host_records(inventory, names)
    if missing := [n for n in names if n not in found]:
        raise LaunchPlanError(
            f"no inventory record for {', '.join(missing)} (nodes of this step: {', '.join(names)}); "
            "add them (slurm-hetero discover, inventory merge) or pass --inventory"
        )
    builder = NodeBuilder(catalog, vendor_traits())
    return {name: builder.node(record) for name, record in found.items()}


def _site(job: JobEnv, index: int, node: SlurmNode) -> Site:
    name, tasks = job.nodes[index], job.tasks_per_node[index]
    types = node.types()
    if not node.devices:
        raise LaunchPlanError(f"{name} has no healthy devices in the inventory")
    if len(types) > 1:
        raise LaunchPlanError(
            f"{name} has devices of several types ({', '.join(types)}); launch plans one type per node: "
            "run the step on nodes of one type (srun -w/-x, or --constraint)"
        )
    if tasks > len(node.devices):
        raise LaunchPlanError(
            f"{name} runs {tasks} tasks but has {len(node.devices)} {types[0]} devices; one task per device"
        )
    return Site(name, index, job.first_ranks[index], tasks, node)


StepNodes = Union[ClusterInventory, Mapping[str, SlurmNode]]  # a runtime alias: no `|` on 3.9


def sites(job: JobEnv, inventory: StepNodes, catalog: Catalog) -> list[Site]:
    """The step's nodes in JobEnv order with their records."""
    if isinstance(inventory, ClusterInventory):
        records: Mapping[str, SlurmNode] = node_records(inventory, job.nodes, catalog)
    else:
        records = inventory
    return [_site(job, i, records[name]) for i, name in enumerate(job.nodes)]


# -- the solver's input and answer ----------------------------------------------------------------


def _by_type(nodes: Sequence[Site]) -> dict[str, list[Site]]:
    out: dict[str, list[Site]] = {}
    for site in nodes:
        out.setdefault(site.type, []).append(site)
    return out


def _device_group(group: Sequence[Site], tflops: float, half: float, options: LaunchOptions) -> DeviceGroup:
    """One type's devices; between nodes at `--network-gbs`, else its nodes' slowest NIC."""
    spec = group[0].spec
    known = [d.device.memory_mib for s in group for d in s.devices if d.device.memory_mib]
    memory = min(known) * 2**20 if known else spec.memory_gib * GIB
    per_node = tuple(s.tasks for s in group)
    nic = options.network_gbs or min(comm.nic_gbs(s.node.record.nics) for s in group)
    return spec_group(spec, group[0].type, group[0].vendor.name, per_node, tflops, half, memory, nic)


def sequence_length(options: LaunchOptions) -> int:
    assert options.model is not None
    return options.seq if options.seq is not None else load_model(options.model).max_positions


def layout_spec(nodes: Sequence[Site], catalog: Catalog, options: LaunchOptions) -> tuple[LayoutSpec, str]:
    """The solver's input for the step, and the warning for device speeds it had to estimate."""
    assert options.model is not None
    site_types = {s.type: s.spec.type for s in nodes}
    measured = resolve_measured(options.measured, catalog, site_types)
    halves = resolve_measured(options.gemm_half, catalog, site_types)
    specs = [g[0].spec for g in _by_type(nodes).values()]
    speeds, estimated = sustained_tflops(specs, measured)
    costs = layer_costs_for(options.model, sequence_length(options), options.costs)
    groups = with_shapes(
        [
            _device_group(g, v, gemm_half(g[0].spec, halves, measured), options)
            for g, v in zip(_by_type(nodes).values(), speeds)
        ],
        options.shapes,
        catalog,
        costs,
        site_types,
    )
    if options.network_gbs is None:  # as plan: the profile's figure, where it has one, for the NIC's
        groups = with_network(groups, options.network, catalog, site_types)
    spec = LayoutSpec(
        groups,
        costs,
        options.global_batch,
        options.micro_batch or 1,
        tp_sizes=usable_tp_sizes(load_model(options.model), options.tp_sizes),
        label=options.model,
        micro_batch_sizes=() if options.micro_batch else SEARCHED_MICRO_BATCHES,
        pair_gbs=comm.pair_gbs(
            [[Member(s.vendor, s.spec, s.name) for s in g] for g in _by_type(nodes).values()],
            {s.name: s.node.record.nics for s in nodes},
            [g.nic_gbs for g in groups],
            options.backend_override,
        ),
        kinds=search_kinds(options.kinds, options.micro_batch),
        mixed_tp=MIXED_TP,
    )
    return spec, estimate_note(estimated, specs, measured)


def _root_cause(spec: LayoutSpec, nodes: Sequence[Site], options: LaunchOptions, error: RequestError) -> str:
    per_type = ", ".join(
        f"{g.count}x {g.type} ({g.memory_bytes / GIB:.0f} GiB usable each) on "
        f"{hostlist.fold(s.name for s in nodes if s.type == g.type)}"
        for g in spec.groups
    )
    head = f"root cause: {options.model} (seq {sequence_length(options)}, global batch {spec.global_batch})"
    if not candidate_shapes(spec):  # no layout family uses every device: memory is not the cause
        head = f"cannot plan {options.model}"
    return f"{head} on {sum(g.count for g in spec.groups)} devices ({per_type}): {error.reason}"


def even_layout(spec: LayoutSpec, chosen: Layout) -> Layout:
    """The chosen shape with equal layers per stage and equal samples per replica (`--even`)."""
    lines = tuple(tuple((s.group, s.tp) for s in p.stages) for p in chosen.pipelines)
    replicas = tuple(len(p.samples) for p in chosen.pipelines)
    shape = Shape(str(chosen.kind), lines, replicas, chosen.pipelines[0].micro_batch)
    model = StepModel(spec.groups, spec.costs, shape, spec.global_batch, spec.network_gbs, spec.pair_gbs)
    bounds = even_bounds(spec.costs.layers, shape.stages)
    q, r = divmod(spec.global_batch, sum(replicas))
    samples = tuple(q + (j < r) for j in range(sum(replicas)))
    step = model.simulate(bounds, samples)
    if math.isinf(step):
        raise LaunchPlanError(
            f"root cause: the even split of {spec.label} ({shape.stages} stages of "
            f"{spec.costs.layers // shape.stages}+ layers) does not fit memory; drop --even"
        )
    return layout_from_split(spec, model, bounds, samples, step)


def solve_step(spec: LayoutSpec, nodes: Sequence[Site], options: LaunchOptions) -> Layout:
    """The layout `plan` prints for this allocation and options, or one line: the limits first,
    then `root cause:`, then what the training runtime cannot run (`runnable`)."""
    check_limits(spec)
    try:
        chosen = solve(spec)
    except RequestError as e:
        raise LaunchPlanError(_root_cause(spec, nodes, options, e)) from e
    if (reason := unrunnable_reason(chosen)) is not None:
        raise LaunchPlanError(
            f"cannot run the {chosen.kind} layout planned for {spec.label}: {reason}; "
            "leave out --kind to search what slurm_hetero.training runs"
        )
    return even_layout(spec, chosen) if options.even else chosen


def assignments(layout: Layout, nodes: Sequence[Site]) -> list[RankAssignment]:
    """The solver's assignments renumbered to Slurm ranks: a node's k-th solver rank is its k-th task."""
    ordered = [s for g in _by_type(nodes).values() for s in g]  # the solver's order: by group, node
    mapping = [r for s in ordered for r in range(s.first_rank, s.first_rank + s.tasks)]
    site_of = {r: s for s in nodes for r in range(s.first_rank, s.first_rank + s.tasks)}
    out = []
    for a in assign_ranks(layout):
        rank = mapping[a.rank]
        site = site_of[rank]
        out.append(replace(a, rank=rank, node=site.index, local_rank=rank - site.first_rank))
    return sorted(out, key=lambda a: a.rank)


# -- devices and the plan -------------------------------------------------------------------------


def check_devices_on_node(site: Site, on_node: int | None) -> None:
    """One task per device: more tasks would share one, fewer would leave some idle."""
    if on_node is None or site.tasks == on_node:
        return
    effect = (
        "tasks would share a device"
        if site.tasks > on_node
        else f"each rank sees only its own device, so {on_node - site.tasks} would sit idle"
    )
    raise NodeLaunchError(
        f"{site.name} runs {site.tasks} task{'s' if site.tasks != 1 else ''} but Slurm gave the step "
        f"{on_node} device(s) there "
        f"(SLURM_GPUS_ON_NODE={on_node}); {effect}. One task per device: "
        f"srun --ntasks-per-node={on_node}, or ask for --gpus-per-node={site.tasks}"
    )


def _gpu_index(site: Site, indexes: Sequence[int], local_rank: int) -> int:
    if len(indexes) == 1:
        index = indexes[0]  # bound per task (--gpus-per-task=1 --gpu-bind=single:1)
    elif len(indexes) >= site.tasks:
        index = indexes[local_rank]
    else:
        raise NodeLaunchError(
            f"{site.name}: {site.tasks} tasks share {len(indexes)} allocated devices; "
            "launch one task per device (srun --ntasks-per-node=N --gpus-per-node=N)"
        )
    if not 0 <= index < len(site.devices):
        raise NodeLaunchError(f"GPU index {index} is beyond the {len(site.devices)} devices of {site.name}")
    return index


def device_env(site: Site, local_rank: int, bound: TaskDevices | None) -> dict[str, str]:
    """The visible-device variables of one rank: Slurm's, narrowed to the rank's device, and the
    vendor's. Without `bound` (other nodes, --simulate), the node's first devices in order."""
    bound = TaskDevices() if bound is None else bound
    check_devices_on_node(site, bound.on_node)
    indexes = bound.gpu_indexes
    index = _gpu_index(site, indexes or range(site.tasks), local_rank)
    vendor = site.devices[index].vendor
    slurm_names = SLURM_VISIBLE_OF_FLAG.get(site.node.gpu_env, ())
    if not indexes:
        env = {name: str(index) for name in slurm_names}
    else:
        position = list(indexes).index(index)
        env = {}
        for name in slurm_names:
            items = bound.visible.get(name, "").split(",")
            if len(items) == len(indexes):
                env[name] = items[position]
    device = site.devices[index]
    if vendor.visible_devices_env:
        env[vendor.visible_devices_env] = vendor.visible_id(device.device)
        env.update({name: "0" for name in vendor.relative_visible_envs})  # inside the one device above
    return env


def process_env(environ: Mapping[str, str], rank_env: Mapping[str, str]) -> dict[str, str]:
    """The command's environment: the launcher's, less other vendors' visible-device variables
    (srun copies the submitting host's) and stale TORCHELASTIC_* ones, then the rank's own."""
    every = [(t.visible_devices_env, *t.relative_visible_envs) for t in vendor_traits().values()]
    foreign = {*SLURM_VISIBLE, *(name for names in every for name in names if name)} - set(rank_env)
    kept = {
        k: v for k, v in environ.items() if k not in foreign and not k.startswith(TORCHRUN_UNKNOWN_PREFIX)
    }
    return {**kept, **rank_env}


def plain_assignments(nodes: Sequence[Site], global_batch: int, micro_batch: int) -> list[RankAssignment]:
    """Without a model: every rank a replica, the global batch split evenly."""
    world = sum(s.tasks for s in nodes)
    q, r = divmod(global_batch, world)
    out = []
    for site in nodes:
        for local in range(site.tasks):
            rank = site.first_rank + local
            n = q + (rank < r)
            out.append(
                RankAssignment(
                    rank, local, site.index, site.type, 0, rank, 0, 0, 1, 1, world, 0, 0,
                    micro_batch, math.ceil(n / micro_batch), n, n / global_batch, 0,
                )
            )  # fmt: skip
    return out


def _modelled(
    nodes: Sequence[Site], catalog: Catalog, options: LaunchOptions
) -> tuple[Layout | None, list[RankAssignment], list[tuple[int, int]], PlanSummary, tuple[str, ...]]:
    if options.model is None:
        ranked = plain_assignments(nodes, options.global_batch, options.micro_batch or 1)
        samples = replica_samples([a.samples for a in ranked])
        return None, ranked, samples, PlanSummary("data", "", options.global_batch, 0, len(ranked)), ()
    spec, note = layout_spec(nodes, catalog, options)
    layout = solve_step(spec, nodes, options)
    summary = summary_of(layout, options.model)
    samples = replica_samples([n for p in layout.pipelines for n in p.samples])
    return layout, assignments(layout, nodes), samples, summary, (note,) if note else ()


def build_plan(
    job: JobEnv,
    step_id: int,
    inventory: StepNodes,
    catalog: Catalog,
    options: LaunchOptions,
    bound: TaskDevices | None = None,
    only: int | None = None,
) -> LaunchPlan:
    """Every rank's document and environment, or with `only` that rank's alone (every document is
    quadratic in the ranks); `bound` is what Slurm bound on this task's node."""
    nodes = sites(job, inventory, catalog)
    layout, ranked, samples, summary, notes = _modelled(nodes, catalog, options)
    groups = Groups(ranked, nodes, options.backend_override, samples)
    master = (options.master_addr or job.nodes[0], options.master_port or master_port(job.job_id, step_id))
    digest = plan_id(summary, ranked, nodes, options, master)
    plans = []
    for a in ranked if only is None else [ranked[only]]:
        site = groups.site_of[a.rank]
        doc = rank_document(a, site, summary, groups, options, job.world_size)
        env = rank_env(doc, master, digest, options.layout_dir, (site.index, len(nodes)))
        env.update(device_env(site, a.local_rank, bound if site.name == job.node_name else None))
        plans.append(RankPlan(a.rank, site.name, site.type, a.stage, doc, env))
    return LaunchPlan(job.job_id, step_id, layout, tuple(plans), digest, notes)
