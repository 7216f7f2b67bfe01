"""A render never drops nodes silently (issue 9): an inventory cut short but still valid YAML would
otherwise write a slurm.conf without the nodes it lost."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.core.errors import OutputError
from slurm_hetero.core.writefile import write_atomic
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.nodes import slurm_nodes
from slurm_hetero.render import removal
from slurm_hetero.slurm.gresconf import GresConfError, declared_devices, declared_nodes
from tests.conftest import REPO

EXAMPLE = REPO / "gres_conf" / "examples" / "mixed.yaml"


def render(inventory: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    args = ["gres", "render", "--inventory", str(inventory), "--out", str(out), "--slurm-release", "22.05"]
    result = CliRunner().invoke(cli, [*args, *extra])
    return result.exit_code, result.stdout, result.stderr


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def cut_short(tmp_path: Path, keep: int) -> Path:
    """The example inventory with only its first `keep` nodes: still valid YAML, still an inventory."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["nodes"] = data["nodes"][:keep]
    path = tmp_path / "cut.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_declared_nodes_reads_node_lines_of_both_files() -> None:
    text = (
        "# NodeName=commented\nNodeName=DEFAULT CPUs=4\n  nodename=gpu-[1-3],login Name=gpu\n"
        "NodeName=ALL Name=gpumem Count=1\nPartitionName=p Nodes=other\nNodeName=gpu-2 Weight=1\n"
    )
    assert declared_nodes(text) == {"gpu-1", "gpu-2", "gpu-3", "login"}
    for name in ("mixed.gres.conf.example", "mixed.slurm-nodes.conf.example"):
        text = (REPO / "gres_conf" / "examples" / name).read_text()
        assert declared_nodes(text) == {"a100n1", "l40sn1", "ascendn1"}
    with pytest.raises(GresConfError, match="line 2: NodeName='x\\[1-100000000\\]'"):
        declared_nodes("GresTypes=gpu\nNodeName=x[1-100000000] CPUs=1\n")
    with pytest.raises(GresConfError, match="reversed range"):
        declared_nodes("NodeName=x[9-1]\n")


def test_a_cut_short_inventory_is_refused_naming_the_nodes_and_the_flag(tmp_path: Path) -> None:
    out = tmp_path / "etc"
    assert render(EXAMPLE, out)[0] == 0
    before = snapshot(out)
    code, _, err = render(cut_short(tmp_path, 1), out)
    assert code == 1
    assert err.strip().splitlines() == [
        f"slurm-hetero: {out}: this render would remove 2 nodes (ascendn1, l40sn1) that the files there "
        "name; the inventory lacks them (cut short?). Pass --allow-removal if the removal is meant; "
        "nothing changed"
    ]
    assert snapshot(out) == before  # byte-identical, no backup, no temporary


def test_check_names_the_removal_and_allow_removal_writes_it(tmp_path: Path) -> None:
    out = tmp_path / "etc"
    render(EXAMPLE, out)
    before = snapshot(out)
    cut = cut_short(tmp_path, 2)
    code, diff, err = render(cut, out, "--check")
    assert code == 1 and "-NodeName=ascendn1" in diff
    assert "this render removes 1 node (ascendn1); writing it needs --allow-removal" in err
    assert snapshot(out) == before
    code, _, err = render(cut, out, "--allow-removal")
    assert code == 0, err
    assert declared_nodes((out / "slurm-nodes.conf").read_text()) == {"a100n1", "l40sn1"}
    assert declared_nodes((out / "gres.conf").read_text()) == {"a100n1", "l40sn1"}
    assert render(cut, out, "--check")[:2] == (0, "")  # done: nothing more to remove
    assert render(EXAMPLE, out)[0] == 0  # adding nodes back needs no flag


def test_a_long_removal_is_counted_and_the_first_few_named(tmp_path: Path) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["nodes"] = [data["nodes"][1]]
    data["nodes"][0]["name"] = "gpu-[01-40]"
    full = tmp_path / "full.yaml"
    full.write_text(yaml.safe_dump(data))
    out = tmp_path / "etc"
    assert render(full, out)[0] == 0
    data["nodes"][0]["name"] = "gpu-[01-03]"
    full.write_text(yaml.safe_dump(data))
    code, _, err = render(full, out)
    assert code == 1 and "remove 37 nodes (gpu-04, gpu-05, gpu-06, gpu-07, gpu-08 and 32 more)" in err


def test_renaming_a_node_is_a_removal(tmp_path: Path) -> None:
    out = tmp_path / "etc"
    render(EXAMPLE, out)
    renamed = tmp_path / "renamed.yaml"
    renamed.write_text(EXAMPLE.read_text().replace("name: l40sn1", "name: l40sn2"))
    code, _, err = render(renamed, out)
    assert code == 1 and "remove 1 node (l40sn1)" in err


def test_files_whose_nodes_cannot_be_read_are_not_replaced_blindly(tmp_path: Path) -> None:
    out = tmp_path / "etc"
    out.mkdir()
    (out / "gres.conf").write_text("NodeName=a[1-2 Name=gpu\n")
    code, _, err = render(EXAMPLE, out)
    assert code == 1 and "cannot tell which nodes it names" in err and "--allow-removal" in err
    assert render(EXAMPLE, out, "--allow-removal")[0] == 0


def test_the_guard_runs_inside_the_set_writer_and_changes_nothing_when_it_refuses(tmp_path: Path) -> None:
    old = {
        tmp_path / "gres.conf": "NodeName=n[1-2] Name=gpu\n",
        tmp_path / "slurm-nodes.conf": "NodeName=n[1-2]\n",
    }
    write_atomic(old, backup=False)
    before = snapshot(tmp_path)
    new = {tmp_path / "gres.conf": "NodeName=n1 Name=gpu\n", tmp_path / "slurm-nodes.conf": "NodeName=n1\n"}
    with pytest.raises(OutputError, match=r"remove 1 node \(n2\)"):
        write_atomic(new, guard=removal.guard(new, tmp_path))
    assert snapshot(tmp_path) == before
    seen: list[dict[Path, str | None]] = []
    assert write_atomic(old, guard=lambda current: seen.append(dict(current))) == []  # unchanged: not asked
    assert seen == []
    assert write_atomic(new, guard=lambda current: seen.append(dict(current)))
    assert seen == [{p: t for p, t in old.items()}]


def test_declared_devices_counts_device_files_per_host_and_skips_counts() -> None:
    text = (
        "NodeName=n[1-2] Name=gpu Type=x File=/dev/x[0-1] Cores=0-3\n"
        "NodeName=n1 Name=gpumem Count=80G Flags=CountOnly\nNodeName=n1 Name=mps Count=100 # File=/dev/y\n"
        "nodename=n2 name=gpu file=/dev/x2\nNodeName=DEFAULT Name=gpu File=/dev/z\n"
    )
    assert declared_devices(text) == {
        "n1": [("/dev/x0", "/dev/x1")],
        "n2": [("/dev/x0", "/dev/x1"), ("/dev/x2",)],
    }
    with pytest.raises(GresConfError, match="line 1: unbalanced brackets in hostlist ./dev/x"):
        declared_devices("NodeName=n1 Name=gpu File=/dev/x[0-\n")


def test_an_inventory_that_lost_devices_of_a_kept_node_is_refused(tmp_path: Path) -> None:
    """Adversarial find (issue 9): a truncated inventory dropped a node's last devices unguarded."""
    out = tmp_path / "etc"
    assert render(EXAMPLE, out)[0] == 0
    before = snapshot(out)
    data = yaml.safe_load(EXAMPLE.read_text())
    ascend = next(n for n in data["nodes"] if n["name"] == "ascendn1")
    ascend["devices"] = ascend["devices"][:5]
    for device in ascend["devices"]:
        device.pop("links", None)
    cut = tmp_path / "cut.yaml"
    cut.write_text(yaml.safe_dump(data, sort_keys=False))
    code, _, err = render(cut, out)
    assert code == 1, err
    assert (
        "would remove 3 devices (ascendn1:/dev/davinci5, ascendn1:/dev/davinci6, ascendn1:/dev/davinci7) "
        "that the files there name" in err
    )
    assert snapshot(out) == before
    data["nodes"] = [ascend]
    cut.write_text(yaml.safe_dump(data, sort_keys=False))
    code, _, err = render(cut, out, "--check")
    assert code == 1 and "removes 2 nodes (a100n1, l40sn1) and 3 devices (ascendn1:/dev/davinci5" in err
    assert render(cut, out, "--allow-removal")[0] == 0
    assert sum(map(len, declared_devices((out / "gres.conf").read_text())["ascendn1"])) == 5
    assert render(EXAMPLE, out)[0] == 0  # devices back: no flag


def test_turning_sharing_off_removes_no_device(tmp_path: Path) -> None:
    """adv47 G27: the per-device shard lines name each gpu file again, so dropping them counted
    as removing the devices themselves."""
    out = tmp_path / "etc"
    assert render(EXAMPLE, out, "--share", "l40s=4G")[0] == 0
    assert "Name=shard Count=11 File=/dev/nvidia1" in (out / "gres.conf").read_text()
    code, _, err = render(EXAMPLE, out)
    assert code == 0, err
    assert "Name=shard" not in (out / "gres.conf").read_text()


def test_a_device_moved_to_another_file_is_a_removal_and_a_new_type_is_not(tmp_path: Path) -> None:
    out = tmp_path / "etc"
    render(EXAMPLE, out)
    data = yaml.safe_load(EXAMPLE.read_text())
    l40s = next(n for n in data["nodes"] if n["name"] == "l40sn1")
    l40s["devices"][1]["file"] = "/dev/nvidia5"
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(data, sort_keys=False))
    code, _, err = render(changed, out)
    assert code == 1 and "remove 1 device (l40sn1:/dev/nvidia1)" in err
    l40s["devices"][1]["file"] = "/dev/nvidia1"
    for device in l40s["devices"]:
        device["type"] = "l40s_site"
    changed.write_text(yaml.safe_dump(data, sort_keys=False))
    code, _, err = render(changed, out)
    assert code == 0, err
    assert "Type=l40s_site" in (out / "gres.conf").read_text()


# -- job-submit render: the hook table declares its hosts and devices (issue 9 adversarial pass, T2)


def render_hook(inventory: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    args = ["job-submit", "render", "--inventory", str(inventory), "--out", str(out)]
    result = CliRunner().invoke(cli, [*args, *extra])
    return result.exit_code, result.stdout, result.stderr


def test_the_hook_table_declares_its_hosts_and_devices_as_gres_conf_reads_them(tmp_path: Path) -> None:
    out = tmp_path / "etc"
    assert render_hook(EXAMPLE, out)[0] == 0
    table = (out / "slurm_hetero_tables.lua").read_text()
    assert declared_nodes(table) == {"a100n1", "l40sn1", "ascendn1"}
    assert declared_devices(table) == {
        "a100n1": [tuple(f"/dev/nvidia{i}" for i in range(4))],
        "l40sn1": [("/dev/nvidia0", "/dev/nvidia1")],
        "ascendn1": [tuple(f"/dev/davinci{i}" for i in range(8))],
    }
    for name in ("job_submit.lua", "cli_filter.lua", "slurm_hetero_srun.lua"):
        assert declared_nodes((out / name).read_text()) == set()  # only the table declares


def test_a_declaration_folds_nodes_with_the_same_devices() -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    l40s = next(n for n in data["nodes"] if n["name"] == "l40sn1")
    data["nodes"] = [{**l40s, "name": "l40s-[01-40]"}, {**l40s, "name": "l40s-41"}, data["nodes"][0]]
    data["nodes"][1]["devices"] = l40s["devices"][:1]
    nodes = slurm_nodes(inventory.inventory_from_dict(data, "x.yaml"), load_catalog())
    assert removal.declaration(nodes) == [
        "NodeName=l40s-[01-40] Name=gpu Type=l40s File=/dev/nvidia[0-1]",
        "NodeName=l40s-41 Name=gpu Type=l40s File=/dev/nvidia0",
        "NodeName=a100n1 Name=gpu Type=a100_80g File=/dev/nvidia[0-3]",
    ]


@pytest.mark.parametrize("command", [render, render_hook], ids=["gres", "job-submit"])
def test_both_render_commands_refuse_a_cut_short_inventory_with_the_same_words(
    tmp_path: Path, command: Callable[..., tuple[int, str, str]]
) -> None:
    """Before: job-submit render wrote a table with 1 device type where 3 were, dropping ascendn1
    and l40sn1 silently, while gres render refused the same file."""
    out = tmp_path / "etc"
    assert command(EXAMPLE, out)[0] == 0
    before = snapshot(out)
    code, _, err = command(cut_short(tmp_path, 1), out)
    assert code == 1
    assert err.strip().splitlines() == [
        f"slurm-hetero: {out}: this render would remove 2 nodes (ascendn1, l40sn1) that the files there "
        "name; the inventory lacks them (cut short?). Pass --allow-removal if the removal is meant; "
        "nothing changed"
    ]
    assert snapshot(out) == before


def test_job_submit_check_names_the_removal_and_allow_removal_writes_it(tmp_path: Path) -> None:
    out = tmp_path / "etc"
    render_hook(EXAMPLE, out)
    before = snapshot(out)
    data = yaml.safe_load(EXAMPLE.read_text())
    ascend = next(n for n in data["nodes"] if n["name"] == "ascendn1")
    ascend["devices"] = [{k: v for k, v in d.items() if k != "links"} for d in ascend["devices"][:6]]
    cut = tmp_path / "cut.yaml"
    cut.write_text(yaml.safe_dump(data, sort_keys=False))
    code, diff, err = render_hook(cut, out, "--check")
    assert code == 1 and "-NodeName=ascendn1 Name=gpu Type=ascend910b3 File=/dev/davinci[0-7]" in diff
    assert (
        "this render removes 2 devices (ascendn1:/dev/davinci6, ascendn1:/dev/davinci7); "
        "writing it needs --allow-removal" in err
    )
    code, _, err = render_hook(cut, out)
    assert code == 1 and "would remove 2 devices (ascendn1:/dev/davinci6, ascendn1:/dev/davinci7)" in err
    assert snapshot(out) == before
    assert render_hook(cut, out, "--allow-removal")[0] == 0
    assert sum(map(len, declared_devices((out / "slurm_hetero_tables.lua").read_text())["ascendn1"])) == 6
    assert render_hook(cut, out, "--check")[:2] == (0, "")  # done: nothing more to remove
    assert render_hook(EXAMPLE, out)[0] == 0  # devices back: no flag


def test_a_table_from_before_declarations_is_replaced_without_the_flag(tmp_path: Path) -> None:
    """A table rendered by an earlier release declares nothing, so nothing can be found dropped:
    the first render after an upgrade writes the declaration the next one checks against."""
    out = tmp_path / "etc"
    render_hook(EXAMPLE, out)
    table = out / "slurm_hetero_tables.lua"
    text = table.read_text()
    table.write_text(text[: text.index("--[==[")] + text[text.index("return {") :])
    assert render_hook(cut_short(tmp_path, 1), out)[0] == 0
    assert declared_nodes(table.read_text()) == {"a100n1"}
