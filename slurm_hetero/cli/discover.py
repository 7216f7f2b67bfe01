"""`slurm-hetero discover`: one node's inventory, live or from captured tool output."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from slurm_hetero.cli import TEXT, cli, from_file_option, models_dir_option, path_type
from slurm_hetero.cli.options import Count
from slurm_hetero.core import hostlist
from slurm_hetero.core.errors import HeteroError, InventoryError
from slurm_hetero.core.model import ClusterInventory
from slurm_hetero.core.units import parse_size
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.discover import discover_node
from slurm_hetero.inventory.fanout import fan_out
from slurm_hetero.vendors import all_vendors


def node_facts(options: dict[str, Any]) -> dict[str, int]:
    """The NodeName facts given on the command line, within the inventory schema's bounds."""
    given = {k: options.get(k) for k in ("cpus", "sockets", "cores_per_socket", "threads_per_core")}
    facts = {k: v for k, v in given.items() if v is not None}
    bounds = inventory.shipped_schema()["definitions"]["node"]["properties"]
    if (memory := options.get("real_memory")) is not None:
        facts["real_memory_mib"] = parse_size(memory, "--real-memory", bounds["real_memory_mib"]["maximum"])
    for key, value in facts.items():
        low, high = bounds[key]["minimum"], bounds[key]["maximum"]
        if not low <= value <= high:
            flag = "--" + key.removesuffix("_mib").replace("_", "-")
            unit = " MiB" if key.endswith("_mib") else ""
            raise InventoryError(f"{flag} {value:,}{unit}: a node record holds {low:,} to {high:,}{unit}")
    return facts


def _fan_out(spec: str | None, remote_command: str) -> None:
    result = fan_out(spec, shlex.split(remote_command))
    for name in sorted(result.lines):
        click.echo(result.lines[name])
    if result.failed:
        for name, why in sorted(result.failed.items()):
            click.echo(f"slurm-hetero: {name}: {why}", err=True)
        raise HeteroError(
            f"{len(result.failed)} of {len(result.failed) + len(result.lines)} nodes gave no inventory: "
            f"{hostlist.fold(result.failed)}"
        )


@cli.command()
@click.option(
    "--vendor", "vendors", multiple=True, help="Only this vendor (repeatable); fails if it cannot run."
)
@from_file_option(help="Parse captured tool output instead of running the tool (repeatable).")
@click.option(
    "--node",
    "node_name",
    help="NodeName to record (default: $SLURMD_NODENAME under srun, else the short host name).",
)
@models_dir_option(help="Extra catalog directory with site models (*.yaml).")
@click.option("--cpus", type=Count(min=1), help="NodeName CPUs= (with --from-file; live: read here).")
@click.option("--sockets", type=Count(min=1), help="NodeName Sockets=.")
@click.option("--cores-per-socket", type=Count(min=1), help="NodeName CoresPerSocket=.")
@click.option("--threads-per-core", type=Count(min=1), help="NodeName ThreadsPerCore=.")
@click.option("--real-memory", help="NodeName RealMemory= (MiB, or with a M/G/T suffix).")
@click.option(
    "--host-root",
    type=path_type(file_okay=False),
    help="With --from-file: a copy of the node's /sys/devices/system/cpu and /proc/meminfo under this "
    "directory (DIR/sys/..., DIR/proc/meminfo); gives CPUs, sockets, cores, threads and memory as "
    "slurmd -C would, and turns the captured CPU affinity into Slurm core indices (Cores=).",
)
@click.option(
    "--model",
    type=TEXT,
    help="With --vendor and --from-file: the device model where the captures name none (Hygon's "
    "default hy-smi table, NVIDIA's `nvidia-smi topo -m` alone); memory comes from the catalog.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON line (safe to collect from many srun tasks).")
@click.option("--list-vendors", is_flag=True, help="List registered vendors and whether they can run here.")
@click.option(
    "--nodes",
    "fan_nodes",
    type=TEXT,
    metavar="HOSTLIST",
    help="Discover on these nodes (srun where Slurm can run a step, ssh for drained/down ones); "
    "prints one JSON line per node.",
)
@click.option("--all", "fan_all", is_flag=True, help="As --nodes, on every node Slurm knows.")
@click.option(
    "--remote-command",
    type=TEXT,
    default="slurm-hetero",
    show_default=True,
    help="How to run slurm-hetero on the nodes (--nodes/--all).",
)
def discover(from_files: tuple[Path, ...], host_root: Path | None, as_json: bool, **o: Any) -> None:
    """Read this node's accelerators and topology into an inventory (YAML, or JSON with --json).

    Live, the node's CPUs, sockets, cores, threads and memory come from the kernel, as slurmd -C
    reports them. With --from-file they come from --host-root (the node's sysfs and meminfo copied
    here), --cpus/--sockets/--cores-per-socket/--threads-per-core/--real-memory (these win), else
    from `scontrol show node` when Slurm knows the node."""
    if o["list_vendors"]:
        for vendor in all_vendors():
            state = vendor.unavailable_reason or ("available" if vendor.affinity() > 0 else "tools not found")
            click.echo(f"{vendor.name:<10} {','.join(vendor.tools) or '-':<24} {state}")
        return
    if o["fan_nodes"] or o["fan_all"]:
        return _fan_out(None if o["fan_all"] else o["fan_nodes"], o["remote_command"])
    if host_root is not None and not from_files:
        raise HeteroError("--host-root reads a captured node's topology; use it with --from-file")
    catalog = load_catalog(o["models_dirs"])
    node = discover_node(
        catalog, o["vendors"], from_files, o["node_name"], node_facts(o), host_root, o["model"]
    )
    text = inventory.dumps(ClusterInventory(nodes=(node,)), as_json=as_json)
    click.echo(text.replace("\n", "") if as_json else text, nl=as_json)
