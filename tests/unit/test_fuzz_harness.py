"""The real-Slurm fuzz's own bookkeeping (scripts/devcluster/fuzz.py), against a scripted sbatch."""

from __future__ import annotations

import random
import subprocess
from typing import Any

import pytest
from click.testing import CliRunner

from scripts.devcluster import fuzz
from slurm_hetero.submit import Job
from slurm_hetero.submit.hook import Outcome, cluster_hook
from slurm_hetero.submit.sbatch import MEMORY_EXCLUSIVE

UNKNOWN_FEATURE = {"constraint": "(amd|nosuch)&lab_big"}
REWRITTEN = {"gres": "gpumem:60G", "ntasks": "2"}


def _outcome(options: dict[str, str]) -> Outcome:
    action = "rewrite" if "gres" in options else "untouched"
    return Outcome(True, action, "rewritten" if action == "rewrite" else "", Job())


def _harness(monkeypatch: pytest.MonkeyPatch, refuses: Any) -> tuple[fuzz.Fuzz, list[list[str]]]:
    """A Fuzz whose sbatch refuses the argv for which `refuses(argv)` is true."""
    calls: list[list[str]] = []

    def run(argv: list[str], user: str | None = None) -> subprocess.CompletedProcess:
        calls.append(argv)
        if argv[0] == "sbatch" and refuses(argv):
            return subprocess.CompletedProcess(argv, 1, "", "sbatch: error: Invalid feature specification")
        return subprocess.CompletedProcess(argv, 0, "42\n", "rewritten")

    monkeypatch.setattr(
        fuzz, "predict", lambda model, hook, options, uid, release, offset=None: _outcome(options)
    )
    return fuzz.Fuzz(run, None, None, "22.05", "nobody", 65534), calls  # type: ignore[arg-type]


def test_a_het_job_refused_for_its_untouched_components_feature_is_slurmctlds_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """22.05 seed 7: component 0 (untouched by the hook) names a feature no node has; slurmctld
    refuses the whole het job. That is not the hook's mismatch: the component alone is refused too."""
    harness, calls = _harness(monkeypatch, lambda argv: any("nosuch" in a for a in argv))
    assert harness.submit(fuzz.Request([UNKNOWN_FEATURE, REWRITTEN])) is None
    assert harness.report.mismatches == []
    assert harness.report.counts["refused by slurmctld (untouched)"] == 1
    assert ":" not in calls[1] and any("nosuch" in a for a in calls[1])  # the component, on its own


def test_a_het_job_refused_although_its_untouched_component_alone_is_accepted_is_a_mismatch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness, calls = _harness(monkeypatch, lambda argv: ":" in argv)
    assert harness.submit(fuzz.Request([UNKNOWN_FEATURE, REWRITTEN])) is None
    assert [m[0] for m in harness.report.mismatches] == ["refused but predicted accept"]
    assert ["scancel", "42"] in calls  # the probe job does not stay queued


def test_a_job_refused_for_an_unknown_excluded_name_is_slurmctlds_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hook decides gpumem around -x and leaves names no node has to slurmctld, which refuses
    the job ("Invalid node name specified"): not the hook's mismatch; a known name is."""
    from slurm_hetero.engine.score import compile_model
    from slurm_hetero.inventory import document as inventory
    from slurm_hetero.inventory.catalog import load_catalog
    from slurm_hetero.inventory.nodes import slurm_nodes
    from tests.conftest import REPO

    nodes = slurm_nodes(inventory.load(REPO / "gres_conf/examples/mixed.yaml"), load_catalog())
    model = compile_model(nodes, _scoring())
    for exclude, missed in (("nosuchn1", []), ("a100n1", ["refused but predicted accept"])):
        harness, _ = _harness(monkeypatch, lambda argv: True)
        harness.model, harness.hook = model, cluster_hook(model, (), "open")
        assert harness.submit(fuzz.Request([{**REWRITTEN, "exclude": exclude}])) is None
        assert [m[0] for m in harness.report.mismatches] == missed


def _scoring() -> Any:
    from slurm_hetero.engine.score import ScoringOptions

    return ScoringOptions()


def test_the_generator_draws_the_hooks_node_options() -> None:
    """-c, --cpus-per-gpu, --mem*, -w/-x, -N MIN-MAX, --gpus*=TYPE:N and partition lists, every one
    a flag sbatch_argv knows, and never two of --mem/--mem-per-cpu/--mem-per-gpu together."""
    rng = random.Random(1)
    drawn = [
        fuzz.random_component(rng, ["a100", "l40s"], ["ib", "lab_big"], ["gpu", "lab"], ["n1", "n2"])
        for _ in range(3000)
    ]
    keys = {k for options in drawn for k in options}
    assert keys <= set(fuzz.FLAGS)
    for key in ("cpus_per_task", "cpus_per_gpu", "mem", "mem_per_cpu", "mem_per_gpu", "nodelist", "exclude"):
        assert key in keys
    assert any("-" in o.get("nodes", "") for o in drawn)
    assert any(":" in o.get(k, "") for o in drawn for k in ("gpus", "gpus_per_node", "gpus_per_task"))
    assert any("," in o.get("partition", "") for o in drawn)
    assert all(len({"mem", "mem_per_cpu", "mem_per_gpu"} & set(o)) <= 1 for o in drawn)
    assert "--nodelist=n1" in fuzz.sbatch_argv(fuzz.Request([{"nodelist": "n1"}]))


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"gres": "gpumem:20G", "nodes": "1-x"}, '"x" is not a valid node count'),
        ({"gres": "gpumem:20G", "cpus_per_task": "x"}, 'Invalid numeric value "x" for --cpus-per-task.'),
        ({"gres": "gpumem:20G", "ntasks": "0"}, 'Invalid numeric value "0" for --ntasks.'),
    ],
)
def test_predict_reads_the_option_texts_as_request_explain_does(options: dict[str, str], words: str) -> None:
    """The fuzz drew only well-formed -N/-n/-c (int() of them); a range or a malformed value is
    sbatch's refusal, in its words, as `request explain` prints it."""
    from slurm_hetero.cli import cli
    from slurm_hetero.cli.submit import compiled, inventory_nodes
    from slurm_hetero.inventory.config import load_settings
    from tests.conftest import REPO

    inventory = REPO / "gres_conf" / "examples" / "mixed.yaml"
    model = compiled(inventory_nodes(inventory), load_settings(None))
    assert fuzz.predict(model, cluster_hook(model, (), "open"), options, 1000, "22.05") == words
    flags = [a for k, v in options.items() for a in (fuzz.FLAGS[k], v)]
    result = CliRunner().invoke(cli, ["request", "explain", "--inventory", str(inventory), *flags])
    assert result.exit_code == 1 and words in result.stderr


def test_predict_reads_a_node_range_as_min_and_max() -> None:
    from slurm_hetero.cli.submit import compiled, inventory_nodes
    from slurm_hetero.inventory.config import load_settings
    from tests.conftest import REPO

    model = compiled(inventory_nodes(REPO / "gres_conf" / "examples" / "mixed.yaml"), load_settings(None))
    hook = cluster_hook(model, (), "open", "22.05")
    outcome = fuzz.predict(model, hook, {"gres": "gpumem:20G", "nodes": "1-2"}, 1000, "22.05")
    assert isinstance(outcome, Outcome) and outcome.ok and outcome.job.max_nodes == 2


def test_a_het_components_malformed_option_is_sbatchs_first_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """22.05 seed 20261126: component 1's `--mem=1.5G` (read with the options) was sbatch's answer,
    not component 0's --gpus-per-task check, which the fuzz predicted first."""
    harness, _ = _harness(monkeypatch, lambda argv: True)
    first = {"gres": "gpumem:60G", "gpus_per_task": "1"}
    assert harness.submit(fuzz.Request([first, {"mem": "1.5G"}])) is None
    assert harness.report.counts["refused by sbatch"] == 1
    assert fuzz.read_refusal({"mem": "1.5G"}, "22.05") == "Invalid --mem specification"
    assert fuzz.read_refusal(first, "22.05") is None


def test_the_dev_cluster_inventory_gives_slurm_every_nodes_cpus_and_memory(tmp_path: Any) -> None:
    """The captured nodes (gaudin1, mlun1, mi300n1, npu910n1) were discovered without host facts:
    slurm.conf then got no CPUs=/RealMemory= and Slurm assumed 1 of each, while the hook's model
    reads that as "unknown, holds anything". 24.11 fuzz: a `-c 64` gaudi2 job the hook accepted and
    slurmctld could not place (its edit refused), and a released ascend910c job pending on
    BadConstraints. Every node of the dev cluster's inventory now names both."""
    from slurm_hetero.inventory import document as inventory
    from slurm_hetero.render.context import missing_facts_note
    from tests.integration.conftest import generate_inventory

    nodes = inventory.load(generate_inventory(tmp_path)).nodes
    assert {"gaudin1", "npu910n1"} <= {n.name for n in nodes}
    assert [(n.name, missing_facts_note(n)) for n in nodes if missing_facts_note(n)] == []


def test_an_earlier_components_own_refusal_comes_before_the_carried_mem_refusal() -> None:
    """Seed 20261127, both releases: `--gpus-per-task=1 --mem=100G : --mem-per-cpu=500` is refused
    for component 0's --gpus-per-task (sbatch checks the components in order), not for the --mem
    component 1 inherits."""
    own = "--gpus-per-task used without either --gpus or -n/--ntasks is not allowed."
    assert fuzz.sbatch_refusals([], [own, "later"], 1) == [own, MEMORY_EXCLUSIVE]
    assert fuzz.sbatch_refusals([], ["x"], None) == ["x"]
    assert fuzz.sbatch_refusals(["read"], [own], 0) == ["read", MEMORY_EXCLUSIVE]


@pytest.mark.parametrize("pre", ["gres:", "gres/"])  # 22.05, 24.11
def test_record_of_reads_the_per_gpu_cpus_and_memory_as_job_rec_shows_them(pre: str) -> None:
    """slurm_job_modify's job_rec carries cpus_per_tres / mem_per_tres (measured on both releases);
    the fuzz's twin must see them too, or it decides an edit of such a job on shards."""
    line = (
        f"JobId=7 JobName=wrap UserId=nobody(65534) JobState=PENDING Reason=JobHeldUser Partition=nvidia "
        f"NumNodes=1 NumCPUs=2 MinMemoryCPU=500M Features=(null) CpusPerTres={pre}gpu:2 "
        f"MemPerTres={pre}gpu:1024 TresPerJob={pre}gpu:1"
    )
    record = fuzz.record_of(fuzz.parse_oneliner(line), 65534, None)
    assert (record.cpus_per_tres, record.mem_per_tres) == (f"{pre}gpu:2", f"{pre}gpu:1024")
    assert (record.tres_per_job, record.partition) == (f"{pre}gpu:1", "nvidia")
    plain = fuzz.record_of(fuzz.parse_oneliner("JobId=8 Partition=nvidia Features=(null)"), 65534, None)
    assert (plain.cpus_per_tres, plain.mem_per_tres) == (None, None)


def test_record_of_reads_the_memory_and_node_lists_scontrol_shows() -> None:
    """job_rec carries min_mem_per_node / min_mem_per_cpu (scontrol's MinMemoryNode / MinMemoryCPU)
    and the edit view reads them; ReqNodeList / ExcNodeList are read as the hook would (job_rec has
    neither, so `Hook.modify` leaves them out)."""
    line = (
        "JobId=9 Partition=nvidia Features=(null) MinMemoryNode=12000M ReqNodeList=(null) "
        "ExcNodeList=l40sn1 TresPerNode=gres/gpu:a100_80g:1"
    )
    record = fuzz.record_of(fuzz.parse_oneliner(line), 65534, None)
    assert (record.min_mem_per_node, record.min_mem_per_cpu) == (12000, None)
    assert (record.req_nodes, record.exc_nodes) == (None, "l40sn1")
    other = "JobId=10 MinMemoryCPU=2G MinMemoryNode=0 ReqNodeList=a100n1"
    cpu = fuzz.record_of(fuzz.parse_oneliner(other), 1, None)
    assert (cpu.min_mem_per_node, cpu.min_mem_per_cpu, cpu.req_nodes) == (None, 2048, "a100n1")


def test_random_edits_cover_node_lists() -> None:
    rng = fuzz.random.Random(5)
    edits = [fuzz.random_edit(rng, ["a100n1", "l40sn1"]) for _ in range(200)]
    assert any(gres is None and "exc_nodes" in lists for gres, lists in edits)
    assert any(gres and "req_nodes" in lists for gres, lists in edits)
    assert any(lists.get("exc_nodes") == "" for _, lists in edits)
    assert any(gres and not lists for gres, lists in edits)
