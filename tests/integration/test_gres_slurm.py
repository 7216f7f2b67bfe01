"""The real slurmd accepts what `gres render` produced, and jobs land where their GRES say."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurm_hetero.core import hostlist
from slurm_hetero.core.units import format_size
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.config import load_settings
from slurm_hetero.inventory.nodes import slurm_nodes
from slurm_hetero.render.context import shards_per_device
from tests.integration.conftest import Cluster, slurm


def expected_nodes(path: Path) -> dict[str, list]:
    return {
        host: list(node.devices)
        for node in slurm_nodes(inventory.load(path), load_catalog())
        for host in hostlist.expand(node.name)
    }


def node_flags(path: Path) -> dict[str, str]:
    """Each host's gres.conf Flags= for its gpu lines."""
    return {
        host: node.gpu_env
        for node in slurm_nodes(inventory.load(path), load_catalog())
        for host in hostlist.expand(node.name)
    }


def scontrol_nodes() -> dict[str, dict[str, str]]:
    nodes = {}
    for line in slurm("scontrol", "show", "node", "-d", "-o").splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        nodes[fields["NodeName"]] = fields
    return nodes


def test_sinfo_reports_the_release_under_test(dev_cluster: Cluster) -> None:
    """The bundled example's cluster runs the Slurm release the test is parametrized with."""
    version = slurm("sinfo", "-V").strip()
    assert version.split()[-1].startswith(dev_cluster.name + "."), version
    assert dev_cluster.name in (dev_cluster.etc / "slurm.conf").read_text().splitlines()[0]


def test_every_node_is_idle_with_exactly_the_inventory_gres(dev_cluster: Cluster, suite_config: Path) -> None:
    shares = load_settings(suite_config).scoring.shares
    reported = scontrol_nodes()
    expected = expected_nodes(dev_cluster.inventory)
    assert set(reported) == set(expected)
    for name, devices in expected.items():
        fields = reported[name]
        assert fields["State"] == "IDLE", (name, fields.get("Reason"))
        per_type: dict[str, int] = {}
        for d in devices:
            per_type[d.type] = per_type.get(d.type, 0) + 1
        gres = [g.split("(")[0] for g in fields["Gres"].split(",") if g != "(null)"]
        want = [f"gpu:{t}:{n}" for t, n in per_type.items()]
        if devices:
            want += [
                f"gpumem:{format_size(sum(d.device.memory_mib or 0 for d in devices))}",
                f"gpucore:{100 * len(devices)}",
            ]
        shards = {
            t: sum(shards_per_device(d.device, shares) for d in devices if d.type == t) for t in per_type
        }
        want += [f"shard:{t}:{n}" for t, n in shards.items()] if any(shards.values()) else []  # every type
        assert gres == want, name


def test_unhealthy_devices_are_not_given_to_slurm(dev_cluster: Cluster) -> None:
    sick = [
        (n.name, d)
        for n in inventory.load(dev_cluster.inventory).nodes
        for d in n.devices
        if d.health != "ok"
    ]
    if not sick:
        pytest.skip("no unhealthy device in the generated inventory")
    reported = scontrol_nodes()
    for name, device in sick:
        assert reported[name]["State"] == "IDLE", (name, reported[name].get("Reason"))
        assert f"gpu:{device.type}:" not in reported[name]["Gres"] or len(
            expected_nodes(dev_cluster.inventory)[name]
        )


def _submit(gres: str, out: Path, *extra: str) -> str:
    script = (
        "#!/bin/bash\necho NODE=$SLURMD_NODENAME\necho CUDA=$CUDA_VISIBLE_DEVICES\n"
        "echo STEP=$SLURM_STEP_GPUS\necho JOB=$SLURM_JOB_GPUS\n"
        "env | grep -E '_VISIBLE_|^ZE_AFFINITY_MASK=' | sort\n"
    )
    return slurm("sbatch", "--parsable", f"--gres={gres}", *extra, "-o", str(out), "--wrap", script).strip()


def _wait(job_ids: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not slurm("squeue", "-h", "-j", ",".join(job_ids), "-o", "%A", check=False).strip():
            return
        time.sleep(0.3)
    raise AssertionError(f"jobs {job_ids} did not finish in {timeout}s")


def _read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_a_job_per_gpu_type_lands_on_that_type_with_its_visible_devices(
    dev_cluster: Cluster, tmp_path: Path
) -> None:
    nodes, flags = expected_nodes(dev_cluster.inventory), node_flags(dev_cluster.inventory)
    types = sorted({d.type for devices in nodes.values() for d in devices})
    jobs = {t: _submit(f"gpu:{t}:1", tmp_path / f"{t}.out") for t in types}
    # and each vendor of the node that mixes two (no_gpu_env: only the TaskProlog's variables)
    mixed = [f"mix-{t}" for t in ("bi_v100", "max1550")]
    jobs |= {
        m: _submit(f"gpu:{m.removeprefix('mix-')}:1", tmp_path / f"{m}.out", "-w", "mixn1") for m in mixed
    }
    two = next(t for t in types if sum(d.type == t for ds in nodes.values() for d in ds) >= 2)
    jobs["pair"] = _submit(f"gpu:{two}:2", tmp_path / "pair.out")
    _wait(list(jobs.values()))
    for name in [*types, *mixed]:
        t, env = name.removeprefix("mix-"), _read_env(tmp_path / f"{name}.out")
        devices = nodes[env["NODE"]]
        assert t in {d.type for d in devices} and (t == name or env["NODE"] == "mixn1"), (name, env["NODE"])
        device = devices[int(env["JOB"])]
        assert device.type == t
        vendor = device.vendor
        # ROCm runtimes index CUDA_VISIBLE_DEVICES inside ROCR_VISIBLE_DEVICES: the TaskProlog sets
        # positions; gres.conf Flags= has Slurm set CUDA_ only for the runtimes that read it
        cuda = env["JOB"] if flags[env["NODE"]] == "nvidia_gpu_env" else ""
        assert env["CUDA"] == ("0" if vendor.relative_visible_envs else cuda), (t, env)
        for variable in {"ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK"} - {vendor.visible_devices_env}:
            assert variable not in env, (t, env)  # another vendor's variable
        if vendor.visible_devices_env:
            assert env[vendor.visible_devices_env] == vendor.visible_id(device.device), (t, env)
    pair = _read_env(tmp_path / "pair.out")
    assert len(pair["JOB"].split(",")) == 2


def test_ascend_job_sees_ascend_rt_visible_devices_of_its_allocation(dev_cluster: Cluster) -> None:
    nodes = expected_nodes(dev_cluster.inventory)
    node, devices = next(
        (n, ds) for n, ds in nodes.items() if ds and ds[0].vendor.name == "ascend" and len(ds) >= 3
    )
    t = devices[0].type
    out = slurm(
        "srun",
        "-w",
        node,
        f"--gres=gpu:{t}:3",
        "bash",
        "-c",
        "echo $SLURM_STEP_GPUS/$ASCEND_RT_VISIBLE_DEVICES",
    )
    step, visible = out.strip().split("/")
    assert visible == ",".join(str(devices[int(i)].index) for i in step.split(","))
    assert len(visible.split(",")) == 3


def test_every_type_slurm_reports_has_catalog_facts(dev_cluster: Cluster) -> None:
    """Site type names included (gres_conf/examples/site-names.yaml): facts come from the model."""
    known = {
        d.type
        for devices in expected_nodes(dev_cluster.inventory).values()
        for d in devices
        if d.spec.memory_gib
    }
    for fields in scontrol_nodes().values():
        for part in fields["Gres"].split(","):
            if part.startswith("gpu:"):
                assert part.split(":")[1] in known


def test_discover_under_srun_then_merge_is_the_admin_pipeline(dev_cluster: Cluster, tmp_path: Path) -> None:
    """`srun --nodes=ALL slurm-hetero discover --json`: one JSON line per node, named by Slurm."""
    from tests.conftest import FIXTURES, REPO
    from tests.integration.conftest import cli

    capture = FIXTURES / "ascend" / "npu-smi-info_910b2c_hbm_drv23.0.2.1.txt"
    nodes = ["a100n1", "l40sn1", "ascendn1"]
    discover = [
        dev_cluster.python,
        "-m",
        "slurm_hetero",
        "discover",
        "--vendor",
        "ascend",
        "--from-file",
        str(capture),
        # the same facts on every node (else each asks scontrol, and ascendn1 has CPUs=16: no fold)
        *("--cpus", "8", "--sockets", "8", "--cores-per-socket", "1", "--threads-per-core", "1"),
        *("--real-memory", "16000"),
    ]
    out = slurm(
        "srun", "-w", ",".join(nodes), "-N3", "--ntasks-per-node=1", "--chdir", str(REPO), *discover, "--json"
    )
    lines = out.strip().splitlines()
    assert len(lines) == 3
    (tmp_path / "nodes.jsonl").write_text(out)
    merged = cli("inventory", "merge", str(tmp_path / "nodes.jsonl")).stdout
    assert "name: a100n1,ascendn1,l40sn1" in merged
