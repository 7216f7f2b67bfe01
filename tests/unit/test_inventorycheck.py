"""inventorycheck.py, the one validation of an inventory (schema + slurm.syntax): hostile strings
and numbers in every field either render, every output line one Slurm config line of the expected
keys and the generated Lua table loading as Lua with the same id, or are refused with one clear
line. Plus a regression test per adversarial finding."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from slurm_hetero.cli import cli
from slurm_hetero.core.errors import HeteroError
from slurm_hetero.engine.score import compile_model
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.config import load_settings
from slurm_hetero.inventory.nodes import slurm_nodes
from slurm_hetero.render import removal
from slurm_hetero.render.context import RenderOptions, build_context
from slurm_hetero.render.templates import render_configs
from slurm_hetero.slurm import syntax
from slurm_hetero.submit.tables import render_table
from tests.conftest import REPO

EXAMPLE = REPO / "gres_conf" / "examples" / "mixed.yaml"
GRES_KEYS = {"NodeName", "Name", "Type", "File", "Cores", "Links", "Count", "Flags"}
NODE_KEYS = {
    "NodeName",
    "NodeAddr",
    "NodeHostname",
    "Port",
    "CPUs",
    "Sockets",
    "CoresPerSocket",
    "ThreadsPerCore",
    "RealMemory",
    "Gres",
    "Features",
    "Weight",
    "State",
}
PARTITION_KEYS = {"PartitionName", "Nodes", "MaxTime", "State", "LLN", "Default"}
VALUE = re.compile(r"[A-Za-z0-9_.,:\-\[\]/]+")

HOSTILE = [
    "\n",
    "\r",
    "\t",
    " ",
    "=",
    ",",
    "#",
    ";",
    "$(id)",
    "`id`",
    "'",
    '"',
    "\x00",
    "x" * 10_000,
    "é\u2028",
    "",
    "\nNodeName=evil Name=gpu File=/dev/sda",
    "[",
    "]",
    "[1-100000000]",
    "..",
    "//",
]
STRING_FIELDS = [
    ("node", "name"),
    ("node", "features", 0),
    ("device", "vendor"),
    ("device", "model"),
    ("device", "type"),
    ("device", "file"),
    ("device", "cores"),
    ("device", "tool_id"),
    ("device", "driver_version"),
    ("device", "runtime_version"),
    ("device", "health_reason"),
    ("device", "uuid"),
    ("device", "links", 0, "kind"),
]
NUMBER_FIELDS = [
    ("node", "cpus"),
    ("node", "real_memory_mib"),
    ("node", "sockets"),
    ("device", "index"),
    ("device", "memory_mib"),
    ("device", "numa_node"),
    ("device", "links", 0, "peer"),
    ("device", "links", 0, "count"),
]
NUMBERS = [0, -1, 10**30, 10**20, 1.5, 1e3, 2**31, 65536, True, "7", None]


def base_inventory() -> dict[str, Any]:
    data = json.loads(json.dumps(inventory.inventory_to_dict(inventory.load(EXAMPLE))))
    data["nodes"][0]["features"] = ["cuda12.4"]
    a100 = data["nodes"][0]["devices"]
    assert a100[0]["links"][0]["peer"] == 1 and a100[1]["links"][0]["peer"] == 0
    for link in (a100[0]["links"][0], a100[1]["links"][0]):  # links go both ways, with one count
        link["count"] = 4
    return data


BASE = base_inventory()


def put(data: dict[str, Any], path: tuple[Any, ...], value: Any, node: int, device: int) -> None:
    where = data["nodes"][node] if path[0] == "node" else data["nodes"][node]["devices"][device]
    *parents, last = path[1:]
    for key in parents:
        where = where[key]
    where[last] = value


def assert_config_text(text: str, keys: set[str], prefixes: tuple[str, ...]) -> None:
    for line in text.splitlines():
        assert line.isascii() and line.isprintable(), repr(line)
        if not line or line.startswith("#"):
            continue
        assert line.startswith(prefixes), line
        for token in line.split(" "):
            key, sep, value = token.partition("=")
            assert sep and key in keys and VALUE.fullmatch(value), (token, line)


def assert_lua_table(text: str, ident: str) -> None:
    lupa = pytest.importorskip("lupa.lua51")
    lua = lupa.LuaRuntime()
    table = lua.execute(text)
    assert table["id"] == ident  # the whole text is the one table: nothing ran before or after it


def one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message and "\r" not in message and message.isprintable(), repr(message)
    assert len(message) < 2_000
    return message


@st.composite
def hostile_inventories(draw: st.DrawFn) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        node = draw(st.integers(0, len(data["nodes"]) - 1))
        device = draw(st.integers(0, len(data["nodes"][node]["devices"]) - 1))
        if draw(st.booleans()):
            path = draw(st.sampled_from(STRING_FIELDS))
            value: Any = draw(st.sampled_from(HOSTILE) | st.text(max_size=20))
            if draw(st.booleans()):  # hostile text next to a valid value
                value = draw(st.sampled_from(["gpu1", "/dev/nvidia0", "0-3", "a100"])) + value
        else:
            path = draw(st.sampled_from(NUMBER_FIELDS))
            value = draw(st.sampled_from(NUMBERS) | st.integers())
        if path[1] == "links" and "links" not in data["nodes"][node]["devices"][device]:
            continue
        if path[1] == "features" and "features" not in data["nodes"][node]:
            continue
        put(data, path, value, node, device)
    if draw(st.booleans()):  # a node named twice, directly or through a hostlist
        twin = copy.deepcopy(data["nodes"][1])
        twin["name"] = draw(st.sampled_from([data["nodes"][0]["name"], "l40sn[0-3]", "x1,l40sn1"]))
        data["nodes"].append(twin)
    return data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=hostile_inventories(), source=st.sampled_from(["cluster.yaml", "a\nNodeName=x", "b\u2028c"]))
def test_hostile_inventories_render_only_well_formed_lines_or_one_clear_error(
    data: dict[str, Any], source: str
) -> None:
    try:
        inv = inventory.inventory_from_dict(data, "cluster.yaml", keep_identity=False)
        context = build_context(inv, load_catalog(), RenderOptions(include_unhealthy=True))
        nodes = slurm_nodes(inv, load_catalog())
        model = compile_model(nodes, load_settings(None, {}, Path("/nonexistent")).scoring)
    except HeteroError as e:
        one_line(e)
        event("refused")
        return
    event("rendered")
    context["source"] = source
    files = render_configs(context)
    assert_config_text(files["gres.conf"], GRES_KEYS, ("NodeName=",))
    assert_config_text(
        files["slurm-nodes.conf"],
        NODE_KEYS | PARTITION_KEYS | {"GresTypes"},
        ("NodeName=", "PartitionName=", "GresTypes="),
    )
    table, ident = render_table(model, [], "open", source, removal.declaration(nodes))
    assert_lua_table(table, ident)


# ------------------------------------------------------------------ regression tests, one per finding


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def write_inventory(path: Path, mutate: Any) -> Path:
    data = copy.deepcopy(BASE)
    mutate(data)
    path.write_text(json.dumps(data))
    return path


def refused_everywhere(path: Path, expected: str, tmp_path: Path) -> None:
    """inventory check, gres render and job-submit render refuse it with the same one line."""
    out = tmp_path / "out"
    for args in (
        ("inventory", "check", str(path)),
        ("gres", "render", "--inventory", str(path), "--out", str(out)),
        ("job-submit", "render", "--inventory", str(path), "--out", str(out)),
    ):
        code, stdout, stderr = run(*args)
        assert code == 1 and stdout == "", (args, stdout)
        assert stderr.count("\n") == 1 and stderr.startswith("slurm-hetero: ") and expected in stderr, stderr
    assert not out.exists() or not any(out.iterdir())


def first_device(data: dict[str, Any]) -> dict[str, Any]:
    return data["nodes"][0]["devices"][0]


FINDINGS = {
    "node-named-twice": (
        lambda d: d["nodes"].append({**d["nodes"][1], "name": d["nodes"][0]["name"]}),
        "named by two records",
    ),
    "overlapping-hostlists": (
        lambda d: d["nodes"].extend(
            [{**d["nodes"][1], "name": "gpu[1-4]"}, {**d["nodes"][1], "name": "gpu[3-5]"}]
        ),
        "node gpu3 is named in records 'gpu[1-4]' and 'gpu[3-5]'",
    ),
    "newline-in-device-file": (
        lambda d: first_device(d).update(file="/dev/nvidia0\nNodeName=evil Name=gpu File=/dev/sda"),
        "devices[0].file: must match pattern",
    ),
    "huge-hostlist": (
        lambda d: d["nodes"][0].update(name="gpu[1-100000000]"),
        "names more than 131072 hosts",
    ),
    "huge-cores": (lambda d: first_device(d).update(cores="0-2000000000"), "devices[0].cores: must match"),
    "reversed-cores": (
        lambda d: first_device(d).update(cores="7-0"),
        "reversed range '7-0' in CPU list '7-0'",
    ),
    "huge-memory": (
        lambda d: d["nodes"][0].update(real_memory_mib=10**30),
        "real_memory_mib: must be smaller",
    ),
    "huge-cpus": (lambda d: d["nodes"][0].update(cpus=10**20), "cpus: must be smaller"),
    "same-file-two-spellings": (
        lambda d: d["nodes"][0]["devices"][1].update(file="/dev//nvidia0"),
        "'/dev//nvidia0' is not in normal form",
    ),
    "self-link": (lambda d: first_device(d).update(links=[{"peer": 0, "kind": "nvlink"}]), "links to itself"),
    "dangling-link": (
        lambda d: first_device(d).update(links=[{"peer": 9, "kind": "nvlink"}]),
        "not on the node",
    ),
    "unknown-vendor": (
        lambda d: [dev.update(vendor="acme") for dev in d["nodes"][2]["devices"]],
        "unknown vendor 'acme'",
    ),
    "reserved-node-name": (lambda d: d["nodes"][0].update(name="DEFAULT"), "reserved in slurm.conf"),
    # adversarial pass of 2026-11-24
    **{
        f"reserved-type-{name}": (
            lambda d, name=name: first_device(d).update(type=name),
            f"type '{name}' is a GRES name on these nodes",
        )
        for name in ("gpu", "gpumem", "gpucore", "shard", "mps")
    },
    "duplicate-link": (
        lambda d: first_device(d).update(
            links=[{"peer": 1, "kind": "nvlink", "count": 12}, {"peer": 1, "kind": "nvlink", "count": 4}]
        ),
        "lists its link to device 1 twice",
    ),
    # issue 9 adversarial pass, T3: a copy cut short left the last device without its links
    "one-way-link": (
        lambda d: d["nodes"][0]["devices"][3].pop("links"),
        "nvidia device 0 lists 12 nvlink link(s) to device 3, but device 3 lists no link back to device 0",
    ),
    "link-counts-differ": (
        lambda d: d["nodes"][0]["devices"][1]["links"][0].update(count=12),
        "nvidia device 0 lists 4 nvlink link(s) to device 1, but device 1 lists 12 nvlink link(s) back",
    ),
    "link-kinds-differ": (
        lambda d: d["nodes"][0]["devices"][1]["links"][0].update(kind="xgmi"),
        "nvidia device 0 lists 4 nvlink link(s) to device 1, but device 1 lists 4 xgmi link(s) back",
    ),
    "hostlist-bound-after-other-records": (
        lambda d: d["nodes"].extend(
            [{**d["nodes"][1], "name": "hx[1-131072]"}, {**d["nodes"][1], "name": "hy1"}]
        ),
        "the inventory names more than 131072 hosts in all",
    ),
}


@pytest.mark.parametrize("finding", sorted(FINDINGS))
def test_each_finding_is_refused_with_one_line_by_every_command(tmp_path: Path, finding: str) -> None:
    mutate, expected = FINDINGS[finding]
    refused_everywhere(write_inventory(tmp_path / "inv.json", mutate), expected, tmp_path)


def test_a_copy_cut_after_the_last_devices_memory_is_refused(tmp_path: Path) -> None:
    """Issue 9 adversarial pass, T3: `head -c` of the example cut after the last device's
    `memory_mib:` is valid YAML; gres render wrote davinci7 without its Links= row while davinci0-6
    still listed a link to it. Every command now refuses it, naming the device and the peer."""
    text = EXAMPLE.read_text()
    cut = text[: text.rindex("memory_mib:")]
    cut += text[len(cut) :].split("\n", 1)[0]  # up to the end of that line, as `head -c` left it
    assert "links" not in cut.rsplit("index:", 1)[1]  # the last device lost its links, nothing more
    path = tmp_path / "cut.yaml"
    path.write_text(cut)
    expected = "ascend device 0 lists 1 hccs link(s) to device 7, but device 7 lists no link back to device 0"
    refused_everywhere(path, expected, tmp_path)


def test_the_refusals_are_fast(tmp_path: Path) -> None:
    """Before: render died after 25 s with MemoryError on gpu[1-100000000]."""
    import time

    path = write_inventory(tmp_path / "inv.json", FINDINGS["huge-hostlist"][0])
    started = time.monotonic()
    run("gres", "render", "--inventory", str(path), "--out", str(tmp_path / "o"))
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(
    "text", ["[" * 100_000, "{" * 100_000, "- " * 100_000 + "x"], ids=["brackets", "braces", "dashes"]
)
@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_deep_nesting_is_one_line_not_a_traceback_or_a_crash(tmp_path: Path, text: str, suffix: str) -> None:
    path = tmp_path / f"deep{suffix}"
    path.write_text(text)
    # a subprocess: libyaml's C composer overflowed the C stack (SIGSEGV) on 50,000 levels
    result = subprocess.run(
        [sys.executable, "-m", "slurm_hetero", "inventory", "check", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        timeout=60,
    )
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr[-500:]


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "directory", "huge"])
def test_from_file_and_inventory_read_only_bounded_regular_files(tmp_path: Path, kind: str) -> None:
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)  # no writer: a blocking open would hang forever
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":
        with path.open("wb") as f:
            f.truncate(65 * 1024 * 1024)  # sparse: over the 64 MiB capture cap
    else:
        path = Path(kind)
    code, _, err = run("discover", "--vendor", "ascend", "--from-file", str(path), "--node", "n1")
    assert code == 1 and err.count("\n") == 1 and "capture file" in err, err
    if kind != "huge":
        code, _, err = run("inventory", "check", str(path))
        assert code == 1 and err.count("\n") == 1 and "inventory file" in err, err


def test_discover_writes_only_names_that_inventory_check_accepts(tmp_path: Path) -> None:
    capture = REPO / "tests" / "fixtures" / "gaudi" / "hl-smi_8x-gaudi2-hl225_hl-1.16.0_denvr.txt"
    for name in ("bad name", "n1\nNodeName=x", "DEFAULT", "x" * 300, "gpu[1-2]"):
        code, out, err = run("discover", "--vendor", "gaudi", "--from-file", str(capture), "--node", name)
        assert code == 1 and out == "" and "node name" in err and err.count("\n") == 1, err
    code, out, _ = run("discover", "--vendor", "gaudi", "--from-file", str(capture), "--node", "n-1.a_b")
    (tmp_path / "n.yaml").write_text(out)
    assert code == 0 and run("inventory", "check", str(tmp_path / "n.yaml"))[0] == 0


def test_a_rerender_after_a_damaged_table_rewrites_the_hook_so_slurmctld_reloads(tmp_path: Path) -> None:
    """slurmctld reloads job_submit.lua only when its st_mtime (seconds) grows."""
    args = ("job-submit", "render", "--inventory", str(EXAMPLE), "--out", str(tmp_path))
    assert run(*args)[0] == 0
    script, table = tmp_path / "job_submit.lua", tmp_path / "slurm_hetero_tables.lua"
    before = script.stat()
    table.write_text(table.read_text().replace("return {", "return {{ broken", 1))
    assert run(*args)[0] == 0
    after = script.stat()
    assert after.st_ino != before.st_ino and int(after.st_mtime) > int(before.st_mtime)
    assert "broken" not in table.read_text()


def test_renders_in_one_second_keep_distinct_backups(tmp_path: Path) -> None:
    args = ["gres", "render", "--inventory", str(EXAMPLE), "--out", str(tmp_path)]
    for policy in ("binpack", "spread", "binpack", "spread"):
        assert run(*args, "--policy", policy)[0] == 0
    backups = sorted(tmp_path.glob("slurm-nodes.conf.*.bak"))
    assert len(backups) == 3 and len({b.name for b in backups}) == 3


def test_no_temporary_files_are_left_and_check_reports_an_interrupted_render(tmp_path: Path) -> None:
    args = ["gres", "render", "--inventory", str(EXAMPLE), "--out", str(tmp_path)]
    assert run(*args)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".slurm-hetero.lock",
        "gres.conf",
        "slurm-nodes.conf",
    ]
    (tmp_path / ".slurm-hetero.journal").write_text('{"version": 1, "files": []}')
    code, _, err = run(*args, "--check")
    assert code == 1 and "interrupted render" in err
    assert run(*args)[0] == 0 and not (tmp_path / ".slurm-hetero.journal").exists()


def test_the_shipped_schema_states_the_syntax_rules() -> None:
    """The shipped JSON Schema is the one home of the inventory's patterns and bounds; the ones
    slurm.syntax also applies in code must say the same."""
    schema = inventory.shipped_schema()
    node, device = (schema["definitions"][d]["properties"] for d in ("node", "device"))
    assert schema["properties"]["nodes"]["maxItems"] == syntax.MAX_HOSTS
    assert node["name"]["maxLength"] == syntax.MAX_HOSTLIST
    assert node["devices"]["maxItems"] == syntax.MAX_DEVICES_PER_NODE
    assert (device["file"]["pattern"], device["cores"]["pattern"]) == (syntax.DEVICE_FILE, syntax.CPU_LIST)
    peer = schema["definitions"]["link"]["properties"]["peer"]
    assert device["index"]["maximum"] == peer["maximum"] == syntax.MAX_INDEX


def test_the_hook_is_renamed_after_its_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """slurmctld reloads on job_submit.lua's mtime: by then the new table must be in place."""
    renamed: list[str] = []
    real = os.replace

    def recording(src: Any, dst: Any) -> None:
        renamed.append(Path(dst).name)
        real(src, dst)

    monkeypatch.setattr(os, "replace", recording)
    assert run("job-submit", "render", "--inventory", str(EXAMPLE), "--out", str(tmp_path))[0] == 0
    names = [n for n in renamed if not n.startswith(".")]
    assert names[:2] == ["slurm_hetero_tables.lua", "job_submit.lua"]
    assert names[2:] == ["slurm_hetero_srun.lua", "cli_filter.lua"]  # the filter loads the srun half


def test_an_integral_float_from_a_dict_caller_reaches_the_lua_table() -> None:
    # the schema takes 1000.0 as an integer (JSON Schema's rule); the table writer must too
    data = yaml.safe_load((REPO / "gres_conf/examples/mixed.yaml").read_text())
    data["nodes"][0]["cpus"] = 1000.0
    nodes = slurm_nodes(inventory.inventory_from_dict(data, "cluster.yaml"), load_catalog())
    model = compile_model(nodes, load_settings(None, {}, Path("/nonexistent")).scoring)
    table, ident = render_table(model, [], "open", "cluster.yaml", removal.declaration(nodes))
    assert_lua_table(table, ident)
