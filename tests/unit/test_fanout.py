"""`discover --nodes/--all`: srun for nodes Slurm can run a step on, ClusterShell for drained and
down ones (its exec worker stands in for ssh here), merged lines, unreachable nodes reported."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.core import proc
from slurm_hetero.core.errors import ToolError
from slurm_hetero.inventory import fanout
from slurm_hetero.slurm.scontrol import parse_node_records

LINE = (
    "NodeName={name} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=8 RealMemory=16000 Sockets=8 "
    "Boards=1 State={state} ThreadsPerCore=1 Weight=1 Partitions={partition} {reason}"
)
NODES = "\n".join(
    [
        LINE.format(name="g1", state="IDLE", partition="gpu,nvidia", reason=""),
        LINE.format(name="g2", state="MIXED", partition="gpu,nvidia", reason=""),
        LINE.format(name="g3", state="IDLE+DRAIN", partition="gpu", reason="Reason=gpu swapped [root@t]"),
        LINE.format(name="g4", state="DOWN*", partition="gpu", reason="Reason=Not responding [slurm@t]"),
    ]
)


def inventory_line(name: str) -> str:
    return json.dumps({"version": 1, "nodes": [{"name": name, "devices": []}]})


@pytest.fixture
def local_ssh() -> Iterator[None]:
    """ClusterShell's exec worker: the `ssh` commands run here, `%h` still each node's name."""
    from ClusterShell.Task import task_self
    from ClusterShell.Worker.Exec import ExecWorker

    task = task_self()
    before = task.default("distant_worker")
    task.set_default("distant_worker", ExecWorker)
    yield
    task.set_default("distant_worker", before)


def fake_remote(tmp_path: Path, dead: str = "") -> list[str]:
    """The remote command run over ssh; each node it runs for is appended to `ssh.log`."""
    script = tmp_path / "remote.py"
    script.write_text(
        "import json, sys\n"
        "node = sys.argv[sys.argv.index('--node') + 1]\n"
        f"open({str(tmp_path / 'ssh.log')!r}, 'a').write(node + '\\n')\n"
        f"if node == {dead!r}: sys.exit('ssh: connect to host ' + node + ': No route to host')\n"
        "print(json.dumps({'version': 1, 'nodes': [{'name': node, 'devices': []}]}))\n"
    )
    return [sys.executable, str(script)]


def fake_slurm(calls: list[list[str]], srun_answers: Sequence[str] = ("g1", "g2")):  # type: ignore[no-untyped-def]
    def run(argv: Sequence[str], timeout: float = 60.0) -> str:
        calls.append(list(argv))
        if list(argv[:4]) == ["scontrol", "show", "node", "-o"]:
            return NODES + "\n"
        if argv[0] == "srun":
            return "".join(inventory_line(n) + "\n" for n in srun_answers)
        raise AssertionError(argv)

    return run


def test_drained_and_down_nodes_are_not_given_to_srun() -> None:
    by_partition, ssh = fanout.split_targets(parse_node_records(NODES))
    assert by_partition == {"gpu": ["g1", "g2"]} and ssh == ["g3", "g4"]


def test_srun_names_nodes_and_counts_not_all() -> None:
    argv = fanout.srun_argv("gpu", ["g1", "g2"], ["slurm-hetero", "discover", "--json"])
    assert "--nodes=2" in argv and "--nodelist=g[1-2]" in argv and "--ntasks-per-node=1" in argv
    assert not any("ALL" in a for a in argv)


def test_fan_out_merges_srun_and_ssh_and_names_the_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_ssh: None
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(proc, "run", fake_slurm(calls))
    result = fanout.fan_out(
        None, fake_remote(tmp_path, dead="g4"), ssh_timeout=30, progress=lambda d, t: None
    )
    assert sorted(result.lines) == ["g1", "g2", "g3"]
    assert sorted((tmp_path / "ssh.log").read_text().split()) == ["g3", "g4"]  # g1, g2 by srun
    assert list(result.failed) == ["g4"] and "No route to host" in result.failed["g4"]
    assert [c[0] for c in calls] == ["scontrol", "srun"]


def test_nodes_srun_missed_go_over_ssh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_ssh: None
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(
        proc, "run", fake_slurm(calls, srun_answers=("g1",))
    )  # g2 busy: srun --immediate gave up
    result = fanout.fan_out("g[1-4]", fake_remote(tmp_path), ssh_timeout=30, progress=lambda d, t: None)
    assert "g2" in (tmp_path / "ssh.log").read_text().split() and not result.failed
    assert calls[0] == ["scontrol", "show", "node", "-o", "g[1-4]"]


def test_cli_prints_one_line_per_node_and_fails_naming_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_ssh: None
) -> None:
    monkeypatch.setattr(proc, "run", fake_slurm([]))
    remote = " ".join(fake_remote(tmp_path, dead="g4"))
    result = CliRunner().invoke(cli, ["discover", "--all", "--remote-command", remote])
    assert result.exit_code == 1
    assert [json.loads(x)["nodes"][0]["name"] for x in result.stdout.splitlines()] == ["g1", "g2", "g3"]
    assert result.stderr.strip().splitlines()[-1] == "slurm-hetero: 1 of 4 nodes gave no inventory: g4"


def test_a_node_neither_srun_nor_ssh_reached_names_both_causes_without_verbose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_ssh: None
) -> None:
    def run(argv: Sequence[str], timeout: float = 60.0) -> str:
        if argv[0] == "srun":
            raise ToolError(
                argv, 1, "srun: error: g1: task 0: Exited with exit code 1\nsrun: error: g2: task 1: Killed"
            )
        return fake_slurm([])(argv, timeout)

    monkeypatch.setattr(proc, "run", run)
    remote = " ".join(fake_remote(tmp_path, dead="g1"))
    result = CliRunner().invoke(cli, ["discover", "--nodes", "g1", "--remote-command", remote])
    assert result.exit_code == 1
    # srun's line about g1 (not the last line, about g2), then what ssh said
    assert (
        "slurm-hetero: g1: srun failed: srun: error: g1: task 0: Exited with exit code 1; "
        "then ssh: connect to host g1: No route to host" in result.stderr
    ), result.stderr


def scontrol_failing(said: str):  # type: ignore[no-untyped-def]
    def run(argv: Sequence[str], timeout: float = 60.0) -> str:
        raise ToolError(argv, 1, said)

    return run


@pytest.mark.parametrize("args", [["--all"], ["--nodes", "g[1-2]"]])
def test_a_controller_that_cannot_be_asked_exits_3(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adv26b F3: the exit-code table says 3 when a tool the command needed (scontrol) failed."""
    said = "slurm_load_node error: Unable to contact slurm controller (connect failure)"
    monkeypatch.setattr(proc, "run", scontrol_failing(said))
    result = CliRunner().invoke(cli, ["discover", *args, "--remote-command", "true"])
    assert result.exit_code == 3, result.output
    assert result.stderr.count("\n") == 1 and said in result.stderr, result.stderr


@pytest.mark.parametrize("said", ["", "Node n1 not found"])
def test_nodes_slurm_does_not_know_are_bad_input_exit_1(said: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """scontrol exits 1 with nothing on stderr for names slurmctld does not know (real 22.05)."""
    monkeypatch.setattr(proc, "run", scontrol_failing(said))
    result = CliRunner().invoke(cli, ["discover", "--nodes", "n1", "--remote-command", "true"])
    assert result.exit_code == 1, result.stderr
    assert result.stderr == "slurm-hetero: Slurm knows no node in 'n1'\n", result.stderr
