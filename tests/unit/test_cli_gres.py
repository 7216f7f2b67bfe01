"""The admin workflow through the CLI: discover -> merge -> render -> --check, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_hetero.cli import cli
from tests.conftest import REPO
from tests.gresreader import parse_gres_conf

EXAMPLE = REPO / "gres_conf" / "examples" / "mixed.yaml"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_render_writes_both_files_then_check_is_clean(tmp_path: Path) -> None:
    code, _, err = run("gres", "render", "--inventory", str(EXAMPLE), "--out", str(tmp_path))
    assert code == 0, err
    devices = [e for e in parse_gres_conf((tmp_path / "gres.conf").read_text()) if e.name == "gpu"]
    assert len(devices) == 14
    assert "GresTypes=gpu,gpumem,gpucore" in (tmp_path / "slurm-nodes.conf").read_text()
    code, out, _ = run("gres", "render", "--inventory", str(EXAMPLE), "--out", str(tmp_path), "--check")
    assert (code, out) == (0, "")


def test_check_prints_a_diff_and_exits_1_and_rerender_keeps_a_backup(tmp_path: Path) -> None:
    run("gres", "render", "--inventory", str(EXAMPLE), "--out", str(tmp_path))
    gres = tmp_path / "gres.conf"
    gres.write_text(gres.read_text().replace("Cores=0-3", "Cores=0-1"))
    code, out, _ = run("gres", "render", "--inventory", str(EXAMPLE), "--out", str(tmp_path), "--check")
    assert code == 1 and out.startswith("--- ") and "-NodeName=a100n1" in out and "+NodeName=a100n1" in out
    edited = gres.read_text()
    code, _, _ = run("gres", "render", "--inventory", str(EXAMPLE), "--out", str(tmp_path))
    assert code == 0
    backups = list(tmp_path.glob("gres.conf.*.bak"))
    assert len(backups) == 1 and backups[0].read_text() == edited
    assert not list(tmp_path.glob(".*.tmp"))


def test_json_summary(tmp_path: Path) -> None:
    code, out, _ = run("gres", "render", "--inventory", str(EXAMPLE), "--out", str(tmp_path), "--json")
    summary = json.loads(out)
    assert code == 0 and summary["nodes"] == 3 and summary["shapes"] == 3


BAD_INVENTORIES = {
    "malformed.yaml": ("version: 1\nnodes: [ {name: a\n", "malformed YAML"),
    "novendor.yaml": (
        "version: 1\nnodes:\n- name: a\n  devices:\n  - {vendor: acme, model: X1, index: 0, "
        "file: /dev/x0, memory_mib: 1024}\n",
        "unknown vendor 'acme'",
    ),
    "nomodel.yaml": (
        "version: 1\nnodes:\n- name: a\n  devices:\n  - {vendor: nvidia, model: NVIDIA Z9000, "
        "index: 0, file: /dev/nvidia0, memory_mib: 1024}\n",
        "node a: nvidia device 0: model 'NVIDIA Z9000' is not in the catalog",
    ),
    "notype.yaml": (
        "version: 1\nnodes:\n- name: a\n  devices:\n  - {vendor: nvidia, model: X, type: z9000, "
        "index: 0, file: /dev/nvidia0, memory_mib: 1024}\n",
        "node a: nvidia device 0: neither type 'z9000' nor model 'X' is in the catalog",
    ),
    "empty-node.yaml": ("version: 1\nnodes:\n- name: a\n  devices: []\n", "node a has no devices"),
    "badversion.yaml": ("version: 7\nnodes: []\n", "invalid inventory at version"),
    "badfield.yaml": (
        "version: 1\nnodes:\n- name: a\n  devices:\n  - {vendor: nvidia, model: X, index: -1, "
        "file: /dev/nvidia0}\n",
        "invalid inventory at nodes[0].devices[0].index",
    ),
    "dupindex.yaml": (
        "version: 1\nnodes:\n- name: a\n  devices:\n  - {vendor: nvidia, model: NVIDIA A100-SXM4-80GB, "
        "index: 0, file: /dev/nvidia0}\n  - {vendor: nvidia, model: NVIDIA A100-SXM4-80GB, index: 0, "
        "file: /dev/nvidia1}\n",
        "device index listed twice",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_INVENTORIES))
def test_bad_inventories_fail_with_one_line_and_leave_configs_alone(tmp_path: Path, name: str) -> None:
    out = tmp_path / "etc"
    run("gres", "render", "--inventory", str(EXAMPLE), "--out", str(out))
    before = {p.name: p.read_text() for p in out.iterdir()}
    text, expected = BAD_INVENTORIES[name]
    (tmp_path / name).write_text(text)
    code, stdout, stderr = run("gres", "render", "--inventory", str(tmp_path / name), "--out", str(out))
    assert code == 1
    assert stderr.startswith("slurm-hetero: ") and stderr.count("\n") == 1 and "Traceback" not in stderr
    assert expected in stderr
    assert {p.name: p.read_text() for p in out.iterdir()} == before


def test_missing_inventory_file(tmp_path: Path) -> None:
    code, _, err = run("gres", "render", "--inventory", str(tmp_path / "nope.yaml"), "--out", str(tmp_path))
    assert code == 1 and "no such inventory file" in err


def test_unwritable_output_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, _, err = run("gres", "render", "--inventory", str(EXAMPLE), "--out", str(blocker / "etc"))
    assert code == 1 and err.startswith("slurm-hetero: ") and "cannot create output directory" in err
    assert blocker.read_text() == "not a directory"


def test_verbose_shows_the_cause(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("version: 1\nnodes: [\n")
    result = CliRunner().invoke(
        cli, ["-v", "gres", "render", "--inventory", str(tmp_path / "bad.yaml"), "--out", str(tmp_path)]
    )
    assert result.exit_code == 1 and "Traceback" in result.stderr


def test_merge_folds_identical_nodes_and_rejects_duplicates(tmp_path: Path) -> None:
    import yaml

    node = yaml.safe_load(EXAMPLE.read_text())["nodes"][1]
    lines = [json.dumps({"version": 1, "nodes": [dict(node, name=f"l40s-{i:02d}")]}) for i in range(1, 9)]
    (tmp_path / "nodes.jsonl").write_text("\n".join(lines) + "\n")
    code, out, err = run("inventory", "merge", str(tmp_path / "nodes.jsonl"))
    assert code == 0, err
    merged = yaml.safe_load(out)
    assert [n["name"] for n in merged["nodes"]] == ["l40s-[01-08]"]
    (tmp_path / "again.jsonl").write_text(lines[2] + "\n")
    code, _, err = run("inventory", "merge", str(tmp_path / "nodes.jsonl"), str(tmp_path / "again.jsonl"))
    assert code == 1 and "node l40s-03 appears in " in err and "nodes.jsonl:3 and in " in err


def test_template_dir_overrides_one_template_and_bad_templates_fail_cleanly(tmp_path: Path) -> None:
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "gres.conf.j2").write_text(
        "# site header\n{% for g in gres_groups %}{% for l in g.lines %}"
        "NodeName={{ g.nodes }} Name=gpu Type={{ l.type }} File={{ l.file }}\n{% endfor %}{% endfor %}"
    )
    out = tmp_path / "out"
    code, _, err = run(
        "gres", "render", "--inventory", str(EXAMPLE), "--out", str(out), "--template-dir", str(templates)
    )
    assert code == 0, err
    assert (out / "gres.conf").read_text().startswith("# site header\nNodeName=a100n1 Name=gpu Type=a100_80g")
    assert "GresTypes=" in (out / "slurm-nodes.conf").read_text()  # not overridden: the package's
    (templates / "gres.conf.j2").write_text("{{ undefined_thing }}")
    code, _, err = run(
        "gres", "render", "--inventory", str(EXAMPLE), "--out", str(out), "--template-dir", str(templates)
    )
    assert code == 1 and "undefined" in err


@pytest.mark.parametrize(
    ("share", "said"),
    [
        (
            "l40s=100G",
            "shard size l40s=100G (sharing.shard_size or --share): larger than a l40s device (46068M)",
        ),
        ("l4=4G", "shard size l4=4G (sharing.shard_size or --share): no device of type l4; types: a100_80g,"),
    ],
)
def test_a_shard_size_no_device_can_hold_is_refused_and_nothing_written(
    tmp_path: Path, share: str, said: str
) -> None:
    """Issue 26 repro 5: `--share l4=100G` on a 22G L4 rendered no shard lines and said nothing (a
    gpumem:1G job then took a whole L4); a type the cluster lacks was ignored the same way."""
    code, _, err = run(
        "gres", "render", "--inventory", str(EXAMPLE), "--out", str(tmp_path), "--share", share
    )
    assert code == 1 and err.startswith(f"slurm-hetero: {said}") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
    code, _, err = run(
        "gres", "render", "--inventory", str(EXAMPLE), "--out", str(tmp_path), "--share", "l40s=40G"
    )
    assert code == 0 and "Name=shard" in (tmp_path / "gres.conf").read_text(), err


def test_a_type_shared_twice_is_refused_and_nothing_written(tmp_path: Path) -> None:
    """adv26 shdup: `--share l40s=4G --share l40s=8G` kept the last silently."""
    argv = ["gres", "render", "--inventory", str(EXAMPLE), "--out", str(tmp_path)]
    code, _, err = run(*argv, "--share", "l40s=4G", "--share", "l40s=8G")
    assert code == 1 and err == "slurm-hetero: --share l40s: given twice; give each type's shard size once\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("port_base", ["65535", "65534"])
def test_dev_cluster_ports_past_65535_are_refused_and_nothing_written(tmp_path: Path, port_base: str) -> None:
    """adv26b F12: --port-base 65535 on the 3-node example wrote Port=65536 and 65537."""
    local = ("--local-slurmd", "127.0.0.1", "--slurm-release", "22.05")
    out = tmp_path / "out"
    code, _, err = run(
        "gres", "render", "--inventory", str(EXAMPLE), "--out", str(out), *local, "--port-base", port_base
    )
    said = (
        f"slurm-hetero: --port-base {port_base}: 3 slurmd need ports up to {int(port_base) + 2}, past 65535; "
    )
    assert code == 1 and err == said + "use --port-base 65533 or lower\n", err
    assert not out.exists()
    code, _, err = run(
        "gres", "render", "--inventory", str(EXAMPLE), "--out", str(out), *local, "--port-base", "65533"
    )
    assert code == 0 and "Port=65535 " in (out / "slurm-nodes.conf").read_text(), err


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--local-slurmd", "vm\nPartitionName=evil Nodes=ALL"),  # adversarial B84: a second line
        ("--local-slurmd", "vm State=DRAIN"),  # B85: a second key
        ("--local-slurmd", ""),  # an unset "$HOST": not a plain render
        ("--file-root", "/dev/x y"),
        ("--file-root", "dev/fake"),
    ],
)
def test_dev_cluster_values_reach_no_config_line_unchecked(tmp_path: Path, option: str, value: str) -> None:
    argv = ["gres", "render", "--inventory", str(EXAMPLE), "--out", str(tmp_path / "out")]
    argv += ["--local-slurmd", "vm", "--slurm-release", "22.05", option, value]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 1 and result.output.startswith(f"slurm-hetero: {option}: "), result.output
    assert len(result.output.splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (("--port-base", "5000"), "--port-base applies"),
        (("--file-root", "/dev/fake", "--port-base", "17001"), "--port-base and --file-root apply"),
    ],
)
def test_dev_cluster_options_without_local_slurmd_are_refused(
    tmp_path: Path, given: tuple[str, ...], said: str
) -> None:
    """They would be dropped in silence: the rendered lines name no port and the real device files."""
    code, _, err = run("gres", "render", "--inventory", str(EXAMPLE), "--out", str(tmp_path / "out"), *given)
    assert code == 2 and f"Error: {said} only with --local-slurmd (the dev cluster)" in err, err
    assert not (tmp_path / "out").exists()
