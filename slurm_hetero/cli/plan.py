"""`slurm-hetero plan`: the uneven training layout of a model on a mix of devices (the solver is
`engine.layout`), printed as a table or JSON."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from slurm_hetero.cli import FILE, cli, inventory_option
from slurm_hetero.cli.catalog import Column, number, render_table
from slurm_hetero.cli.options import (
    DEGREE,
    MAX_GBS,
    MIN_GBS,
    MIN_MFU,
    Count,
    FiniteFloat,
    cost_options,
    cost_settings,
    describe,
    model_options,
)
from slurm_hetero.cli.plots import plot_step
from slurm_hetero.core.devicespec import Catalog
from slurm_hetero.core.errors import RequestError
from slurm_hetero.engine import comm
from slurm_hetero.engine.comm import Member
from slurm_hetero.engine.devicegroups import (
    MFU,
    device_groups,
    estimated_types,
    with_network,
    with_shapes,
)
from slurm_hetero.engine.layout import (
    DEFAULT_TP_SIZES,
    MAX_DEVICES,
    NETWORK_GBS,
    NO_FULL_LAYOUT,
    OBJECTIVES,
    SEARCHED_MICRO_BATCHES,
    DeviceGroup,
    Layout,
    LayoutKind,
    LayoutSpec,
    PipelinePlan,
    StagePlan,
    assign_ranks,
    check_batch,
    solve,
)
from slurm_hetero.engine.modelcost import GIB, CostSettings, usable_tp_sizes
from slurm_hetero.engine.shapes import MAX_TYPES
from slurm_hetero.engine.stagecost import fallback_degree, measured_shape
from slurm_hetero.inventory import document as inventory_io
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.modelconfigs import layer_costs_for, load_model
from slurm_hetero.inventory.nodes import slurm_nodes, with_site_types
from slurm_hetero.launch.calibrate import Profile, load_profile
from slurm_hetero.launch.runnable import MIXED_TP, plan_note, search_kinds
from slurm_hetero.slurm import syntax
from slurm_hetero.vendors import vendor_traits

_DEVICE = re.compile(r"([A-Za-z0-9][A-Za-z0-9_\-.]{0,63}):([0-9]+)")


def parse_devices(text: str) -> list[tuple[str, int]]:
    """`TYPE:N[,TYPE:N...]` as (type, count) pairs, types lower-cased."""
    given, out = f"--devices {syntax.text(text)}", []
    items = text.split(",", MAX_TYPES)  # the rest of a longer list stays one item: counted, not read
    if len(items) > MAX_TYPES:
        raise RequestError(given, f"at most {MAX_TYPES} TYPE:N entries can be planned")
    for item in items:
        match = _DEVICE.fullmatch(item.strip())
        if not match or int(match[2]) < 1:
            raise RequestError(
                given,
                f"bad entry {syntax.text(item.strip())}; expected TYPE:N[,TYPE:N...] "
                "with N >= 1, e.g. a100:8,ascend910b3:8",
            )
        out.append((match[1].lower(), int(match[2]) if len(match[2]) <= 12 else MAX_DEVICES + 1))
        if any(name == out[-1][0] for name, _ in out[:-1]):
            raise RequestError(
                given, f"{syntax.text(out[-1][0])} is given twice; give each type once with its total count"
            )
    if sum(n for _, n in out) > MAX_DEVICES:
        raise RequestError(given, f"at most {MAX_DEVICES:,} devices can be planned")
    return out


def _span(values: list[int]) -> str:
    return str(values[0]) if min(values) == max(values) else f"{min(values)}-{max(values)}"


def _stage_row(index: int, plan: PipelinePlan, s: StagePlan, ranks: list[int]) -> dict[str, Any]:
    per_replica = [plan.micro_batches(j) for j in range(len(plan.samples))]
    return {
        "pipeline": index,
        "index": s.index,
        "type": s.type,
        "group": s.group,
        "tp": s.tp,
        "dp": s.dp,
        "ranks": ranks,
        "layer_start": s.layer_start,
        "layer_end": s.layer_end,
        "layers": s.layer_end - s.layer_start,
        "micro_batch": plan.micro_batch,
        "micro_batches": max(per_replica),
        "replicas": len(plan.samples),
        "samples": list(plan.samples),
        "recompute": s.recompute,
        "fwd_s": s.fwd_s,
        "bwd_s": s.bwd_s,
        "time_per_micro_batch_s": s.fwd_s + s.bwd_s,
        "p2p_s": s.p2p_s,
        "allreduce_s": s.allreduce_s,
        "memory_bytes": s.memory_bytes,
        "capacity_bytes": s.capacity_bytes,
        "memory_gib": round(s.memory_bytes / GIB, 3),
        "capacity_gib": round(s.capacity_bytes / GIB, 3),
        "_micro_batches": _span(per_replica),
        "_samples": _span(list(plan.samples)),
    }


def _rows(layout: Layout) -> list[dict[str, Any]]:
    plan_of = {p.first_replica + j: i for i, p in enumerate(layout.pipelines) for j in range(len(p.samples))}
    ranks: dict[tuple[int, int], list[int]] = {}  # of each (pipeline shape, stage)
    staged = layout.kind == LayoutKind.STAGED  # one pipeline; `replica` is the stage's dp rank
    for a in assign_ranks(layout):
        ranks.setdefault((0 if staged else plan_of[a.replica], a.stage), []).append(a.rank)
    return [
        _stage_row(i, p, s, sorted(ranks[i, s.index]))
        for i, p in enumerate(layout.pipelines)
        for s in p.stages
    ]


def catalog_estimates(
    devices: str,
    catalog: Catalog,
    measured: Mapping[str, float] | None = None,
    unrated: bool = False,
    mfu: float = MFU,
) -> dict[str, str]:
    """`--devices` types whose throughput is an estimate, not measured, with how it was derived;
    `unrated`: also those with no TFLOPS at all, with plan's stderr warning (for `--json`)."""
    out: dict[str, str] = {}
    allocation = parse_devices(devices)
    for name, _ in allocation:
        spec = catalog.by_type(name)
        if spec and spec.estimate and spec.type not in (measured or {}) and name not in (measured or {}):
            out[spec.type] = " ".join((spec.derivation or "").split())
    if unrated:
        estimated, note = estimated_types(allocation, catalog, measured, mfu)
        out.update({t: note for t in estimated})
    return out


def layout_notes(layout: Layout) -> list[str]:
    """The solver's notes, and why launch would refuse the layout."""
    refused = plan_note(layout)
    return [*layout.notes, *([refused] if refused else [])]


def layout_document(
    layout: Layout, model: str, seq: int, settings: CostSettings, estimates: Mapping[str, str] | None = None
) -> dict[str, Any]:
    stages, even = _rows(layout), layout.even_step_s
    return {
        "estimates": dict(estimates or {}),
        "model": model,
        "seq": seq,
        "attention": settings.attention,
        "settings": dataclasses.asdict(settings),
        "global_batch": layout.global_batch,
        "kind": str(layout.kind),
        "world_size": layout.world_size,
        "replicas": layout.replicas,
        "bound_step_s": layout.bound_step_s,
        "even_step_s": even,
        "predicted_step_s": layout.predicted_step_s,
        "efficiency": layout.efficiency,
        "even_over_predicted": None if even is None else even / layout.predicted_step_s,
        "cost_per_step_usd": layout.cost_per_step_usd,
        "left_out": list(layout.left_out),
        "notes": layout_notes(layout),
        "stages": [{k: v for k, v in row.items() if not k.startswith("_")} for row in stages],
    }


COLUMNS: list[Column] = [
    ("PIPE", lambda r: r["pipeline"], str, True),
    ("STAGE", lambda r: r["index"], str, True),
    ("TYPE", lambda r: r["type"], str, False),
    ("RANKS", lambda r: syntax.ranges(r["ranks"], stepped=True), str, False),
    ("TP", lambda r: r["tp"], str, True),
    ("DP", lambda r: r["dp"], str, True),
    ("LAYERS", lambda r: f"{r['layer_start']}-{r['layer_end'] - 1}", str, False),
    ("RECOMPUTE", lambda r: r["recompute"], str, True),
    ("SAMPLES", lambda r: r["_samples"], str, True),
    ("MB_SIZE", lambda r: r["micro_batch"], str, True),
    ("MB/STEP", lambda r: r["_micro_batches"], str, True),
    ("MS/MB", lambda r: r["time_per_micro_batch_s"] * 1000, number(1), True),
    ("MEM_GIB", lambda r: r["memory_gib"], number(1), True),
    ("CAP_GIB", lambda r: r["capacity_gib"], number(1), True),
]


def render_layout(
    layout: Layout, model: str, seq: int, settings: CostSettings, estimates: Mapping[str, str] | None = None
) -> str:
    rows, even = _rows(layout), layout.even_step_s
    versus = (
        "does not fit memory" if even is None else f"{even:.2f} s ({even / layout.predicted_step_s:.2f}x)"
    )
    head = (
        f"{model}, seq {seq}, global batch {layout.global_batch} on {layout.world_size} devices: "
        f"{layout.kind} layout, {layout.replicas} replicas; {describe(settings)}"
    )
    tail = (
        f"step: predicted {layout.predicted_step_s:.2f} s, even split {versus}, "
        f"bound {layout.bound_step_s:.2f} s, efficiency {layout.efficiency:.3f}"
    )
    if layout.cost_per_step_usd is not None:
        tail += f"; ${layout.cost_per_step_usd:.4f} per step"
    if layout.left_out:
        forced = any(n.startswith(NO_FULL_LAYOUT) for n in layout.notes)
        why = f"{NO_FULL_LAYOUT} (note below)" if forced else "better by the objective without it"
        tail += f"; left idle: {', '.join(layout.left_out)} (--leave-out: {why})"
    notes = [f"note: {n}" for n in layout_notes(layout)]
    notes += [
        f"estimate: {t} throughput is derived or third-party: {d}" for t, d in (estimates or {}).items()
    ]
    return "\n".join([head, render_table(rows, COLUMNS), tail, *notes])


def with_measured_notes(layout: Layout) -> Layout:
    """Notes on the stages beyond a `--measured` profile's points (tp degree, micro-batch size)."""
    out: dict[str, None] = {}  # each note once
    for p in layout.pipelines:
        for s in p.stages:
            g, b = layout.groups[s.group], p.micro_batch / s.dp
            if not g.speeds:
                continue
            found = measured_shape(g.speeds, s.tp, b)
            if found is None:
                base = fallback_degree(g.speeds, s.tp)
                reduces = ", tensor-parallel all-reduces priced by the model" if s.tp > 1 else ""
                out[
                    f"measured: {g.type} has no tp {s.tp} point: the speed measured at tp {base} on the "
                    f"GEMM-size curve{reduces}"
                ] = None
            elif found[1] == "extrapolated":
                sizes = sorted(m for t, m, _ in g.speeds if t == s.tp)
                out[
                    f"measured: {g.type} tp {s.tp} micro-batch {b:g} is outside the measured sizes "
                    f"({sizes[0]:g}-{sizes[-1]:g}): extrapolated at the nearest one's speed"
                ] = None
    return dataclasses.replace(layout, notes=(*layout.notes, *out))


def build_spec(
    options: Mapping[str, Any], profile: Profile, catalog: Catalog
) -> tuple[LayoutSpec, int, CostSettings]:
    check_batch(options["global_batch"], options["micro_batch"], options["micro_batches"])
    allocation, model, seq = parse_devices(options["devices"]), options["model"], options["seq"]
    model_spec = load_model(model)
    length = seq if seq is not None else model_spec.max_positions
    settings = cost_settings(options)
    costs = layer_costs_for(model, length, settings)
    rates = profile.tflops
    groups = device_groups(allocation, catalog, rates, options["per_node"], options["mfu"], profile.gemm_half)
    groups = with_shapes(groups, profile.shapes, catalog, costs)
    network = options["network_gbs"] or NETWORK_GBS
    if options["network_gbs"] is None:
        groups = with_network(groups, profile.network, catalog)
    if note := estimated_types(allocation, catalog, rates, options["mfu"])[1]:
        click.echo(f"slurm-hetero: warning: {note}", err=True)
    given = options["micro_batch"]
    spec = LayoutSpec(
        groups,
        costs,
        options["global_batch"],
        given or 1,
        options["micro_batches"],
        network,
        label=model,
        tp_sizes=usable_tp_sizes(model_spec, DEFAULT_TP_SIZES),
        micro_batch_sizes=() if given else SEARCHED_MICRO_BATCHES,
        pair_gbs=cross_type_gbs(groups, catalog, network),
        objective=options["objective"],
        leave_out=options["leave_out"],
        kinds=search_kinds(tuple(LayoutKind(k) for k in options["kinds"]), given),
        mixed_tp=MIXED_TP,
    )
    return spec, length, settings


def cross_type_gbs(
    groups: Sequence[DeviceGroup], catalog: Catalog, network_gbs: float
) -> dict[tuple[int, int], float]:
    """Between each pair of types on different nodes: the communicator `launch` would choose
    without listed RDMA NICs, over the slower type's network."""
    traits = vendor_traits()
    members = []
    for i, g in enumerate(groups):
        spec = catalog.by_type(g.type)
        assert spec is not None
        if spec.vendor not in traits:  # in the catalog (for fit), but no vendor module: no communicator
            raise RequestError(
                f"--devices {g.type}",
                f"vendor {spec.vendor} has no slurm-hetero vendor support (discovery, launch, "
                f"communicators), so it cannot be planned; vendors: {', '.join(sorted(traits))}",
            )
        members.append([Member(traits[spec.vendor], spec, f"node{i}")])
    return comm.pair_gbs(members, {}, [g.nic_gbs or network_gbs for g in groups])


@cli.command("plan")
@click.option("--devices", required=True, help="Allocation as TYPE:N[,TYPE:N...] (Slurm GRES types).")
@inventory_option(
    help="Cluster inventory: TYPE may then be any Type= name it uses (facts from the device model).",
    type=FILE,
)
@model_options()
@click.option(
    "--micro-batches",
    type=Count(min=1),
    help="Micro-batches per step of an average replica (sets the micro-batch size).",
)
@cost_options(solver=True)
@click.option("--per-node", type=DEGREE, default=8, show_default=True, help="Devices per node.")
@click.option(
    "--network-gbs",
    type=FiniteFloat(MIN_GBS, MAX_GBS),
    help="Per-device bandwidth between nodes, GB/s one way, for every type [default: a --measured "
    f"type's network_gbs, else {NETWORK_GBS:g}].",
)
@click.option(
    "--mfu",
    type=FiniteFloat(MIN_MFU, 1),
    default=MFU,
    show_default=True,
    help="Share of the catalog bf16/fp16 peak a device sustains.",
)
@click.option("--measured", type=FILE, help="YAML of type: sustained TFLOPS.")
@click.option(
    "--objective",
    type=click.Choice(OBJECTIVES),
    default="time",
    show_default=True,
    help="Least step time, or least cost per step (catalog price_per_hour_usd).",
)
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    type=click.Choice([k.value for k in LayoutKind]),
    help="Layout family to consider (repeatable) [default: the ones launch runs: pipeline, data].",
)
@click.option(
    "--leave-out", is_flag=True, help="Leave a device type idle when the step is better without it."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--plot", type=FILE, help="Draw one step (.png, .svg, .pdf).")
def plan(measured: Path | None, as_json: bool, plot: Path | None, **options: Any) -> None:
    """Lay out training of a model on a mix of devices: pipeline across types, data and tensor
    parallel inside them, layers and batch split unevenly by speed and memory."""
    catalog, profile, model = load_catalog(), load_profile(measured), options["model"]
    if options["inventory_path"] is not None:  # the site's Type= names, with their models' facts
        catalog = with_site_types(catalog, slurm_nodes(inventory_io.load(options["inventory_path"]), catalog))
    spec, length, settings = build_spec(options, profile, catalog)
    layout = with_measured_notes(solve(spec))
    estimates = catalog_estimates(options["devices"], catalog, profile.tflops, as_json, options["mfu"])
    if plot is not None:
        plot_step(layout, plot)
    click.echo(
        json.dumps(layout_document(layout, model, length, settings, estimates), indent=2)
        if as_json
        else render_layout(layout, model, length, settings, estimates)
    )
