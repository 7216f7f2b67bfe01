"""`request explain` says what the user of sbatch sees (issue 10 item 8): sbatch's own refusals of
--gres, --gpus*, -N, -n and --ntasks-per-node, with its words, and else the hook's message on the
job_desc that sbatch sends. Every row was measured with the real sbatch of the release on the dev
cluster (mixed.yaml, the hook installed, default settings; `sbatch --hold --wrap=hostname OPTIONS`
as nobody): its refusal ("sbatch: error: TEXT") or the hook's line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.submit.sbatch import (
    BASE_GRES,
    CPUS_EXCLUSIVE,
    GPUS_PER_SOCKET_REFUSAL,
    GPUS_PER_TASK_REFUSAL,
    gres_refusal,
    het_mem_refusal,
    het_sent,
    job_from_options,
    node_range,
)
from tests.unit.test_score import MIXED

NVIDIA = " [vendor nvidia: the default here for a request without a type; for another add -C ascend]"
GRES = "Invalid generic resource (gres) specification"
TRES = "Invalid Trackable RESource (TRES) specification"
BOTH = ("22.05", "24.11")

# (releases, options, what the user sees: `sbatch: TEXT` for sbatch's own refusal, else the hook's)
MEASURED = [
    (BOTH, ["--gres=GPUMEM:20G"], f"sbatch: {GRES}"),
    # A17/A18/C12: --gpus-per-socket without --sockets-per-node (or -B S) is sbatch's to refuse (then
    # "Invalid generic resource ..."), after the TRES grammar and its first gpu checks, before the
    # task count; a zero count passes
    (BOTH, ["--gpus-per-socket=1"], f"sbatch: {GPUS_PER_SOCKET_REFUSAL}"),
    (BOTH, ["--gpus-per-socket=l40s:1"], f"sbatch: {GPUS_PER_SOCKET_REFUSAL}"),
    (BOTH, ["--gpus-per-socket=1", "--gres=gpucore:50"], f"sbatch: {GPUS_PER_SOCKET_REFUSAL}"),
    (BOTH, ["--gpus-per-socket=1", "--gpus-per-task=1"], f"sbatch: {GPUS_PER_SOCKET_REFUSAL}"),
    (BOTH, ["--gpus-per-socket=1", "--gpus=1", "-N", "2"], f"sbatch: {GPUS_PER_SOCKET_REFUSAL}"),
    (BOTH, ["--gpus-per-socket=1", "--gres=GPUMEM:20G"], f"sbatch: {GRES}"),
    (
        BOTH,
        ["--gpus-per-socket=1", "--gres=gpu:2", "--gpus=1"],
        "sbatch: Failed to ensure --gpus >= --gres=gpu/--gpus-per-node >= --gpus-per-socket",
    ),
    (BOTH, ["--gpus-per-socket=1", "-n", "0"], 'sbatch: Invalid numeric value "0" for --ntasks.'),
    (BOTH, ["--gpus-per-socket=0"], "gpu:0: device count must be a whole number from 1 to 9999"),
    (
        BOTH,
        ["--gpus-per-socket=1", "--sockets-per-node=1"],
        "gpumem:20G,gpu:1: gpumem/gpucore cannot be decided with --gpus-per-socket (the hook's table does "
        "not know how many sockets a node has or which devices sit on each); ask for devices per node "
        "(--gpus-per-node=N) with the gpumem, or for a gpu TYPE without it: --gpus-per-socket=TYPE:N, "
        "TYPE one of a100_80g, ascend910b3, l40s",
    ),
    (("22.05",), ["--gres=gpumem=20G"], f"sbatch: {GRES}"),
    (("24.11",), ["--gres=gpumem=20G"], "gpumem=20G -> gres/gpu:l40s=1 (best-fit)" + NVIDIA),
    (("22.05",), ["--gres=gres:gpumem:20G"], "gpumem:20G -> gres:gpu:l40s:1 (best-fit)" + NVIDIA),
    (("24.11",), ["--gres=gres:gpumem:20G"], f"sbatch: {GRES}"),
    (("22.05",), ["--gres=gres/gpumem:20G"], f"sbatch: {GRES}"),
    (("24.11",), ["--gres=gres/gpumem:20G"], "gpumem:20G -> gres/gpu:l40s:1 (best-fit)" + NVIDIA),
    (BOTH, ["--gres=shard:1,gpumem:20G"], f"sbatch: {GRES}"),
    (("22.05",), ["--gres=gpumem:"], f"sbatch: {GRES}"),
    (("24.11",), ["--gres=gpumem:"], f"sbatch: {TRES}"),
    (("22.05",), ["--gres=gpumem:20G:foo"], f"sbatch: {GRES}"),
    (("24.11",), ["--gres=gpumem:20G:foo"], f"sbatch: {TRES}"),
    (("22.05",), ["--gres=gpumem:20G(S:0)"], f"sbatch: {GRES}"),
    (("24.11",), ["--gres=gpumem:20G(S:0)"], f"sbatch: {TRES}"),
    (("22.05",), ["--gres=gpumem:(S:0)"], f"sbatch: {GRES}"),
    (("24.11",), ["--gres=gpumem:(S:0)"], f"sbatch: {TRES}"),
    (("22.05",), ["--gres=:gpumem:20G"], f"sbatch: {GRES}"),
    (("24.11",), ["--gres=:gpumem:20G"], f"sbatch: {TRES}"),  # slurmctld's, the client passes it
    (("22.05",), ["--gres=gpu:l40s:1:foo,gpumem:20G"], f"sbatch: {GRES}"),
    (("24.11",), ["--gres=gpu:l40s:1:foo,gpumem:20G"], f"sbatch: {TRES}"),
    (BOTH, ["--gres=GPU:1,gpumem:20G"], f"sbatch: {GRES}"),
    (BOTH, ["--gres=gpumem:0"], "gpumem:0: size must be positive"),  # a zero item passes sbatch
    (BOTH, ["--gres=gpumem:20G:1"], "gpumem:20G:1: malformed; use gpumem:SIZE"),
    (BOTH, ["--gres=gpumem:l40s:20G"], "gpumem:l40s:20G: malformed; use gpumem:SIZE"),
    (BOTH, ["--gres=gpumem"], "gpumem: missing size, e.g. gpumem:20G"),
    (BOTH, ["--gres=gpu:1,gpumem:20G,gpu:2"], "gpu:2: device count given more than once"),
    (BOTH, ["--gres=gpumem:20G,gpumem:30G"], "gpumem:30G: given more than once"),
    (BOTH, ["--gres=gpumem:20G,"], "gpumem:20G -> gres{sep}gpu:l40s:1 (best-fit)" + NVIDIA),
    # item 3: each --gpus item is an item of its own
    (BOTH, ["--gpus=l40s:1,a100_80g:1"], "gpu:a100_80g:1: device count given more than once"),
    (BOTH, ["--gpus=1,l40s:1"], "sbatch: Invalid GRES specification (with and without type identification)"),
    # item 4: 24.11 sends --gpus-per-task=TYPE:N as gres/gpu:TYPE=N
    (("22.05",), ["-n1", "--gpus-per-task=l40s:1"], "gpumem:20G,gpu:l40s:1 -> gres:gpu:l40s:1 (best-fit)"),
    (("24.11",), ["-n1", "--gpus-per-task=l40s:1"], "gpumem:20G,gpu:l40s=1 -> gres/gpu:l40s:1 (best-fit)"),
    (("24.11",), ["-n1", "--gpus-per-task=1"], "gpumem:20G,gpu=1 -> gres/gpu:l40s:1 (best-fit)" + NVIDIA),
    (BOTH, ["--gpus-per-node=l40s:1"], "gpu:l40s:1,gpumem:20G -> gres{sep}gpu:l40s:1 (best-fit)"),
    # item 5: -N, -n, --ntasks-per-node as sbatch reads them
    (BOTH, ["-N", "1-2"], "gpumem:20G -> gres{sep}gpu:l40s:1 (best-fit)" + NVIDIA),
    (BOTH, ["-N", "-1"], "gpumem:20G -> gres{sep}gpu:l40s:1 (best-fit)" + NVIDIA),  # 1-1
    (BOTH, ["-N", "0"], "gpumem:20G -> gres{sep}gpu:l40s:1 (best-fit)" + NVIDIA),
    (BOTH, ["-N", "0-2"], "gpumem:20G -> gres{sep}gpu:l40s:1 (best-fit)" + NVIDIA),
    (  # issue 26: min_nodes is 32 bits wide, so 65534 is a count, not NO_VAL16 (once read as unset)
        BOTH,
        ["-N", "65534"],
        "gpumem:20G: no device type fits (1 excluded, 2 too few nodes); "
        "at most 1 node(s) with 1 devices each (l40s): ask -N 1",
    ),
    (
        BOTH,
        ["-N", "2-3"],
        "gpumem:20G: no device type fits (1 excluded, 2 too few nodes); "
        "at most 1 node(s) with 1 devices each (l40s): ask -N 1",
    ),
    (BOTH, ["-N", "99999999999999999999"], 'sbatch: "99999999999999999999" is not a valid node count'),
    (BOTH, ["-N", "4294967295"], 'sbatch: "4294967295" is not a valid node count'),
    (BOTH, ["-N", "abc"], 'sbatch: "abc" is not a valid node count'),
    (BOTH, ["-N", "2-1"], "sbatch: Maximum node count 1 is less than minimum node count 2"),
    (BOTH, ["-N", "1-"], "sbatch: Maximum node count -1 is less than minimum node count 1"),
    (("22.05",), ["-N", "1-99999999999"], "gpumem:20G -> gres:gpu:l40s:1 (best-fit)" + NVIDIA),
    (("24.11",), ["-N", "1-99999999999"], "sbatch: Maximum node count -1 is less than minimum node count 1"),
    (BOTH, ["-n", "0"], 'sbatch: Invalid numeric value "0" for --ntasks.'),
    (BOTH, ["-n", "-1"], 'sbatch: Invalid numeric value "-1" for --ntasks.'),
    (
        ("22.05",),
        ["-n", "99999999999999999999"],
        "sbatch: Numeric argument (9223372036854775807) to big for --ntasks.",
    ),
    (
        ("24.11",),
        ["-n", "99999999999999999999"],
        "sbatch: Numeric argument (9223372036854775807) too large for --ntasks.",
    ),
    (("22.05",), ["-n", "4294967294"], "sbatch: invalid number of tasks (-n -2)"),
    (("24.11",), ["-n", "4294967294"], "sbatch: Numeric argument (4294967294) too large for --ntasks."),
    (BOTH, ["--ntasks-per-node=0"], 'sbatch: Invalid numeric value "0" for --ntasks-per-node.'),
    (BOTH, ["--ntasks-per-node=-1"], 'sbatch: Invalid numeric value "-1" for --ntasks-per-node.'),
    # sbatch 22.05.8's words, read while it parses the options (before the TRES): fuzz 2026-11-25;
    # 24.11's the same (measured 2026-11-25 with its sbatch, `dev-cluster run --slurm-release 24.11`)
    (BOTH, ["--mem=abc"], "sbatch: Invalid --mem specification"),
    (BOTH, ["--mem=1.5G"], "sbatch: Invalid --mem specification"),
    (BOTH, ["--mem-per-cpu=x"], "sbatch: Invalid --mem-per-cpu specification"),
    (BOTH, ["--gres=GPUMEM:20G", "--mem-per-gpu=1.5G"], "sbatch: Invalid --mem-per-gpu specification"),
    # issue 26: a figure past strtoll (or negative) is sbatch's refusal (22.05.8's client, measured);
    # one it takes is a figure the hook holds the job to, not an unset one (NO_VAL was read as such)
    (BOTH, ["--mem=1000000000000000000000T"], "sbatch: Invalid --mem specification"),
    (BOTH, ["--mem=-5"], "sbatch: Invalid --mem specification"),
    (BOTH, ["--mem-per-cpu=99999999999999999999"], "sbatch: Invalid --mem-per-cpu specification"),
    (BOTH, ["--mem=\u0662"], "sbatch: Invalid --mem specification"),  # a digit, not an ASCII one
    (
        BOTH,
        ["--mem=5000000000"],
        "gpumem:20G: no device type fits (1 excluded, 2 nodes too small); l40s nodes with 1 devices have "
        "at most 16000M memory, the job needs 5000000000M per node",
    ),
    (
        BOTH,
        ["--gres=gpumem:20G,gpu:1", "--mem-per-gpu=99999999999999G"],
        "gpumem:20G,gpu:1: no device type fits (1 excluded, 2 nodes too small); l40s nodes with 1 devices "
        "have at most 16000M memory, the job needs 99999999999999G per node",
    ),
    # issue 26: -c and --ntasks-per-node reach the job_desc in 16 bits (the outcomes measured on the
    # suite's dev cluster, tests/integration/test_job_submit_slurm.py; the words here mixed.yaml's)
    # -c 65537 is 1 in cpus_per_task, -c 65536 0 (unset); min_cpus keeps 32 bits and slurmctld
    # holds the job to it: refused, not rewritten to pend forever (adversarial F5)
    (
        BOTH,
        ["-c", "65537"],
        "gpumem:20G: no device type fits (1 excluded, 2 nodes too small); l40s nodes with 1 devices have "
        "at most 8 CPUs, the job needs 65537 per node",
    ),
    (
        BOTH,
        ["-c", "65536"],
        "gpumem:20G: no device type fits (1 excluded, 2 nodes too small); l40s nodes with 1 devices have "
        "at most 8 CPUs, the job needs 65536 per node",
    ),
    (  # 24.11: 1 task per node in 16 bits, 65,537 CPUs in min_cpus
        ("24.11",),
        ["--ntasks-per-node=65537"],
        "gpumem:20G: no device type fits (1 excluded, 2 nodes too small); l40s nodes with 1 devices have "
        "at most 8 CPUs, the job needs 65537 per node",
    ),
    (  # 22.05: 65,537 tasks (32 bits) at 1 per node (16 bits)
        ("22.05",),
        ["--ntasks-per-node=65537"],
        "gpumem:20G: no device type fits (1 excluded, 2 too few nodes); at most 1 node(s) with 1 devices "
        "each (l40s): ask -N 1 -n 1 (--ntasks-per-node=1)",
    ),
    (  # the nodes come from -n over --ntasks-per-node: `-N 1` would contradict them
        BOTH,
        ["-n", "2", "--ntasks-per-node=1"],
        "gpumem:20G: no device type fits (1 excluded, 2 too few nodes); at most 1 node(s) with 1 devices "
        "each (l40s): ask -N 1 -n 1 (--ntasks-per-node=1)",
    ),
    # adversarial (stop 29): -O allocates one task's CPUs a node (typed `--gres=gpu:l40s:1 -O -n 16`
    # ran, NumCPUs=1); --mincpus holds each node to its CPUs (`gpu:l40s:1 --mincpus=9` pends forever)
    (BOTH, ["-O", "-n", "16"], "gpumem:20G -> gres{sep}gpu:l40s:1 (best-fit)" + NVIDIA),
    (
        BOTH,
        ["--overcommit", "-N1", "--ntasks-per-node=9"],
        "gpumem:20G -> gres{sep}gpu:l40s:1 (best-fit)" + NVIDIA,
    ),
    (
        BOTH,
        ["--mincpus=9"],
        "gpumem:20G: no device type fits (1 excluded, 2 nodes too small); ascend910b3 of vendor ascend "
        "would fit: add -C ascend",
    ),
    (("22.05",), ["-c", "4294967294"], "sbatch: invalid number of cpus per task (-c -2)"),  # F6
    (
        ("24.11",),
        ["-c", "4294967294"],
        "sbatch: Numeric argument (4294967294) too large for --cpus-per-task.",
    ),
    (BOTH, ["--mem=8796093022208T"], "gpumem:20G -> gres{sep}gpu:l40s:1 (best-fit)" + NVIDIA),  # 2^63: wraps
    (BOTH, ["--mem=10GB"], "gpumem:20G -> gres{sep}gpu:l40s:1 (best-fit)" + NVIDIA),
    # adversarial (stop 29): -c beside --cpus-per-gpu is sbatch's refusal, in its words per release
    (("22.05",), ["-N1", "-n", "2", "-c", "4", "--cpus-per-gpu=1"], "sbatch: " + CPUS_EXCLUSIVE["gres:"]),
    (("24.11",), ["-N1", "-n", "2", "-c", "4", "--cpus-per-gpu=1"], "sbatch: " + CPUS_EXCLUSIVE["gres/"]),
    (BOTH, ["-c", "0"], 'sbatch: Invalid numeric value "0" for --cpus-per-task.'),
    (BOTH, ["-c", "x"], 'sbatch: Invalid numeric value "x" for --cpus-per-task.'),
    (BOTH, ["--cpus-per-gpu=0"], 'sbatch: Invalid numeric value "0" for --cpus-per-gpu.'),  # N08 (24.11)
    (BOTH, ["--cpus-per-gpu=2x"], 'sbatch: Invalid numeric value "2x" for --cpus-per-gpu.'),
    (
        ("24.11",),
        ["--mem-per-gpu=4G"],
        "sbatch: Requested mem_per_tres=gres/gpu:4096 but did not request any GPU.",
    ),
    (
        ("22.05",),
        ["--mem-per-gpu=4G"],
        "sbatch: Requested mem_per_tres=gres:gpu:4096 but did not request any GPU.",
    ),
    (("22.05",), ["--gres=GPUMEM:20G", "--mem-per-gpu=4G"], f"sbatch: {GRES}"),
    (
        ("22.05",),
        ["--gres=gpumem:20G,gpu:1", "--mem-per-gpu=4G"],
        "gpumem:20G,gpu:1 -> gres:gpu:l40s:1 (best-fit)" + NVIDIA,
    ),
    (("22.05",), ["-w", "a100n1,l40sn1", "-N", "1"], "sbatch: invalid number of nodes (-N 2-1)"),
    (
        ("22.05",),
        ["--gres=GPUMEM:20G", "-w", "a100n1,l40sn1", "-N", "1"],
        "sbatch: invalid number of nodes (-N 2-1)",
    ),
    (("22.05",), ["--gpus=1", "-w", "a100n1,l40sn1"], "sbatch: --gpus < -N"),
    (("22.05",), ["--gpus-per-task=1", "-N", "1-2"], "sbatch: " + GPUS_PER_TASK_REFUSAL["22.05"]),
    (("22.05",), ["--gpus-per-task=1", "-N", "1", "-c", "1"], "sbatch: " + GPUS_PER_TASK_REFUSAL["22.05"]),
    (("22.05",), ["--gpus-per-task=1", "-w", "a100n1"], "sbatch: " + GPUS_PER_TASK_REFUSAL["22.05"]),
    # 24.11 fuzz seed 20261126 (2026-11-25)
    (
        ("24.11",),
        ["--cpus-per-gpu=8"],
        "sbatch: Requested cpus_per_tres=gres/gpu:8 but did not request any GPU.",
    ),
    (("24.11",), ["--gpus-per-task=1", "-N", "1-3"], "sbatch: " + GPUS_PER_TASK_REFUSAL["24.11"]),
    # 24.11 fuzz seed 20261126 after those fixes: --mem-per-gpu's refusal comes before --cpus-per-gpu's;
    # -N with --ntasks-per-node gives --gpus-per-task its tasks even with -c; -w a,b -N1 keeps -N's
    # count for sbatch's --gpus check (the hook refuses the -w)
    (
        ("24.11",),
        ["--cpus-per-gpu=2", "--mem-per-gpu=4G"],
        "sbatch: Requested mem_per_tres=gres/gpu:4096 but did not request any GPU.",
    ),
    (
        ("24.11",),
        ["--gpus-per-task=2", "-N", "2", "--ntasks-per-node=2", "-c", "4"],
        "gpumem:20G,gpu=2: no device type fits (1 excluded, 1 too few per node, 1 too few nodes); "
        "at most 1 node(s) with 4 devices each (a100_80g): ask -N 1 -n 2 (--ntasks-per-node=2)",
    ),
    (
        ("24.11",),
        ["--gpus=1", "-N", "1", "-w", "a100n1,l40sn1"],
        "gpumem:20G,gpu:1: gpumem/gpucore cannot be decided with -w/--nodelist (the hook picks a device "
        "type, not nodes; -x/--exclude is fine); ask for a gpu TYPE instead: --gres=gpu:TYPE:N, "
        "TYPE one of a100_80g, ascend910b3, l40s",
    ),
    (
        ("24.11",),
        ["--gpus-per-task=a100_80g:2", "-N", "1", "-c", "1"],
        "sbatch: " + GPUS_PER_TASK_REFUSAL["24.11"],
    ),
    (
        ("22.05",),
        ["--gpus-per-task=1", "-N", "1-2", "--ntasks-per-node=2"],
        "sbatch: " + GPUS_PER_TASK_REFUSAL["22.05"],
    ),
    (
        ("22.05",),
        ["--gpus-per-task=1", "-N", "1", "--ntasks-per-node=1", "-c", "4"],
        "gpumem:20G,gpu:1 -> gres:gpu:l40s:1 (best-fit)" + NVIDIA,
    ),
    (
        ("22.05",),
        ["--gres=gpumem:60G,gpu:l40s:1", "--gpus-per-task=1", "-N", "1-2"],
        "sbatch: " + GPUS_PER_TASK_REFUSAL["22.05"],
    ),
    # fuzz seed 20261127 (2026-11-26): an unset max_nodes is printed as NO_VAL; 22.05 raises min_nodes
    # to the -w hosts and lowers it to an explicit -n only (not to --ntasks-per-node's tasks)
    (
        BOTH,
        ["--gres=gpumem:200G,gpu:2", "--gpus=2", "-w", "a100n1,l40sn1"],
        "sbatch: Based on --gpu and --gres=gpu/--gpus-per-node required nodes (1) doesn't fall between "
        "min_nodes (2) and max_nodes (4294967294) boundaries",
    ),
    (
        ("22.05",),
        ["--gres=gpumem:10G", "--gpus=a100_80g:1", "--ntasks-per-node=1", "-w", "a100n1,l40sn1"],
        "sbatch: --gpus < -N",
    ),
    # fuzz seed 20261128 (24.11): -w sets the node count before -n/--ntasks-per-node could (sbatch/opt.c),
    # so 24.11 derives no -N 2 from them and sends the job to the hook
    (
        ("24.11",),
        ["--gres=gpumem:20G,gpucore:50", "--gpus=1", "-n2", "--ntasks-per-node=1", "-w", "a100n1"],
        "gpumem:20G,gpucore:50,gpu:1: gpumem/gpucore cannot be decided with -w/--nodelist (the hook picks a "
        "device type, not nodes; -x/--exclude is fine); ask for a gpu TYPE instead: --gres=gpu:TYPE:N, "
        "TYPE one of a100_80g, ascend910b3, l40s",
    ),
]
CASES = [(release, options, seen) for releases, options, seen in MEASURED for release in releases]


def explain(options: list[str], release: str) -> tuple[int, str]:
    """(exit code, the user message or `sbatch: TEXT`) of `request explain --gres=gpumem:20G OPTIONS`
    (OPTIONS' own --gres replaces it)."""
    gres = [] if any(o.startswith("--gres") for o in options) else ["--gres=gpumem:20G"]
    argv = ["request", "explain", "--inventory", str(MIXED), *gres, *options, "--slurm-release", release]
    result = CliRunner().invoke(cli, [*argv, "--json"])
    if not result.stdout:
        return result.exit_code, result.output.strip().removeprefix("slurm-hetero: ")
    return result.exit_code, json.loads(result.stdout)["message"]


@pytest.mark.parametrize(
    ("release", "options", "seen"), CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else v
)
def test_explain_says_what_the_sbatch_user_sees(
    release: str, options: list[str], seen: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_HETERO_CONFIG", "/dev/null")
    code, said = explain(options, release)
    assert said == seen.format(sep=":" if release == "22.05" else "/")
    assert code == (0 if " -> " in seen else 1), said  # a refusal, sbatch's or the hook's: 1


def test_a_deeply_nested_constraint_is_one_line_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_HETERO_CONFIG", "/dev/null")
    features = "(" * 500 + "ib" + ")" * 500
    assert explain(["-C", features], "22.05") == (
        1,
        f"--constraint={features}: parentheses nest more than 1 deep (slurmctld refuses it)",
    )


HUGE = "9" * 5000  # past int()'s 4,300 digits


@pytest.mark.parametrize("release", ["22.05", "24.11"])
@pytest.mark.parametrize(
    "options",
    [
        [f"--gres=gpumem:{HUGE}"],
        [f"--gres=gpu:{HUGE},gpumem:20G"],
        [f"--gres=gpucore:{HUGE}"],
        ["--gpus", HUGE],
        ["-N", HUGE],
        ["-n", HUGE],
        ["-c", HUGE],
        [f"--mem={HUGE}"],
        [f"--mem-per-cpu=-{HUGE}"],
        ["-n", "2", f"--gpus-per-task={HUGE}"],
    ],
    ids=lambda o: o[-1][:12],
)
def test_numbers_of_thousands_of_digits_are_refused_not_a_crash(
    monkeypatch: pytest.MonkeyPatch, options: list[str], release: str
) -> None:
    """adv33 D19: int() of 4,300+ digits raised ValueError (a traceback) where C saturates."""
    monkeypatch.setenv("SLURM_HETERO_CONFIG", "/dev/null")
    code, said = explain(options, release)
    assert code == 1 and said and "\n" not in said, said  # one line (a crash prints none)


def test_gres_names_are_checked_only_when_given() -> None:
    """The fuzz and the tests model sbatch without a cluster's GresTypes; the grammar still holds."""
    names = frozenset(BASE_GRES)
    assert gres_refusal("gres:shard:1", "22.05", None) is None
    assert gres_refusal("gres:shard:1", "22.05", names) == GRES
    assert gres_refusal("gres:gpumem:", "22.05", None) == GRES


def test_a_negative_count_past_a_uint64_saturates_and_is_refused() -> None:
    """22.05: strtoull gives ULLONG_MAX (ERANGE) for -2^64, which Slurm refuses; it was read as 0."""
    names = frozenset(BASE_GRES)
    assert gres_refusal("gres:nosuch:0", "22.05", names) is None  # a zero count of any name passes
    assert gres_refusal("gres:nosuch:-18446744073709551616", "22.05", names) == GRES
    assert gres_refusal("gres:gpu:-18446744073709551615", "22.05", names) is None  # wraps to 1


def test_a_node_range_is_min_and_max() -> None:
    assert node_range("1-2") == (1, 2) and node_range("-1") == (1, 1) and node_range("2k") == (2048, 2048)
    assert node_range("1-3,5", "24.11") == (1, 5)
    job = job_from_options(gres="gpumem:20G", nodes="1-2", ntasks_per_node="2")
    assert (job.min_nodes, job.num_tasks) == (1, None)  # 22.05 derives no task count for a range


# --------------------------------------------- what sbatch sends for each het component (`het_sent`)
def test_a_het_jobs_node_lists_reach_every_component() -> None:
    """22.05 seed 20261126: `-p nvidia -w l40sn1 : -p nvidia` is stored with ExcNodeList=l40sn1 on
    component 1 and `-x a100n1` on either component excludes it on both, so the hook refused
    components without -w/-x of their own; the fuzz predicted each component as given (and so did
    the wrapper: X21-X27)."""
    sent = het_sent([{"nodelist": "l40sn1"}, {"gres": "gpumem:10G"}, {"exclude": "a100n1"}])
    assert [c.get("exclude") for c in sent] == ["a100n1", "a100n1,l40sn1", "a100n1,l40sn1"]
    assert sent[0]["nodelist"] == "l40sn1" and "nodelist" not in sent[1]
    assert het_sent([{"gres": "gpumem:10G"}]) == [{"gres": "gpumem:10G"}]
    assert het_sent([{}, {}]) == [{}, {}]


def test_22_05_shrinks_a_components_node_list_to_its_tasks_before_the_others_exclude_it() -> None:
    """22.05's fuzz (seed 20261201): `-N 3 -n 1 -w npu910bn1,h100n1` in a het job: sbatch warns
    "setting nnodes to 1", sorts the hosts and keeps the first, so only h100n1 is excluded from
    the other components (the hook's refusal named ascend910b too); 24.11 sends the list as given."""
    components = [{"gres": "gpumem:60G"}, {"ntasks": "1", "nodes": "3", "nodelist": "npu910bn1,h100n1"}]
    sent = het_sent(components, "22.05")
    assert sent[0]["exclude"] == "h100n1" and sent[1]["nodelist"] == "h100n1"
    assert het_sent(components, "24.11")[0]["exclude"] == "npu910bn1,h100n1"
    wide = [{}, {"ntasks": "2", "nodelist": "n[1-4]"}]
    assert het_sent(wide, "22.05")[0]["exclude"] == "n[1-2]"
    assert het_sent([{}, {"ntasks": "x", "nodelist": "n[1-4]"}])[0]["exclude"] == "n[1-4]"  # sbatch's refusal


def test_a_het_components_mem_reaches_the_components_without_their_own() -> None:
    """22.05 seed 7 and 24.11 seed 7: a component's --mem=100G reached the other component, later
    and earlier (sbatch does not reset --mem between components: slurm_opt.c gives it no
    reset_each_pass; the earlier ones get the last given); a later --mem-per-cpu/--mem-per-gpu
    beside a carried --mem is sbatch's refusal, an earlier one is not (measured, 22.05 and 24.11)."""
    sent = het_sent([{"gres": "gpumem:10G"}, {"mem": "100G"}, {"gres": "gpumem:20G"}, {"mem": "1G"}])
    assert [c.get("mem") for c in sent] == ["1G", "100G", "100G", "1G"]
    assert "mem" not in het_sent([{"mem_per_cpu": "1G"}, {"mem": "1G"}])[0]
    assert het_mem_refusal([{"mem": "1G"}, {"mem_per_cpu": "1G"}]) == 1
    assert het_mem_refusal([{"mem": "1G"}, {"gres": "gpumem:1G"}, {"mem_per_gpu": "1G"}]) == 2
    assert het_mem_refusal([{"mem_per_cpu": "1G"}, {"mem": "1G"}]) is None
    assert het_mem_refusal([{"mem": "1G"}, {"mem": "2G", "mem_per_cpu": "1G"}]) is None


def test_explains_help_says_what_it_does_with_node_lists() -> None:
    """X19: `request explain --help` said -x with gpumem/gpucore is refused; it is decided (only -w
    is refused): the help of each says what explain does with it."""
    result = CliRunner().invoke(cli, ["request", "explain", "--help"], terminal_width=200)
    lines = {
        line.split()[1].rstrip(","): line
        for line in result.stdout.splitlines()
        if line.strip()[:2] in ("-w", "-x")
    }
    assert "refused" in lines["--nodelist"] and "refused" not in lines["--exclude"], lines
    args = ["request", "explain", "--inventory", str(MIXED), "--json", "--gres", "gpumem:20G"]
    assert json.loads(CliRunner().invoke(cli, [*args, "-x", "l40sn1"]).stdout)["ok"]
    assert not json.loads(CliRunner().invoke(cli, [*args, "-w", "l40sn1"]).stdout)["ok"]


def test_explain_reads_a_host_file_as_sbatch_sends_its_hosts(tmp_path: Path) -> None:
    """Adversarial r6 P09: `request explain -x /tmp/FILE --gres=gpumem:20G` was refused "this hook
    reads host names"; sbatch reads the file (slurm_read_hostfile: names or comma lists a line, "#"
    comments, `name*N`) and the hook sees its hosts, so explain decides around them too."""
    from slurm_hetero.submit.hook import hostfile_hosts

    hosts = tmp_path / "hosts"
    hosts.write_text("l40sn1 # the l40s node\n")
    args = ["request", "explain", "--inventory", str(MIXED), "--json", "--gres", "gpumem:20G"]
    result = CliRunner().invoke(cli, [*args, "-x", str(hosts)])
    assert json.loads(result.stdout)["tres_per_node"].split(":")[-2] == "a100_80g", result.output
    assert hostfile_hosts(b"a1,a2\n# x\n\nb[1-3]*2,c\\#1\nd,,e,\n", "f") == "a[1-2],b[1-3],b[1-3],c#1,d,e"


def test_explain_shows_the_hooks_own_failure_its_fail_policy_hides(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fuzz (24.11): a typed count above its type's nodes under features none of them has crashed
    the hook (a nil in its hint); failing open, explain printed `accept (untouched)` and nothing
    else. The hook's error line goes to stderr."""
    from slurm_hetero.cli import submit as submit_cli
    from slurm_hetero.submit import Job
    from slurm_hetero.submit.hook import Outcome

    class Failing:
        def submit(self, job: Job) -> Outcome:
            return Outcome(
                True, "untouched", "", job, log=(("error", "slurm_hetero: internal error, failing open: x"),)
            )

    monkeypatch.setenv("SLURM_HETERO_CONFIG", "/dev/null")
    monkeypatch.setattr(submit_cli, "cluster_hook", lambda *a, **k: Failing())
    argv = ["request", "explain", "--inventory", str(MIXED), "--gres=gpumem:20G"]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0 and result.stdout.startswith("accept (untouched)")
    assert (
        result.stderr
        == "slurm-hetero: slurm_hetero: internal error, failing open: x; report it with this command\n"
    )
