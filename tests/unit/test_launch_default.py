"""The launcher out of the box: without --model (torchrun-like), without an inventory file (device
types from `scontrol show node`), each vendor's visible devices, and the errors a user can hit
first (more tasks than devices, a misspelled --measured key, a device without a speed figure)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.core import proc
from slurm_hetero.core.errors import RequestError
from slurm_hetero.core.model import ClusterInventory, Device, NodeInventory
from slurm_hetero.engine.devicegroups import resolve_measured
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.launch import run
from slurm_hetero.launch.plan import LaunchOptions, LaunchPlanError, process_env
from slurm_hetero.launch.slurmnodes import SlurmNodesError, gres_records
from slurm_hetero.slurm.scontrol import gpu_entries, parse_show_node
from slurm_hetero.vendors import vendor_traits
from tests.conftest import FIXTURES
from tests.unit.test_launch_plan import node, own, plan_from, slurm_env

CATALOG = load_catalog()
STATE = FIXTURES / "slurm_state"
DEV_CLUSTER = STATE / "scontrol-show-node-d-o_dev-cluster_a100-ascend-l40s_slurm-22.05.8.txt"
NO_MODEL = LaunchOptions(None, global_batch=10)

# -- what Slurm knows: scontrol show node -------------------------------------------------------


@pytest.mark.parametrize(
    ("capture", "expected"),
    [
        (
            DEV_CLUSTER.name,
            {"a100n1": (("a100", 4),), "ascendn1": (("ascend910", 8),), "l40sn1": (("l40s", 2),)},
        ),
        (
            "scontrol-show-node-d_dev-cluster_a100-ascend-l40s_slurm-22.05.8.txt",
            {"a100n1": (("a100", 4),), "ascendn1": (("ascend910", 8),), "l40sn1": (("l40s", 2),)},
        ),
        ("scontrol-show-node-d_neu-discovery_k80x7_slurm-21.08.8.txt", {"c2180": (("k80", 7),)}),
        (
            "scontrol-show-node_huji-cs_m60-rtx2080-quadro-vmem_slurm-17.11.txt",
            {
                "cortex-01": (("m60", 8),),
                "dumfries-002": (("rtx2080", 4),),
                "oxygen-04": (),
                "cricket": (("quadro", 1),),
            },
        ),
    ],
)
def test_gpu_types_are_read_from_real_scontrol_output(capture: str, expected: dict[str, object]) -> None:
    nodes = parse_show_node((STATE / capture).read_text())
    assert {n.name: n.gpus for n in nodes} == expected


def test_gres_values_keep_socket_lists_and_skip_other_resources() -> None:
    assert gpu_entries("gpu:a100:2(S:0,1),gpumem:80G") == (("a100", 2),)
    assert gpu_entries("gpu:a100:2(S:0,1),gpu:v100:1,shard:l40s:8,gpumem:80G") == (("a100", 2), ("v100", 1))
    assert gpu_entries("gpu:2") == (("", 2),) and gpu_entries("(null)") == ()


def _scontrol(monkeypatch: pytest.MonkeyPatch, text: str) -> list[list[str]]:
    calls: list[list[str]] = []

    def fake(argv: Sequence[str], timeout: float = 60.0) -> str:
        calls.append(list(argv))
        assert argv[:3] == ["scontrol", "show", "node"]
        return text

    monkeypatch.setattr(proc, "run", fake)
    return calls


def _no_inventory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(run, "DEFAULT_INVENTORY", tmp_path / "absent.yaml")


def test_without_an_inventory_launch_asks_slurm_once_and_runs_the_readme_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # sbatch -N3 --gpus-per-node=1 --wrap "srun slurm-hetero launch --model llama-3-8b --global-batch 512"
    _no_inventory(monkeypatch, tmp_path)
    text = DEV_CLUSTER.read_text().replace("ascend910:8", "ascend910b3:8")  # the bundled example's type
    calls = _scontrol(monkeypatch, text)
    env = slurm_env([("a100n1", 1), ("ascendn1", 1), ("l40sn1", 1)], 2)
    options = LaunchOptions("llama-3-8b", global_batch=512, seq=2048)
    job, plan = run.plan_step(options, run.RunOptions(("true",)), env)
    assert calls == [["scontrol", "show", "node", "a100n1,ascendn1,l40sn1", "-d", "-o"]]
    assert [r.type for r in plan.ranks] == ["a100", "ascend910b3", "l40s"]
    # the catalog's 910B figure is a sourced estimate now (issue 12): no speed needs guessing
    assert not any("no TFLOPS for ascend910b3" in n for n in plan.notes)
    assert (
        plan.ranks[1].env["ASCEND_RT_VISIBLE_DEVICES"] == "0"
        and own(plan, env)["CUDA_VISIBLE_DEVICES"] == "0"
    )


def test_a_type_the_catalog_lacks_needs_an_inventory_only_with_a_model() -> None:
    gres = {
        n.name: n
        for n in parse_show_node(
            (STATE / "scontrol-show-node-d_neu-discovery_k80x7_slurm-21.08.8.txt").read_text()
        )
    }
    records = gres_records(gres, ["c2180"], CATALOG, need_facts=False)
    assert (
        len(records["c2180"].devices) == 7 and records["c2180"].devices[0].vendor.visible_devices_env is None
    )
    with pytest.raises(SlurmNodesError, match="'k80' is not in the catalog and no inventory is installed"):
        gres_records(gres, ["c2180"], CATALOG, need_facts=True)


def test_an_explicit_inventory_that_is_missing_is_an_error(tmp_path: Path) -> None:
    env = slurm_env([("n1", 1)], 0)
    with pytest.raises(Exception, match="absent.yaml"):
        run.plan_step(NO_MODEL, run.RunOptions(("true",), inventory=tmp_path / "absent.yaml"), env)


# -- without --model: torchrun-like ---------------------------------------------------------------


def test_without_a_model_every_rank_is_an_even_data_parallel_replica(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_inventory(monkeypatch, tmp_path)
    _scontrol(monkeypatch, DEV_CLUSTER.read_text())
    env = slurm_env([("a100n1", 2), ("l40sn1", 2)], 3)
    _, plan = run.plan_step(NO_MODEL, run.RunOptions(("true",)), env)
    assert plan.layout is None and not plan.notes
    docs = [r.layout for r in plan.ranks]
    assert [d.samples for d in docs] == [3, 3, 2, 2] and [d.sample_offset for d in docs] == [0, 3, 6, 8]
    assert sum(d.grad_weight for d in docs) == pytest.approx(1.0)
    assert all(d.group("dp").ranks == (0, 1, 2, 3) and d.num_layers == 0 and d.model == "" for d in docs)
    mine = own(plan, env)
    assert {k: mine[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "a100n1",
    }
    assert mine["CUDA_VISIBLE_DEVICES"] == "1" and "MASTER_PORT" in mine
    assert run.describe(plan).startswith("no model: even data parallel on 4 ranks")


def test_cli_launch_without_model_runs_the_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from slurm_hetero.cli import cli

    inv = tmp_path / "inv.yaml"
    inv.write_text((FIXTURES.parent.parent / "gres_conf" / "examples" / "mixed.yaml").read_text())
    env = slurm_env([("a100n1", 2)], 0) | {"TMPDIR": str(tmp_path), "SLURM_HETERO_INVENTORY": str(inv)}
    monkeypatch.setattr(run, "check_master", lambda addr: None)
    out = tmp_path / "seen"
    argv = ["launch", "--exec", "--", "sh", "-c", f"echo $RANK $WORLD_SIZE $SLURM_HETERO_LAYOUT > {out}"]
    seen: list[tuple[str, ...]] = []
    monkeypatch.setattr(run, "exec_command", lambda command, e: seen.append(tuple(command)) or 0)
    result = CliRunner().invoke(cli, argv, env=env)
    assert result.exit_code == 0, result.output
    assert seen and seen[0][0] == "sh"


# -- visible devices, every vendor ----------------------------------------------------------------

# rank 1 of 2 on a node where Slurm gave the step devices 2 and 5 (and, with no gres.conf flag, set
# all its variables to both): one level per runtime; the vendor's own variable names the device,
# variables a runtime applies inside it take position 0, the Slurm variable of the vendor's flag is
# narrowed to the rank's item, and no rank sees another runtime's variable.
EXPECTED_ENV = {
    "nvidia": {"CUDA_VISIBLE_DEVICES": "5"},
    "iluvatar": {"CUDA_VISIBLE_DEVICES": "5"},
    "amd": {
        "ROCR_VISIBLE_DEVICES": "5",
        "HIP_VISIBLE_DEVICES": "0",
        "CUDA_VISIBLE_DEVICES": "0",
        "GPU_DEVICE_ORDINAL": "0",
    },
    "hygon": {
        "ROCR_VISIBLE_DEVICES": "5",
        "HIP_VISIBLE_DEVICES": "0",
        "CUDA_VISIBLE_DEVICES": "0",
        "GPU_DEVICE_ORDINAL": "0",
    },
    "ascend": {"ASCEND_RT_VISIBLE_DEVICES": "5"},
    "cambricon": {"MLU_VISIBLE_DEVICES": "5"},
    "enflame": {"TOPS_VISIBLE_DEVICES": "5"},
    "gaudi": {"HABANA_VISIBLE_MODULES": "m5"},  # the module id, not the index
    "intel": {"ZE_AFFINITY_MASK": "5"},
    "kunlunxin": {"XPU_VISIBLE_DEVICES": "5"},
    "metax": {"MACA_VISIBLE_DEVICES": "5"},
    "mthreads": {"MUSA_VISIBLE_DEVICES": "5"},
}
VISIBLE_NAMES = {
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "HIP_VISIBLE_DEVICES",
} | {t.visible_devices_env for t in vendor_traits().values() if t.visible_devices_env}


def test_every_registered_vendor_has_an_expected_rank_env() -> None:
    assert set(vendor_traits()) == set(EXPECTED_ENV)


@pytest.mark.parametrize("vendor", sorted(EXPECTED_ENV))
def test_each_vendor_rank_sees_exactly_its_device(vendor: str) -> None:
    spec = next(s for s in CATALOG.specs if s.vendor == vendor and not s.compare_only)
    devices = tuple(
        Device(vendor, spec.name, i, f"/dev/x{i}", spec.memory_mib, spec.type, tool_id=f"m{i}")
        for i in range(8)
    )
    inv = ClusterInventory((NodeInventory("n1", devices),))
    env = slurm_env([("n1", 2)], 1) | {
        "SLURM_STEP_GPUS": "2,5",
        "CUDA_VISIBLE_DEVICES": "2,5",
        "ROCR_VISIBLE_DEVICES": "2,5",
        "GPU_DEVICE_ORDINAL": "2,5",
    }
    plan = plan_from(env, inv, NO_MODEL)
    mine = own(plan, env)
    assert {k: v for k, v in mine.items() if k in VISIBLE_NAMES} == EXPECTED_ENV[vendor]
    # the command's environment: Slurm's other variables, copied by srun, do not reach the rank
    command_env = process_env(env, mine)
    assert {k: v for k, v in command_env.items() if k in VISIBLE_NAMES} == EXPECTED_ENV[vendor]


# -- errors ---------------------------------------------------------------------------------------


def test_more_tasks_than_the_steps_devices_on_a_node_is_refused() -> None:
    # srun -n2 --gpus=1: both tasks see SLURM_STEP_GPUS=0; SLURM_GPUS_ON_NODE says the step has one
    inv = ClusterInventory((node("n1", "a100_80g", 4),))
    env = slurm_env([("n1", 2)], 1) | {
        "SLURM_STEP_GPUS": "0",
        "CUDA_VISIBLE_DEVICES": "0",
        "SLURM_GPUS_ON_NODE": "1",
    }
    with pytest.raises(LaunchPlanError, match="n1 runs 2 tasks but Slurm gave the step 1 device"):
        plan_from(env, inv, NO_MODEL)
    # --gpus-per-task=1: the task's own GPU in SLURM_STEP_GPUS, two on the node: fine
    env |= {"SLURM_STEP_GPUS": "3", "CUDA_VISIBLE_DEVICES": "3", "SLURM_GPUS_ON_NODE": "2"}
    assert own(plan_from(env, inv, NO_MODEL), env)["CUDA_VISIBLE_DEVICES"] == "3"


def test_fewer_tasks_than_the_steps_devices_on_a_node_is_refused() -> None:
    """adv33 F16: `srun -N2 --gpus-per-node=4 launch` ran one rank a node, each seeing one device,
    and left three of four idle without a word."""
    inv = ClusterInventory((node("n1", "a100_80g", 4),))
    env = slurm_env([("n1", 1)], 0) | {"SLURM_STEP_GPUS": "0,1,2,3", "SLURM_GPUS_ON_NODE": "4"}
    said = "n1 runs 1 task but Slurm gave the step 4 device(s) there (SLURM_GPUS_ON_NODE=4); each rank "
    with pytest.raises(
        LaunchPlanError, match=re.escape(said + "sees only its own device, so 3 would sit idle")
    ):
        plan_from(env, inv, NO_MODEL)


def test_more_tasks_than_inventory_devices_is_refused() -> None:
    inv = ClusterInventory((node("n1", "a100_80g", 1),))
    with pytest.raises(LaunchPlanError, match="n1 runs 2 tasks but has 1 a100_80g devices"):
        plan_from(slurm_env([("n1", 2)], 0), inv, NO_MODEL)


def test_measured_keys_must_name_a_type() -> None:
    assert resolve_measured({"A100_80G": 150.0, "l40s": 90.0}, CATALOG) == {"a100_80g": 150.0, "l40s": 90.0}
    with pytest.raises(RequestError, match="'a100_80': names no device type; known types: .*a100_80g"):
        resolve_measured({"a100_80": 150.0}, CATALOG)
    site = resolve_measured({"LAB_BIG": 99.0}, CATALOG, {"lab_big": "a100_80g"})
    assert site == {"a100_80g": 99.0}


@pytest.mark.parametrize(
    "measured",
    [
        {"h100": 300.0, "h100_sxm": 100.0},
        {"h100_sxm": 100.0, "H100": 300.0},
        {"A100_80G": 1.0, "a100_80g": 2.0},
    ],
)
def test_two_spellings_of_one_measured_type_are_refused(measured: dict[str, float]) -> None:
    """Q13: an alias beside its canonical name was accepted and whichever came last won."""
    first, second = measured
    with pytest.raises(RequestError, match=f"keys '{first}' and '{second}': both name device type"):
        resolve_measured(measured, CATALOG)


def test_two_spellings_in_a_measured_file_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("h100: 300\nh100_sxm: 100\n")
    args = [
        "plan",
        "--devices",
        "h100:4,a100:4",
        "--global-batch",
        "64",
        "--model",
        "gpt2",
        "--measured",
        str(path),
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert result.output == (
        "slurm-hetero: --measured keys 'h100' and 'h100_sxm': both name device type h100_sxm; keep one\n"
    )


def test_a_measured_typo_stops_the_launch_with_the_types_of_the_step() -> None:
    inv = ClusterInventory((node("n1", "a100_80g", 2),))
    options = dataclasses.replace(LaunchOptions("gpt2", global_batch=16, seq=128), measured={"a10080g": 1.0})
    with pytest.raises(RequestError, match="types of this allocation: a100_80g"):
        plan_from(slurm_env([("n1", 2)], 0), inv, options)


def test_a_measured_speed_without_a_size_curve_is_taken_as_it_is() -> None:
    from slurm_hetero.engine.devicegroups import device_groups

    (catalog_only,) = device_groups([("a100", 8)], CATALOG)
    (measured,) = device_groups([("a100", 8)], CATALOG, {"a100": 150.0})
    (curve,) = device_groups([("a100", 8)], CATALOG, {"a100": 150.0}, measured_half={"a100": 3e6})
    assert catalog_only.gemm_half > 0 and measured.gemm_half == 0.0 and curve.gemm_half == 3e6
