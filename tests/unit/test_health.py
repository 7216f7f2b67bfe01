"""`slurm-hetero health` on real captures: drain with the device named, resume only its own drains,
never an admin's, quiet when healthy; scontrol is a fake that records what would run."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.core import proc
from slurm_hetero.core.errors import ToolError
from slurm_hetero.core.model import ClusterInventory, Device
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.discover import discover_node
from slurm_hetero.node.health import Fault, drain_reason
from tests.conftest import FIXTURES

WHOLE = FIXTURES / "ascend" / "npu-smi-info_910b2c_hbm_drv23.0.2.1.txt"
NODE_LINE = (
    "NodeName={name} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=16 CPULoad=0.28 "
    "AvailableFeatures=ascend ActiveFeatures=ascend Gres=gpu:ascend910b2c:2 NodeAddr=127.0.0.1 "
    "NodeHostName=vm Version=22.05.8 OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC RealMemory=16000 "
    "Sockets=16 Boards=1 State={state} ThreadsPerCore=1 Weight=155 Partitions=ascend {reason}"
)


def node_line(name: str, state: str = "IDLE", reason: str = "") -> str:
    return NODE_LINE.format(
        name=name, state=state, reason=f"Reason={reason} [root@2026-01-01T00:00:00]" if reason else ""
    )


class FakeSlurm:
    def __init__(self, line: str) -> None:
        self.line, self.calls = line, []  # type: ignore[var-annotated]

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> str:
        self.calls.append(list(argv))
        if list(argv[:3]) == ["scontrol", "show", "node"]:
            return self.line + "\n"
        if list(argv[:2]) == ["scontrol", "update"]:
            return ""
        raise AssertionError(f"unexpected {argv}")

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls if c[:2] == ["scontrol", "update"]]


def write_inventory(tmp_path: Path, name: str = "npu1") -> Path:
    node = discover_node(load_catalog(), ["ascend"], [WHOLE], name, {"cpus": 16, "real_memory_mib": 16000})
    path = tmp_path / "inventory.yaml"
    path.write_text(inventory.dumps(ClusterInventory(nodes=(node,))))
    return path


def mixed_inventory(tmp_path: Path) -> Path:
    """npu1 of write_inventory with an NVIDIA L40S beside its two Ascend devices."""
    node = discover_node(load_catalog(), ["ascend"], [WHOLE], "npu1", {"cpus": 16, "real_memory_mib": 16000})
    l40s = Device("nvidia", "NVIDIA L40S", 0, "/dev/nvidia0", 46068, "l40s")
    path = tmp_path / "mixed.yaml"
    path.write_text(
        inventory.dumps(ClusterInventory(nodes=(dataclasses.replace(node, devices=(*node.devices, l40s)),)))
    )
    return path


def capture(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "now.txt"
    path.write_text(text)
    return path


def sick_text() -> str:
    """The real 2x 910B2C capture with NPU 1's Health turned from OK to Warning (a derived copy)."""
    lines = WHOLE.read_text().splitlines(keepends=True)
    row = next(i for i, line in enumerate(lines) if line.startswith("| 1     910B2C"))
    lines[row] = lines[row].replace("| OK            |", "| Warning       |")
    return "".join(lines)


def run_health(inv: Path, now: Path, fake: FakeSlurm, monkeypatch: pytest.MonkeyPatch, *extra: str):
    monkeypatch.setattr(proc, "run", fake.run)
    args = [
        "health",
        "--inventory",
        str(inv),
        "--node",
        "npu1",
        "--vendor",
        "ascend",
        "--from-file",
        str(now),
    ]
    return CliRunner().invoke(cli, [*args, *extra])


def test_healthy_node_is_quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm(node_line("npu1"))
    result = run_health(write_inventory(tmp_path), WHOLE, fake, monkeypatch)
    assert result.exit_code == 0 and result.output == "" and fake.updates() == []


def test_unhealthy_device_drains_the_node_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm(node_line("npu1"))
    result = run_health(write_inventory(tmp_path), capture(tmp_path, sick_text()), fake, monkeypatch)
    assert result.exit_code == 1
    [update] = fake.updates()
    assert update[:4] == ["scontrol", "update", "nodename=npu1", "state=drain"]
    assert update[4].startswith("reason=slurm-hetero: ascend 1 (/dev/davinci1): npu-smi Health:Warning")
    assert "ascend 0" not in update[4]


def test_own_drain_is_resumed_when_healthy_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm(node_line("npu1", "IDLE+DRAIN", "slurm-hetero: ascend 1 (/dev/davinci1): bad"))
    result = run_health(write_inventory(tmp_path), WHOLE, fake, monkeypatch)
    assert result.exit_code == 0
    assert fake.updates() == [["scontrol", "update", "nodename=npu1", "state=resume"]]


def test_admin_drain_is_never_resumed_or_overwritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm(node_line("npu1", "IDLE+DRAIN", "bios update"))
    assert run_health(write_inventory(tmp_path), WHOLE, fake, monkeypatch).exit_code == 0
    sick = run_health(write_inventory(tmp_path), capture(tmp_path, sick_text()), fake, monkeypatch)
    assert sick.exit_code == 1 and "already drained by an admin" in sick.output
    assert fake.updates() == []


def test_an_admin_reason_that_only_looks_like_ours_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adv26b F8: Slurm keeps `Reason= slurm-hetero: ...` with its leading blank; health wrote no
    such reason, so it neither resumes nor overwrites it."""
    fake = FakeSlurm(node_line("npu1", "IDLE+DRAIN", " slurm-hetero: admin leading space"))
    assert run_health(write_inventory(tmp_path), WHOLE, fake, monkeypatch).exit_code == 0
    sick = run_health(write_inventory(tmp_path), capture(tmp_path, sick_text()), fake, monkeypatch)
    assert sick.exit_code == 1 and "already drained by an admin" in sick.output
    assert fake.updates() == []


def test_dry_run_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm(node_line("npu1"))
    now = capture(tmp_path, sick_text())
    result = run_health(write_inventory(tmp_path), now, fake, monkeypatch, "--dry-run", "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code == 1 and fake.updates() == []
    assert doc["actions"][0][:4] == ["scontrol", "update", "nodename=npu1", "state=drain"] and doc["dry_run"]


def test_missing_device_and_shrunk_memory_are_faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = write_inventory(tmp_path)
    lines = WHOLE.read_text().splitlines(keepends=True)
    row = next(i for i, line in enumerate(lines) if line.startswith("| 1     910B2C"))
    one_npu = "".join(lines[:row] + lines[row + 3 :])  # NPU 1's record removed (derived copy)
    fake = FakeSlurm(node_line("npu1"))
    result = run_health(inv, capture(tmp_path, one_npu), fake, monkeypatch, "--dry-run", "--json")
    assert json.loads(result.stdout)["faults"] == ["ascend 1 (/dev/davinci1): missing"]
    shrunk = WHOLE.read_text().replace("20687/ 65536", "20687/ 32768")
    result = run_health(inv, capture(tmp_path, shrunk), fake, monkeypatch, "--dry-run", "--json")
    assert json.loads(result.stdout)["faults"] == [
        "ascend 1 (/dev/davinci1): memory 32768 MiB, inventory 65536 MiB"
    ]


def test_links_down_are_faults(tmp_path: Path) -> None:
    from slurm_hetero.core.model import Device, Link, NodeInventory
    from slurm_hetero.node.health import compare

    linked = Device(
        "nvidia", "NVIDIA A100-SXM4-80GB", 0, "/dev/nvidia0", 81920, links=(Link(1, "nvlink", 12),)
    )
    now = Device("nvidia", "NVIDIA A100-SXM4-80GB", 0, "/dev/nvidia0", 81920, links=(Link(1, "nvlink", 6),))
    [fault] = compare(NodeInventory("n", devices=(linked,)), [now])
    assert str(fault) == "nvidia 0 (/dev/nvidia0): nvlink to 1 6/12 links"


def test_node_not_in_the_inventory_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm(node_line("npu1"))
    monkeypatch.setattr(proc, "run", fake.run)
    inv = write_inventory(tmp_path, "other")
    result = CliRunner().invoke(
        cli, ["health", "--inventory", str(inv), "--node", "npu1", "--from-file", str(WHOLE)]
    )
    assert result.exit_code == 1 and "node npu1 is not in" in result.stderr


def test_hygon_table_alone_is_checked_with_the_admins_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = FIXTURES / "hygon" / "hygon-dcu_rocm-smi-dtk_4x-dcu_paddle-docs.txt"
    node = discover_node(load_catalog(), ["hygon"], [table], "dcun1", {"cpus": 16}, model="K100_AI")
    inv = tmp_path / "inventory.yaml"
    inv.write_text(inventory.dumps(ClusterInventory(nodes=(node,))))
    fake = FakeSlurm(node_line("dcun1"))
    monkeypatch.setattr(proc, "run", fake.run)
    args = [
        "health",
        "--inventory",
        str(inv),
        "--node",
        "dcun1",
        "--vendor",
        "hygon",
        "--from-file",
        str(table),
    ]
    result = CliRunner().invoke(cli, [*args, "--model", "K100_AI"])
    assert result.exit_code == 0 and result.output == "" and fake.updates() == []
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "--model" in result.output


def test_a_resumed_node_that_still_shows_our_reason_is_not_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm 24.11 keeps the reason after `state=resume` (State=IDLE): healthy is quiet, and the
    same fault again drains the node again."""
    inv = write_inventory(tmp_path)
    reason = "slurm-hetero: ascend 1 (/dev/davinci1): npu-smi Health:Warning"
    fake = FakeSlurm(node_line("npu1", "IDLE", reason))
    result = run_health(inv, WHOLE, fake, monkeypatch)
    assert result.exit_code == 0 and fake.updates() == []
    result = run_health(inv, capture(tmp_path, sick_text()), fake, monkeypatch)
    assert result.exit_code == 1
    [update] = fake.updates()
    assert update[3] == "state=drain" and update[4] == f"reason={reason}"


def live_health(inv: Path, fake: FakeSlurm, monkeypatch: pytest.MonkeyPatch, tool: str | None, *extra: str):
    """health on the live path (no --from-file): `npu-smi` is the shell script `tool` (None: not on
    PATH at all), run for real through proc.run with a 1 s timeout; scontrol is `fake`."""
    bin_dir = inv.parent / "bin"
    bin_dir.mkdir(exist_ok=True)
    if tool is not None:
        script = bin_dir / "npu-smi"
        script.write_text(f"#!/bin/sh\n{tool}\n")
        script.chmod(0o755)
    real_run = proc.run
    monkeypatch.setenv("PATH", str(bin_dir))

    def run(argv: Sequence[str], timeout: float = 60.0) -> str:
        return fake.run(argv) if argv[0] == "scontrol" else real_run(argv, timeout=1.0)

    monkeypatch.setattr(proc, "run", run)
    args = ["health", "--inventory", str(inv), "--node", "npu1", *extra]
    return CliRunner().invoke(cli, args)


@pytest.mark.parametrize(
    ("tool", "said"),
    [
        (
            "echo 'dcmi module initialize failed. ret is -8005' >&2; exit 1",
            "failed (exit code 1): dcmi module",
        ),
        ("exec /bin/sleep 30", "`npu-smi info` failed (timed out after 1s)"),
        (None, "`npu-smi info` failed (not found)"),
        ("/usr/bin/head -c 3000 /dev/urandom", "npu-smi info"),
        (r"printf 'NPU \\351\\377 Health\\n'", "npu-smi info"),
    ],
    ids=["exits-non-zero", "hangs", "missing", "random-bytes", "latin1"],
)
def test_a_tool_that_cannot_ask_the_devices_drains_the_node_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool: str | None, said: str
) -> None:
    """Issue 26 repro 1: a dead driver (the tool fails, hangs or is gone) is a fault of the node, as
    the same devices missing from a capture are: drained, the reason naming the tool and what it said.
    adv26 h-*-garbage/latin1: output that is not UTF-8 drains too (it was a traceback)."""
    fake = FakeSlurm(node_line("npu1"))
    result = live_health(write_inventory(tmp_path), fake, monkeypatch, tool)
    assert result.exit_code == 1, result.output
    [update] = fake.updates()
    assert update[:4] == ["scontrol", "update", "nodename=npu1", "state=drain"]
    assert update[4].startswith("reason=slurm-hetero: ascend: "), update
    assert said in update[4] and "davinci" not in update[4], update  # one fault, not one per device
    assert "not found" not in update[4] or tool is None, update


def test_a_tool_that_answers_again_resumes_only_its_own_drain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = write_inventory(tmp_path)
    answers = f'[ "$2" = -t ] && exit 1; exec /bin/cat {WHOLE}'  # `info` answers, `info -t topo` not
    ours = FakeSlurm(
        node_line("npu1", "IDLE+DRAIN", "slurm-hetero: ascend: `npu-smi info` failed (not found)")
    )
    assert live_health(inv, ours, monkeypatch, answers).exit_code == 0
    assert ours.updates() == [["scontrol", "update", "nodename=npu1", "state=resume"]]
    admins = FakeSlurm(node_line("npu1", "IDLE+DRAIN", "driver upgrade"))
    result = live_health(inv, admins, monkeypatch, "exit 9")
    assert result.exit_code == 1 and "already drained by an admin" in result.output
    assert admins.updates() == []


def test_a_tool_that_cannot_ask_with_dry_run_says_the_drain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSlurm(node_line("npu1"))
    result = live_health(write_inventory(tmp_path), fake, monkeypatch, "exit 2", "--dry-run", "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code == 1 and fake.updates() == []
    assert doc["faults"] == ["ascend: `npu-smi info` failed (exit code 2)"]
    assert doc["actions"][0][3:] == [
        "state=drain",
        "reason=slurm-hetero: ascend: `npu-smi info` failed (exit code 2)",
    ]


class SlurmSays(FakeSlurm):
    """scontrol show node fails with `said` (exit 1), as scontrol does."""

    def __init__(self, said: str) -> None:
        super().__init__("")
        self.said = said

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> str:
        if list(argv[:3]) == ["scontrol", "show", "node"]:
            self.calls.append(list(argv))
            raise ToolError(list(argv), 1, self.said)
        return super().run(argv, timeout)


def test_a_controller_that_cannot_be_asked_is_scontrols_failure_exit_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """adv26 h-ctld-down: slurmctld down read as "node is not known to Slurm", exit 1."""
    fake = SlurmSays("slurm_load_node error: Unable to contact slurm controller (connect failure)")
    result = run_health(write_inventory(tmp_path), capture(tmp_path, sick_text()), fake, monkeypatch)
    assert result.exit_code == 3, result.output
    assert "`scontrol show node -o npu1` failed (exit code 1): slurm_load_node error: Unable" in result.output
    assert "not known" not in result.output and fake.updates() == []
    assert "npu1: ascend 1 (/dev/davinci1): npu-smi Health=Warning" in caplog.text  # the fault, said first


def test_a_node_slurm_does_not_know_is_said_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = SlurmSays("Node npu1 not found")
    result = run_health(write_inventory(tmp_path), capture(tmp_path, sick_text()), fake, monkeypatch)
    assert result.exit_code == 1 and "node npu1 is not known to Slurm" in result.output
    assert fake.updates() == []


@pytest.mark.parametrize("how", ["option", "env"])
@pytest.mark.parametrize("name", ["n1\nx", "n1\rX"])
def test_a_node_name_with_a_control_character_is_one_escaped_line(
    name: str, how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adv26b F9: the name is checked as discover checks it, and said escaped, before any work."""
    monkeypatch.setattr(proc, "run", FakeSlurm(node_line("npu1")).run)
    args = ["health", "--inventory", str(write_inventory(tmp_path)), "--dry-run"]
    if how == "option":
        args += ["--node", name]
    else:
        monkeypatch.setenv("SLURMD_NODENAME", name)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.stderr
    assert f"node name: {name!r} is not a host name" in result.stderr and "\r" not in result.stderr


def test_a_capture_without_topology_leaves_the_links_unchecked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adv32 C15: an `nvidia-smi --query-gpu` capture lists no links, and every NVLink of the
    inventory read as down: a healthy node would have been drained."""
    fake = FakeSlurm(node_line("a100n1"))
    monkeypatch.setattr(proc, "run", fake.run)
    mixed = FIXTURES.parents[1] / "gres_conf" / "examples" / "mixed.yaml"
    assert any(d.links for n in inventory.load(mixed).nodes if n.name == "a100n1" for d in n.devices)
    csv = FIXTURES / "nvidia" / "nvidia-smi-query-gpu-csv_4x-a100-sxm4-80gb_drv580.txt"
    args = ["health", "--inventory", str(mixed), "--node", "a100n1", "--vendor", "nvidia"]
    result = CliRunner().invoke(cli, [*args, "--from-file", str(csv)])
    assert result.exit_code == 0 and result.output == "" and fake.updates() == [], result.output


def test_a_drain_reason_is_ascii_whatever_the_tool_printed() -> None:
    """adv47 H10: a garbled vendor tool's U+FFFD characters went into Slurm's node Reason."""
    reason = drain_reason([Fault("ascend", "cannot parse npu-smi output ['\ufffd\\x08\ufffd'] a=b")])
    assert reason.isascii() and reason.isprintable()
    assert reason == "slurm-hetero: ascend: cannot parse npu-smi output ['\\ufffd\\x08\\ufffd'] a:b"


def test_vendor_checks_only_that_vendors_devices_of_a_mixed_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adv48 row 228: on a node of two vendors, --vendor ascend drained it for the other vendor's
    devices, which nobody had asked for."""
    inv = mixed_inventory(tmp_path)
    fake = FakeSlurm(node_line("npu1"))
    result = run_health(inv, WHOLE, fake, monkeypatch)
    assert result.exit_code == 0 and result.output == "" and fake.updates() == [], result.output
    result = run_health(inv, WHOLE, fake, monkeypatch, "--vendor", "amd")
    assert result.exit_code == 1 and fake.updates() == []
    assert f"--vendor amd: npu1 has no amd devices in {inv} (['ascend', 'nvidia'])" in result.output
    result = run_health(inv, WHOLE, fake, monkeypatch, "--vendor", "NVIDIA")  # adv49 row 82
    assert result.exit_code == 1 and "unknown vendor 'NVIDIA'; known vendors: amd, ascend," in result.output


def test_a_check_of_some_vendors_never_resumes_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adv49 rows 68-70: `--vendor ascend` found its devices healthy and resumed a drain that named
    the node's nvidia device, which it had not checked."""
    inv = mixed_inventory(tmp_path)
    drained = node_line("npu1", "IDLE+DRAIN", "slurm-hetero: nvidia 0 (/dev/nvidia0): missing")
    fake = FakeSlurm(drained)
    result = run_health(inv, WHOLE, fake, monkeypatch)
    assert result.exit_code == 0 and fake.updates() == [], result.output
    assert (
        "npu1 stays drained (slurm-hetero: nvidia 0 (/dev/nvidia0): missing): only some of its vendors"
        in result.output
    )


def test_captures_of_one_vendor_check_only_its_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adv50: without --vendor, an ascend capture of a node that also holds an L40S drained it for
    'nvidia 0 (/dev/nvidia0): missing', a device no capture was of."""
    mixed = mixed_inventory(tmp_path)
    fake = FakeSlurm(node_line("npu1"))
    monkeypatch.setattr(proc, "run", fake.run)

    def health(inv: Path, capture_file: Path) -> Any:
        return CliRunner().invoke(
            cli, ["health", "--inventory", str(inv), "--node", "npu1", "--from-file", str(capture_file)]
        )

    result = health(mixed, WHOLE)
    assert result.exit_code == 0 and fake.updates() == [], result.output
    result = health(mixed, capture(tmp_path, sick_text()))
    [update] = fake.updates()
    assert result.exit_code == 1 and "ascend 1" in update[4] and "nvidia" not in update[4], update
    a100 = FIXTURES / "nvidia" / "nvidia-smi-q-x_a100-sxm4-80gb_mig_drv535_1-of-4-gpus.xml"
    result = health(write_inventory(tmp_path), a100)
    assert (
        result.exit_code == 1
        and "the captures are of nvidia; npu1 has no nvidia devices (['ascend'])" in result.output
    )
