"""`slurm-hetero discover` on real captures: the --from-file path admins use, and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.cli.discover import node_facts
from slurm_hetero.core import proc
from tests.conftest import FIXTURES

ASCEND_INFO = FIXTURES / "ascend" / "npu-smi-info_8x-910b3_drv24.1.rc1.txt"
ASCEND_TOPO = FIXTURES / "ascend" / "npu-smi-info-t-topo_8x-910b3_hccs_cpu-affinity.txt"
# a whole `npu-smi info` (with its process table); the 8x 910B3 excerpt needs its topo capture
ASCEND_WHOLE = FIXTURES / "ascend" / "npu-smi-info_910b2c_hbm_drv23.0.2.1.txt"
A100_XML = FIXTURES / "nvidia" / "nvidia-smi-q-x_a100-sxm4-80gb_mig_drv535_1-of-4-gpus.xml"


def run(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def test_ascend_captures_become_a_node_inventory_with_types_links_and_cores() -> None:
    code, out, err = run(
        "discover",
        "--vendor",
        "ascend",
        "--from-file",
        ASCEND_INFO,
        "--from-file",
        ASCEND_TOPO,
        "--node",
        "npu01",
    )
    assert code == 0, err
    node = yaml.safe_load(out)["nodes"][0]
    assert node["name"] == "npu01" and len(node["devices"]) == 8
    first = node["devices"][0]
    assert (
        first["type"] == "ascend910b3" and first["memory_mib"] == 65536 and first["file"] == "/dev/davinci0"
    )
    assert len(first["links"]) == 7 and {link["kind"] for link in first["links"]} == {"hccs"}
    assert first["cores"]


def test_vendor_is_sniffed_when_not_given_and_json_is_one_line() -> None:
    code, out, err = run("discover", "--from-file", A100_XML, "--node", "g1", "--json")
    assert code == 0, err
    assert out.count("\n") == 1
    device = json.loads(out)["nodes"][0]["devices"][0]
    assert (device["vendor"], device["type"]) == ("nvidia", "a100_80g")


def test_topology_alone_names_the_missing_capture() -> None:
    code, _, err = run("discover", "--vendor", "ascend", "--from-file", ASCEND_TOPO)
    assert code == 1 and err.startswith("slurm-hetero: ") and "also capture `npu-smi info`" in err


def test_a_capture_no_vendor_recognises_names_the_way_to_each_reason() -> None:
    """adv43: the vendors' reasons were joined and cut at 400 characters, so nvidia's ("topology
    alone ... also capture `nvidia-smi -q -x`") never showed; --vendor shows the one that matters."""
    topo = FIXTURES / "nvidia" / "topo-m_dgx-a100_8gpu-nv12_12x-mlx5_tabs.txt"
    code, _, err = run("discover", "--from-file", topo)
    assert code == 1 and err.count("\n") == 1
    assert err.startswith(f"slurm-hetero: no vendor parser recognised {topo}; pass --vendor NAME to see why")
    assert err.rstrip().endswith(", metax, mthreads, nvidia)")
    code, _, err = run("discover", "--vendor", "nvidia", "--from-file", topo)
    assert code == 1 and "topology alone has no device list; also capture `nvidia-smi -q -x`" in err
    # adv47 A18: a valid capture beside one no parser reads is not called unrecognised alone
    code, _, err = run("discover", "--from-file", A100_XML, "--from-file", topo.with_suffix(".txt.source"))
    assert code == 1 and f"recognised {A100_XML}, {topo.with_suffix('.txt.source')} together; " in err
    assert "to see why that vendor's parser refuses them (" in err


@pytest.mark.parametrize("text", ["", "garbage\n\x00\x01", ASCEND_INFO.read_text()[:1500]])
def test_garbage_and_truncated_captures_are_one_line_errors(tmp_path: Path, text: str) -> None:
    capture = tmp_path / "capture.txt"
    capture.write_text(text)
    code, _, err = run("discover", "--vendor", "ascend", "--from-file", capture)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err and "npu-smi" in err


def test_unknown_model_points_to_the_site_catalog(tmp_path: Path) -> None:
    capture = tmp_path / "info.txt"
    capture.write_text(ASCEND_WHOLE.read_text().replace("910B2C", "999Z9"))
    code, _, err = run("discover", "--vendor", "ascend", "--from-file", capture)
    assert code == 1 and "ascend device 0: model '999Z9' is not in the catalog" in err and "models.d" in err


def test_site_models_dir_fixes_an_unknown_model(tmp_path: Path) -> None:
    capture = tmp_path / "info.txt"
    capture.write_text(ASCEND_WHOLE.read_text().replace("910B2C", "999Z9"))
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "npu.yaml").write_text(
        "version: 1\nmodels:\n- {type: ascend999z9, vendor: ascend, name: Ascend 999Z9, match: ['999Z9'], "
        "memory_gib: 64, source: 'https://example.org/site-measurement'}\n"
    )
    code, out, err = run(
        "discover", "--vendor", "ascend", "--from-file", capture, "--models-dir", tmp_path / "site"
    )
    assert code == 0, err
    assert yaml.safe_load(out)["nodes"][0]["devices"][0]["type"] == "ascend999z9"


def test_missing_capture_file_and_unknown_vendor(tmp_path: Path) -> None:
    code, _, err = run("discover", "--vendor", "ascend", "--from-file", tmp_path / "nope.txt")
    assert code == 1 and "no such capture file" in err
    code, _, err = run("discover", "--vendor", "acme", "--from-file", ASCEND_INFO)
    assert code == 1 and "unknown vendor 'acme'" in err and "nvidia" in err


def test_list_vendors_names_every_registered_vendor() -> None:
    code, out, _ = run("discover", "--list-vendors")
    names = {line.split()[0] for line in out.splitlines()}
    assert code == 0
    assert {
        "nvidia",
        "amd",
        "ascend",
        "cambricon",
        "hygon",
        "iluvatar",
        "gaudi",
        "mthreads",
        "intel",
        "kunlunxin",
        "enflame",
    } <= names


def test_live_discovery_without_accelerators_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_hetero.vendors import all_vendors

    for vendor in all_vendors():
        monkeypatch.setattr(type(vendor), "affinity", lambda self: 0)
    code, _, err = run("discover")
    assert code == 1 and "no accelerators found" in err


def test_discover_refuses_what_inventory_check_would_refuse_even_a_float_count() -> None:
    """discover validates through the text `inventory check` reads: a parser that handed over 8.0
    CPUs or 46068.0 MiB would have been written and then refused (issue 9 re-pass, V60)."""
    from slurm_hetero.core.errors import InventoryError
    from slurm_hetero.core.model import Device, NodeInventory
    from slurm_hetero.inventory import discover

    device = Device("nvidia", "NVIDIA L40S", 0, "/dev/nvidia0", 46068, "l40s")
    assert discover.validated(NodeInventory("n1", cpus=8, devices=(device,))).cpus == 8
    with pytest.raises(InventoryError, match=r"8\.0 is not a whole number"):
        discover.validated(NodeInventory("n1", cpus=8.0, devices=(device,)))  # type: ignore[arg-type]


def test_discover_refuses_a_one_way_link() -> None:
    """The link check is the one every command shares (issue 9 adversarial pass, T3): a parser or
    capture that gave device 0 a link to device 1 and device 1 none back is refused at discover."""
    from slurm_hetero.core.errors import InventoryError
    from slurm_hetero.core.model import Device, Link, NodeInventory
    from slurm_hetero.inventory import discover

    def node(*back: Link) -> NodeInventory:
        first = Device(
            "nvidia", "NVIDIA A100-SXM4-80GB", 0, "/dev/nvidia0", 81920, links=(Link(1, "nvlink", 12),)
        )
        second = Device("nvidia", "NVIDIA A100-SXM4-80GB", 1, "/dev/nvidia1", 81920, links=back)
        return NodeInventory("n1", devices=(first, second))

    assert len(discover.validated(node(Link(0, "nvlink", 12))).devices) == 2
    with pytest.raises(InventoryError, match="device 1 lists no link back to device 0"):
        discover.validated(node())


def no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything (scontrol above all) is run."""

    def run(argv: object, *args: object, **kwargs: object) -> str:
        raise AssertionError(f"ran {argv} before checking the command line")

    monkeypatch.setattr(proc, "run", run)


@pytest.mark.parametrize(
    ("facts", "said"),
    [
        (["--cpus", "70000"], "--cpus 70,000: a node record holds 1 to 65,535\n"),
        (["--sockets", "65536"], "--sockets 65,536: a node record holds 1 to 65,535\n"),
        (["--threads-per-core", "65536"], "--threads-per-core 65,536: a node record holds 1 to 65,535\n"),
        (["--real-memory", "0"], "--real-memory: size must be positive\n"),
        # adv26b F11: RealMemory's bound (2^32 MiB) in any spelling, not a device's 1024T
        (["--real-memory", "4097T"], "--real-memory: size is too large (at most 4096T)\n"),
        (["--real-memory", "4294967297"], "--real-memory: size is too large (at most 4096T)\n"),
        (["--real-memory", "9" * 20], "--real-memory: size is too large (at most 4096T)\n"),
    ],
)
def test_node_facts_are_bounded_before_slurm_is_asked(
    monkeypatch: pytest.MonkeyPatch, facts: list[str], said: str
) -> None:
    """adv26 dccpubig, dcsock, dcmem0: refused only after `scontrol show node` (10 s without Slurm)."""
    no_process(monkeypatch)
    code, _, err = run("discover", "--vendor", "ascend", "--from-file", ASCEND_WHOLE, "--node", "n1", *facts)
    assert code == 1 and err == f"slurm-hetero: {said}", err


@pytest.mark.parametrize(
    ("nodes", "said"),
    [
        ("gpu[1-100000000]", "hostlist 'gpu[1-100000000]' names more than 131072 hosts"),
        ("g[1-1000][1-1000]", "hostlist 'g[1-1000][1-1000]' names more than 131072 hosts"),
        (
            "gpu[0-99999999999999999999]",
            "bad range '0-99999999999999999999' in 'gpu[0-99999999999999999999]'",
        ),
    ],
)
def test_a_fan_out_hostlist_is_counted_before_slurm_is_asked(
    monkeypatch: pytest.MonkeyPatch, nodes: str, said: str
) -> None:
    """adv26 dcnodes*: a 10^8-host list went to scontrol unchecked (10 s without Slurm)."""
    no_process(monkeypatch)
    code, _, err = run("discover", "--nodes", nodes)
    assert code == 1 and err.startswith(f"slurm-hetero: --nodes: {said}") and err.count("\n") == 1, err


@pytest.mark.parametrize("memory", ["4096T", "4194304G", "4294967296M", "4294967296"])
def test_real_memory_at_its_bound_is_taken_in_any_spelling(memory: str) -> None:
    """adv26b F11: `4096T` was refused (a device's limit) while `4294967296` was taken."""
    facts = node_facts({"real_memory": memory})
    assert facts == {"real_memory_mib": 1 << 32}
