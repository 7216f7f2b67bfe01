"""`slurm-hetero launch`: run a training command on a heterogeneous Slurm allocation, one task per
device (the manual: docs/launch.md, `slurm-hetero launch --manual`)."""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from slurm_hetero.core import hostlist, proc
from slurm_hetero.core.devicespec import Catalog
from slurm_hetero.core.errors import InventoryError, NodeLaunchError, RequestError, ToolError
from slurm_hetero.core.model import ClusterInventory, Device, NodeInventory
from slurm_hetero.core.readfile import read_text, unusable_path
from slurm_hetero.core.writefile import write_bytes_atomic
from slurm_hetero.engine.layout import Layout
from slurm_hetero.engine.limits import MAX_DEVICES
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.document import DEFAULT_INVENTORY
from slurm_hetero.launch.plan import (
    LaunchOptions,
    LaunchPlan,
    RankPlan,
    StepNodes,
    build_plan,
    process_env,
)
from slurm_hetero.launch.slurmnodes import gres_records
from slurm_hetero.launch.supervise import LaunchError, Supervisor, end_step
from slurm_hetero.layout import GroupSpec, RankLayout
from slurm_hetero.slurm import scontrol, syntax
from slurm_hetero.slurm.jobenv import GPUS_ON_NODE, JobEnv, parse_job_env
from slurm_hetero.training import checkpoint
from slurm_hetero.vendors import vendor_traits
from slurm_hetero.vendors.base import importable

logger = logging.getLogger(__name__)

# Variables only Slurm sets when it gives the step devices on the node (CUDA_VISIBLE_DEVICES can
# come from the submitting shell).
SLURM_GPU_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", GPUS_ON_NODE)
COLUMNS = tuple("RANK NODE TYPE STAGE LAYERS TP REPLICA SAMPLES MB RECOMP PREV NEXT".split())


@dataclass(frozen=True)
class RunOptions:
    command: tuple[str, ...]
    inventory: Path | None = None  # None: DEFAULT_INVENTORY when installed, else what Slurm knows
    log_dir: Path | None = None
    exec_command: bool = False
    dry_run: bool = False
    simulate: str | None = None
    as_json: bool = False
    resume: Path | None = None  # checkpoint directory: checked, then exported (training.checkpoint.ENV)
    # The solver's layout as `plan` shows it: (table, JSON document); `--dry-run` prints it first
    layout_view: Callable[[Layout], tuple[str, dict[str, Any]]] | None = None


# -- the step -------------------------------------------------------------------------------------

# A step without --model is not planned: it may have twice the planner's MAX_DEVICES (BENCHMARKS.md)
MAX_SIMULATED_RANKS = 2 * MAX_DEVICES
SimulatedNodes = Sequence[tuple[str, str, int]]  # (node, type, tasks), one per node


def parse_simulate(spec: str, most: int = MAX_SIMULATED_RANKS) -> SimulatedNodes:
    """`NODES:TYPE:N[,...]` -> one tuple per node (NODES a host name or a hostlist); N and
    hosts x N (`most`) are bounded before any host is built."""
    where = f"--simulate {syntax.text(spec)}"
    try:
        items = syntax.split_top(spec)
    except ValueError as e:
        raise LaunchError(f"{where}: {e}") from None
    out, ranks = [], 0
    for item in items:
        parts = item.strip().split(":")
        tasks = syntax.whole_number(parts[-1])
        if len(parts) != 3 or not parts[0] or tasks is None or tasks < 1:
            raise LaunchError(
                f"{where}: bad entry {syntax.text(item.strip())}; expected NODE:TYPE:N with N >= 1 "
                "(NODE may be a hostlist such as gn[001-100])"
            )
        if tasks > syntax.MAX_DEVICES_PER_NODE:
            raise LaunchError(
                f"{where}: {tasks:,} devices a node; a node has at most {syntax.MAX_DEVICES_PER_NODE:,}"
            )
        try:
            ranks += hostlist.count(parts[0]) * tasks
            if ranks > most:  # before any host is built
                raise LaunchError(
                    f"{where}: more than {most:,} ranks; a simulated step has at most "
                    f"{MAX_SIMULATED_RANKS:,}, one planned with --model {MAX_DEVICES:,}"
                )
            names = hostlist.expand(parts[0])
        except InventoryError as e:
            raise LaunchError(f"--simulate: {e}") from None
        for name in names:
            try:
                syntax.host_name(name)
            except ValueError as e:
                raise LaunchError(f"--simulate: node {e}") from None
            out.append((name, parts[1].lower(), tasks))
    if len({name for name, _, _ in out}) != len(out):
        raise LaunchError(f"--simulate {spec}: a node is listed twice")
    return out


def simulated_job(nodes: SimulatedNodes) -> JobEnv:
    """The step on the `--simulate` nodes, seen from rank 0."""
    names = tuple(n for n, _, _ in nodes)
    tasks = tuple(n for _, _, n in nodes)
    return JobEnv(0, sum(tasks), 0, names[0], names, tasks, (0,) * len(names), job_id="0")


def _canonical(catalog: Catalog, gres_type: str) -> str:
    spec = catalog.by_type(gres_type)
    return spec.type if spec else gres_type


def simulated_inventory(
    nodes: SimulatedNodes, known: ClusterInventory, catalog: Catalog, source: str | None = None
) -> ClusterInventory:
    """`known` plus a record for each simulated node it lacks (devices from the catalog); a node it
    has must have the simulated type. With `source` (named by the user), a node it lacks is a typo."""
    have = {host: n for n in known.nodes for host in hostlist.expand(n.name)}
    extra = []

    @functools.cache  # one record per shape
    def devices(gres_type: str, count: int) -> tuple[Device, ...]:
        spec = catalog.by_type(gres_type)
        if spec is None:
            known = ", ".join(catalog.types())
            raise LaunchError(f"--simulate: unknown device type {gres_type!r}; known: {known}")
        return tuple(
            Device(spec.vendor, spec.name, i, f"/dev/simulated{i}", spec.memory_mib, spec.type)
            for i in range(count)
        )

    for name, gres_type, count in nodes:
        if name not in have and source is not None:
            hosts = sorted(have)
            listed = ", ".join(hosts[:5]) + (f" and {len(hosts) - 5} more" if len(hosts) > 5 else "")
            raise LaunchError(
                f"--simulate: node {name} is not in the inventory {source} (its nodes: {listed}); "
                "simulate its nodes, or leave out --inventory to simulate catalog devices"
            )
        if name not in have:
            extra.append(NodeInventory(name, devices(gres_type, count)))
            continue
        types = sorted({_canonical(catalog, d.type) for d in have[name].devices})
        if types != [_canonical(catalog, gres_type)]:
            several = "launch plans one type per node: simulate another node"
            fix = several if len(types) > 1 else f"simulate {name}:{types[0]}"
            raise LaunchError(
                f"--simulate {name}:{gres_type}: the inventory has {name} with {', '.join(types)}; {fix}"
            )
    if known.nodes and extra:
        logger.warning("%s", invented_nodes_note(extra))
    return ClusterInventory((*known.nodes, *extra))


def invented_nodes_note(invented: Sequence[NodeInventory]) -> str:
    """One line for the simulated nodes the installed inventory lacks, folded by type."""
    by_type: dict[str, list[str]] = {}
    for node in invented:
        by_type.setdefault(node.devices[0].type, []).append(node.name)
    folded = {gres_type: hostlist.fold(names) for gres_type, names in by_type.items()}
    nodes = hostlist.fold(n.name for n in invented)
    if len(folded) == 1:
        devices = f"catalog {next(iter(folded))} devices"
    else:
        devices = "catalog devices (" + "; ".join(f"{h}: {t}" for t, h in folded.items()) + ")"
    if len(invented) == 1:
        return f"--simulate: {nodes} is not in {DEFAULT_INVENTORY}; it gets {devices}"
    return f"--simulate: {nodes} ({len(invented)} nodes) are not in {DEFAULT_INVENTORY}; they get {devices}"


LAYOUT_PLACEHOLDER = "XXXXXXXX"  # where the rank's private directory gets its unique part


def layout_base(environ: Mapping[str, str]) -> Path:
    """Where layout directories are made: $TMPDIR (absolute), else /tmp."""
    tmpdir = environ.get("TMPDIR") or "/tmp"
    if not os.path.isabs(tmpdir):
        raise LaunchError(f"TMPDIR={tmpdir!r} is not an absolute path; set TMPDIR to a writable directory")
    return Path(tmpdir)


def layout_dir(environ: Mapping[str, str], job_id: str, step: int) -> Path:
    """The layout directory as the plan shows it (`make_layout_dir` makes the real one)."""
    return layout_base(environ) / f"slurm-hetero-{job_id}.{step}-{LAYOUT_PLACEHOLDER}"


def make_layout_dir(environ: Mapping[str, str], job_id: str, step: int, rank: int) -> Path:
    """A fresh directory only this user can enter, of a unique name (never one someone else put)."""
    base = layout_base(environ)
    try:
        return Path(tempfile.mkdtemp(prefix=f"slurm-hetero-{job_id}.{step}-r{rank}-", dir=base))
    except OSError as e:
        raise LaunchError(
            f"cannot make a private layout directory in {base}: {e.strerror}; set TMPDIR to a "
            "directory you can write"
        ) from e


def load_step_inventory(
    options: RunOptions, catalog: Catalog, job: JobEnv, need_facts: bool, simulated: SimulatedNodes | None
) -> StepNodes:
    """The step's node records: the inventory file (plus `simulated` nodes), else `scontrol show node`."""
    path = options.inventory  # `--inventory` (or SLURM_HETERO_INVENTORY), else the installed default
    if path is None and DEFAULT_INVENTORY.exists():
        path = DEFAULT_INVENTORY
    if simulated is not None:
        known = inventory.load(path) if path is not None else ClusterInventory()
        named = options.inventory  # named by the user: it must exist and hold the nodes
        return simulated_inventory(simulated, known, catalog, None if named is None else str(named))
    if path is not None:
        return inventory.load(path)
    try:
        gres = scontrol.show_node_gres(job.nodes)
    except ToolError as e:
        raise LaunchError(
            f"no inventory installed ({DEFAULT_INVENTORY}) and asking Slurm for the nodes' GPUs "
            f"failed ({e}); pass --inventory FILE"
        ) from e
    return gres_records(gres, job.nodes, catalog, need_facts)


def check_step_has_devices(job: JobEnv) -> None:
    """Refuse a step Slurm gave no devices on this node: the command would use other jobs'."""
    devices = job.devices
    if devices.on_node or (devices.on_node is None and devices.source in SLURM_GPU_VARIABLES):
        return
    seen = f"{GPUS_ON_NODE}=0" if devices.on_node == 0 else f"none of {', '.join(SLURM_GPU_VARIABLES)} is set"
    raise LaunchError(
        f"no devices are allocated to this step on {job.node_name} ({seen}); ask for them with "
        "srun --gpus-per-task=1, --gpus-per-node=N or --gres=gpu:N (or the same in sbatch/salloc)"
    )


def plan_step(
    plan_options: LaunchOptions, options: RunOptions, environ: Mapping[str, str], own: bool = False
) -> tuple[JobEnv, LaunchPlan]:
    """Every rank's plan (with `own`, this task's alone)."""
    catalog, simulated = load_catalog(), None
    if options.simulate is not None:
        most = MAX_SIMULATED_RANKS if plan_options.model is None else MAX_DEVICES
        simulated = parse_simulate(options.simulate, most)
        job, bound = simulated_job(simulated), None
    else:
        job = parse_job_env(environ)
        check_step_has_devices(job)
        bound = job.devices
    world = job.world_size
    if plan_options.model is None and plan_options.global_batch < world:
        raise RequestError(
            f"--global-batch {plan_options.global_batch}",
            f"without --model every one of the {world:,} ranks is a data-parallel replica and needs a "
            f"sample; give --global-batch {world} or more",
        )
    plan_options = replace(plan_options, layout_dir=str(layout_dir(environ, job.job_id, job.step_id)))
    inv = load_step_inventory(options, catalog, job, plan_options.model is not None, simulated)
    try:
        return job, build_plan(job, job.step_id, inv, catalog, plan_options, bound, job.rank if own else None)
    except NodeLaunchError:
        if options.simulate is None and not options.dry_run:
            end_step(job.component_steps)  # the other nodes' ranks would start without this one
        raise


# -- describing a plan ----------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(map(str, header)), *[[("-" if v is None else str(v)) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def _row(d: RankLayout) -> tuple[Any, ...]:
    return (
        d.rank,
        d.node,
        d.type,
        f"{d.stage}/{d.num_stages}",
        f"{d.layer_start}-{d.layer_end - 1}" if d.layer_end > d.layer_start else "all",  # all: no --model
        f"{d.tp_rank}/{d.tp_size}",
        d.replica,
        f"{d.samples}@{d.sample_offset}",
        f"{d.micro_batch}x{d.micro_batches}",
        d.recompute,
        d.prev_rank,
        d.next_rank,
    )


def describe(plan: LaunchPlan) -> str:
    docs = [r.layout for r in plan.ranks]
    first, even = docs[0], docs[0].even_step_s
    head = (
        f"no model: even data parallel on {first.world_size} ranks, global batch {first.global_batch} "
        f"(torchrun-like); plan {plan.plan_id}"
        if plan.layout is None
        else (
            f"{first.model}, global batch {first.global_batch}: {first.kind} layout on "
            f"{first.world_size} ranks, predicted step {first.predicted_step_s:.4g} s, even split "
            f"{'does not fit' if even is None else f'{even:.4g} s'}, bound {first.bound_step_s:.4g} s, "
            f"efficiency {first.efficiency:.3f}; plan {plan.plan_id}"
        )
    )
    head += "".join(f"\nwarning: {note}" for note in plan.notes)
    rows = [_row(d) for d in docs]
    groups = {(g.name, g.ranks): g for g in distinct_groups(plan)[0]}
    group_rows = [
        (n, g.backend, g.comm, syntax.ranges(r, stepped=True)) for (n, r), g in sorted(groups.items())
    ]
    env = [f"rank {r.rank}: " + " ".join(f"{k}={v}" for k, v in r.env.items()) for r in plan.ranks]
    return "\n\n".join(
        [
            head,
            _table(COLUMNS, rows),
            _table(("GROUP", "BACKEND", "COMM", "RANKS"), group_rows),  # ranks last: not padded
            "\n".join(env),
        ]
    )


def distinct_groups(plan: LaunchPlan) -> tuple[list[GroupSpec], dict[int, list[int]]]:
    """The plan's groups once each, and each rank's as places in that list."""
    by_id: dict[int, int] = {}
    by_value: dict[tuple[Any, ...], int] = {}
    groups: list[GroupSpec] = []
    places: dict[int, list[int]] = {}
    for r in plan.ranks:
        for g in r.layout.groups:
            if id(g) not in by_id:
                value = (g.name, g.ranks, g.backend, g.comm, tuple(sorted(g.env.items())))
                if value not in by_value:
                    by_value[value] = len(groups)
                    groups.append(g)
                by_id[id(g)] = by_value[value]
        places[r.rank] = [by_id[id(g)] for g in r.layout.groups]
    return groups, places


# What `--dry-run --json` repeats of the first rank's document about the whole plan.
PLAN_KEYS = tuple(
    "kind model global_batch world_size predicted_step_s even_step_s bound_step_s efficiency".split()
)


def plan_document(plan: LaunchPlan) -> dict[str, Any]:
    """`--dry-run --json`: every group once, every rank's document naming its groups by place."""
    first = plan.ranks[0].layout.to_dict()
    groups, places = distinct_groups(plan)
    return {
        "plan_id": plan.plan_id,
        "job_id": plan.job_id,
        "step_id": plan.step_id,
        **{k: first[k] for k in PLAN_KEYS},
        "groups": [g.to_dict() for g in groups],
        "ranks": [
            {
                "rank": r.rank,
                "layout": {**r.layout.to_dict(groups=False), "groups": places[r.rank]},
                "env": r.env,
            }
            for r in plan.ranks
        ],
    }


def dry_run_text(plan: LaunchPlan, options: RunOptions) -> str:
    """`--dry-run`: the layout as `plan` prints it, then every rank."""
    view = None if plan.layout is None or options.layout_view is None else options.layout_view(plan.layout)
    if options.as_json:
        return json.dumps({**({"plan": view[1]} if view else {}), **plan_document(plan)}, indent=2)
    return "\n\n".join([*([view[0]] if view else []), describe(plan)])


# -- running --------------------------------------------------------------------------------------


def write_layout(rank: RankPlan, directory: Path) -> Path:
    """This rank's layout document, `DIRECTORY/rank-R.json`."""
    path = directory / f"rank-{rank.rank}.json"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(rank.layout.to_json())
    except OSError as e:
        raise LaunchError(f"cannot write the layout file {path}: {e.strerror}") from e
    return path


def remove_layout(directory: Path) -> None:
    for entry in directory.glob("rank-*.json"):
        entry.unlink(missing_ok=True)
    try:
        directory.rmdir()
    except OSError as e:
        logger.warning("could not remove %s: %s", directory, e.strerror)


def open_log_files(log_dir: Path, rank: int) -> dict[str, IO[bytes]]:
    files: dict[str, IO[bytes]] = {}
    if (problem := unusable_path(log_dir)) is not None:
        raise LaunchError(f"--log-dir {syntax.text(log_dir)}: {problem}; give a directory you can write")
    if log_dir.exists() and not log_dir.is_dir():
        raise LaunchError(f"--log-dir {log_dir}: not a directory; give a directory you can write")
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        for kind in ("out", "err"):
            files[kind] = open(log_dir / f"rank-{rank}.{kind}", "ab")  # noqa: SIM115
    except OSError as e:
        for f in files.values():
            f.close()
        raise LaunchError(
            f"--log-dir {log_dir}: cannot write rank {rank}'s output there ({e.strerror}); "
            "give a directory you can write"
        ) from e
    return files


def check_master(addr: str) -> None:
    try:
        socket.getaddrinfo(addr, None)
    except OSError as e:
        raise LaunchError(
            f"MASTER_ADDR {addr} does not resolve here ({e}); pass --master-addr HOST_OR_IP"
        ) from e


def note_missing_backends(rank: RankPlan) -> None:
    """Warn when the rank's vendor torch package is not importable (the plan is kept)."""
    traits = vendor_traits().get(rank.layout.vendor)
    package = traits.torch_package if traits else None
    backends = {g.backend for g in rank.layout.groups} - {"gloo", "ucc"}
    if package and backends and not importable(package):
        logger.warning(
            "rank %d: backend %s needs %s, which is not importable on %s; kept as planned",
            rank.rank, ",".join(sorted(backends)), package, rank.node,
        )  # fmt: skip


def launch(plan_options: LaunchOptions, options: RunOptions, environ: Mapping[str, str] | None = None) -> int:
    """Plan, then print, exec or supervise the command; the exit code."""
    environ = os.environ if environ is None else environ
    if options.simulate is not None and not options.dry_run:
        raise LaunchError("--simulate describes an allocation for --dry-run only; add --dry-run")
    # a rank that starts its command builds its own document only, unless rank 0 logs them all (-v)
    whole = options.dry_run or (logger.isEnabledFor(logging.INFO) and environ.get("SLURM_PROCID", "0") == "0")
    job, plan = plan_step(plan_options, options, environ, own=not whole)
    if job.rank == 0:
        for note in plan.notes:
            logger.warning("%s", note)
    if options.dry_run:
        if job.rank == 0:
            print(dry_run_text(plan, options), flush=True)
        return 0
    if not options.command:
        raise LaunchError(
            "no command to run: give it after --, e.g. slurm-hetero launch ... -- python train.py"
        )
    if job.rank == 0:
        logger.info("resolved plan:\n%s", describe(plan))
    rank = next(r for r in plan.ranks if r.rank == job.rank)
    check_master(rank.env["MASTER_ADDR"])
    if options.resume is not None:
        check_resume_dir(options.resume, rank.layout.num_layers or None)
        claim_resume_dir(options.resume, job)
    note_missing_backends(rank)
    logs = (
        open_log_files(options.log_dir, rank.rank) if options.log_dir and not options.exec_command else None
    )
    directory = make_layout_dir(environ, job.job_id, job.step_id, rank.rank)
    done = True  # remove the directory when this function returns (not after a successful exec)
    try:
        env = process_env(environ, rank.env)
        env["SLURM_HETERO_LAYOUT"] = str(write_layout(rank, directory))
        if options.resume is not None:
            env[checkpoint.ENV] = str(options.resume.absolute())
        env.setdefault("PYTHONUNBUFFERED", "1")
        if options.exec_command:
            done = False  # the command replaces the launcher: nothing is left to remove the directory
            return exec_command(options.command, env)
        return Supervisor(rank, options.command, env, job.component_steps, logs).run()
    except BaseException:
        done = True
        raise
    finally:
        if done:
            remove_layout(directory)


def check_resume_dir(directory: Path, num_layers: int | None) -> None:
    try:
        checkpoint.check_resume(directory, num_layers)
    except checkpoint.CheckpointError as e:
        raise LaunchError(f"--resume: {e}") from None


RESUME_OWNER = ".slurm-hetero-job"  # in a --resume DIR: the id of the job resuming and saving there
MAX_OWNER_BYTES = 1024  # a job id and its newline, with room


def claim_resume_dir(directory: Path, job: JobEnv) -> None:
    """Two jobs saving into one `--resume` DIR overwrite each other's steps: DIR names the job
    using it (rank 0 writes it), and another job Slurm still lists is refused."""
    path = directory / RESUME_OWNER
    other = (
        read_text(path, MAX_OWNER_BYTES, "--resume owner", LaunchError, "replace").strip()
        if path.is_file()
        else ""
    )
    ours = {job.job_id, *job.component_job_ids}
    if other and other not in ours and other.isdigit() and _listed(other):
        raise LaunchError(
            f"--resume: {directory} is used by job {other}, which Slurm still lists: give each job its "
            "own checkpoint directory, or cancel that job"
        )
    if job.rank == 0 and other != job.job_id:
        write_bytes_atomic(path, f"{job.job_id}\n".encode(), mode=0o644)


def _listed(job_id: str) -> bool:
    """Whether squeue lists job `job_id`; False when it cannot say."""
    try:
        return bool(proc.run(["squeue", "-h", "-j", job_id, "-o", "%i"], timeout=30).strip())
    except ToolError:  # an ended job's id is "Invalid job id specified"; a hung squeue: unknown
        return False


def exec_command(command: Sequence[str], env: Mapping[str, str]) -> int:
    try:
        os.execvpe(command[0], list(command), dict(env))
    except OSError as e:
        raise LaunchError(f"cannot run {command[0]}: {e.strerror}") from e
    return 0  # not reached
