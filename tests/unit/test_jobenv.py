"""The one reader of Slurm's task environment, on the real dumps of a 3-component heterogeneous job
(Slurm 22.05, tests/fixtures/slurm_env/) and on each fallback of its documented order."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_hetero.core.errors import HeteroError
from slurm_hetero.slurm.jobenv import (
    JobEnv,
    JobEnvError,
    expand_tasks_per_node,
    parse_job_env,
    read_task_env,
    task_devices,
)

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm_env"


def load(name: str) -> dict[str, str]:
    lines = (SAMPLES / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def without(env: dict[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


def het_only(env: dict[str, str]) -> dict[str, str]:
    """The environment with the older *_PACK_* names removed."""
    return {k: v for k, v in env.items() if "PACK" not in k}


def test_expand_tasks_per_node() -> None:
    assert expand_tasks_per_node("2,1(x2)") == [2, 1, 1]
    assert expand_tasks_per_node("4(x3)") == [4, 4, 4]
    with pytest.raises(JobEnvError):
        expand_tasks_per_node("2,x")


# -- the step's shape -----------------------------------------------------------------------------


@pytest.mark.parametrize("task", range(4))
def test_het_job_nodes_follow_component_order_not_the_sorted_nodelist(task: int) -> None:
    env = parse_job_env(load(f"hetjob3_srun_task{task}.env.txt"))
    assert env.nodes == ("a100n1", "l40sn1", "ascendn1")
    assert env.tasks_per_node == (2, 1, 1)
    assert env.het_groups == (0, 1, 2)
    assert env.world_size == 4 and env.rank == task
    assert env.node_index == {0: 0, 1: 0, 2: 1, 3: 2}[task]
    assert (env.job_id, env.step_id) == ("7", 0)
    assert env.component_steps == ["7.0", "8.0", "9.0"]


@pytest.mark.parametrize("task", range(4))
def test_het_srun_uses_pack_group_lists_and_sorted_tasks_per_node(task: int) -> None:
    """`srun A : B : C` exports only *_PACK_GROUP_* node lists and ids, and tasks per node in name
    order."""
    env = parse_job_env(load(f"hetsrun3_task{task}.env.txt"))
    assert env.nodes == ("a100n1", "l40sn1", "ascendn1")
    assert env.tasks_per_node == (1, 2, 1)
    assert env.het_groups == (0, 1, 2)
    assert env.rank == task and env.world_size == 4
    assert env.component_steps == ["6.0", "7.0", "8.0"]  # from SLURM_JOB_ID_PACK_GROUP_k


def test_pack_forms_alone_give_the_same_job_as_het_forms() -> None:
    both = load("hetjob3_srun_task2.env.txt")
    pack_only = {k: v for k, v in both.items() if "HET_GROUP" not in k and k != "SLURM_HET_SIZE"}
    assert parse_job_env(pack_only) == parse_job_env(both) == parse_job_env(het_only(both))


def test_a_job_outside_het_jobs_cancels_its_one_step() -> None:
    env = {
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "1",
        "SLURMD_NODENAME": "n1",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_TASKS_PER_NODE": "2",
        "SLURM_JOBID": "41",
        "SLURM_STEPID": "2",
    }
    job = parse_job_env(env)  # only the older or job-level names: each has its fallback
    assert (job.job_id, job.step_id, job.world_size, job.component_steps) == ("41", 2, 2, ["41.2"])


def one_component_step(k: int = 1) -> dict[str, str]:
    """Task 2's environment as a step on component 1 only (l40sn1: `srun --het-group=1`), or on
    components 1 and 2 (`--het-group=1,2`): the step's node list and tasks shrink, the job's stay."""
    env = load("hetjob3_srun_task2.env.txt")
    nodes, tasks = ("l40sn1", "1") if k == 1 else ("ascendn1,l40sn1", "1(x2)")
    env |= {"SLURM_STEP_NODELIST": nodes, "SLURM_STEP_TASKS_PER_NODE": tasks, "SLURM_STEP_NUM_NODES": str(k)}
    return env | {
        "SLURM_STEP_NUM_TASKS": str(k),
        "SLURM_NTASKS": str(k),
        "SLURM_PROCID": "0",
        "SLURM_NODEID": "0",
    }


def test_a_step_on_one_het_component_runs_on_its_nodes() -> None:
    """A2-H3: `srun --het-group=1 slurm-hetero launch` in a het job was refused ("het components
    name nodes ['a100n1'] that are not in the step"); the step runs on that component's nodes and
    ends only that component's step."""
    job = parse_job_env(one_component_step())
    assert (job.nodes, job.tasks_per_node, job.het_groups) == (("l40sn1",), (1,), (1,))
    assert (job.rank, job.world_size, job.component_steps) == (0, 1, ["8.0"])
    two = parse_job_env(one_component_step(2))
    assert (two.nodes, two.het_groups, two.component_steps) == (
        ("l40sn1", "ascendn1"),
        (1, 2),
        ["8.0", "9.0"],
    )


def test_a_het_component_partly_in_the_step_is_still_an_error() -> None:
    env = load("hetjob3_srun_task0.env.txt") | {"SLURM_JOB_NODELIST_HET_GROUP_1": "l40sn1,x9"}
    with pytest.raises(JobEnvError, match=r"name nodes \['x9'\] that are not in the step"):
        parse_job_env(het_only(env))


def test_a_missing_component_job_id_cancels_through_the_first_one() -> None:
    env = het_only(without(load("hetjob3_srun_task0.env.txt"), "SLURM_JOB_ID_HET_GROUP_2"))
    assert parse_job_env(env).component_steps == ["7.0"]


# -- contradictory variables: the first in the documented order wins --------------------------------


@pytest.mark.parametrize(
    ("changed", "field", "expected"),
    [
        ({"SLURM_STEP_ID": "3", "SLURM_STEPID": "4"}, "step_id", 3),
        ({"SLURM_JOB_ID": "7", "SLURM_JOBID": "70"}, "job_id", "7"),
        ({"SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "5"}, "world_size", 4),
        ({"SLURM_HET_SIZE": "3", "SLURM_PACK_SIZE": "2"}, "het_groups", (0, 1, 2)),
        ({"SLURM_JOB_NODELIST_PACK_GROUP_1": "nowhere1"}, "nodes", ("a100n1", "l40sn1", "ascendn1")),
        ({"SLURM_JOB_ID_PACK_GROUP_1": "80"}, "component_steps", ["7.0", "8.0", "9.0"]),
        ({"SLURM_TASKS_PER_NODE": "1(x3)"}, "tasks_per_node", (2, 1, 1)),
    ],
)
def test_contradictions_take_the_first_variable(
    changed: dict[str, str], field: str, expected: object
) -> None:
    env = load("hetjob3_srun_task0.env.txt") | changed
    assert getattr(parse_job_env(env), field) == expected


# -- absent and malformed variables (launcher: strict) ---------------------------------------------


@pytest.mark.parametrize(
    "names",
    [
        ("SLURM_PROCID",),
        ("SLURM_LOCALID",),
        ("SLURMD_NODENAME",),
        ("SLURM_STEP_ID", "SLURM_STEPID"),
        ("SLURM_JOB_ID", "SLURM_JOBID"),
        ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
        ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"),
        ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
    ],
)
def test_each_missing_essential_is_named(names: tuple[str, ...]) -> None:
    env = without(load("hetjob3_srun_task1.env.txt"), *names)
    with pytest.raises(JobEnvError, match=f"^{names[0]}.* is not set: run under srun"):
        parse_job_env(env)
    blank = load("hetjob3_srun_task1.env.txt") | {n: " " for n in names}  # blank counts as absent
    with pytest.raises(JobEnvError, match=f"^{names[0]}"):
        parse_job_env(blank)


def test_nothing_set_is_not_srun() -> None:
    with pytest.raises(JobEnvError, match="SLURM_PROCID is not set: run under srun"):
        parse_job_env({})


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("SLURM_PROCID", "one", "SLURM_PROCID='one' is not a number"),
        ("SLURM_STEP_ID", "-1", "SLURM_STEP_ID='-1' is not a number"),
        ("SLURM_HET_SIZE", "three", "SLURM_HET_SIZE='three' is not a number"),
        ("SLURM_STEP_GPUS", "0,x", "SLURM_STEP_GPUS='0,x' is not a list of GPU indices"),
        ("SLURM_STEP_GPUS", "1,1", "SLURM_STEP_GPUS='1,1' names a GPU twice"),  # adv32 C06
        ("SLURM_STEP_TASKS_PER_NODE", "2,y", "cannot read tasks per node"),
        ("SLURM_STEP_NODELIST", "a100n[1-", "SLURM_STEP_NODELIST: unbalanced brackets in hostlist"),
    ],
)
def test_malformed_values_are_clear_errors(name: str, value: str, message: str) -> None:
    with pytest.raises(JobEnvError, match=message.replace("[", r"\[")):
        parse_job_env(load("hetjob3_srun_task0.env.txt") | {name: value})


def test_a_het_job_without_a_component_node_list_is_an_error() -> None:
    env = without(
        load("hetjob3_srun_task0.env.txt"),
        "SLURM_JOB_NODELIST_HET_GROUP_2",
        "SLURM_JOB_NODELIST_PACK_GROUP_2",
    )
    with pytest.raises(JobEnvError, match="no node list for het component 2"):
        parse_job_env(env)


def test_cyclic_placement_is_a_clear_error() -> None:
    env = load("hetjob3_srun_task2.env.txt") | {"SLURM_PROCID": "3"}
    with pytest.raises(JobEnvError, match="not block-distributed"):
        parse_job_env(env)


def test_values_with_newlines_are_stripped_or_refused() -> None:
    env = load("hetjob3_srun_task3.env.txt")
    padded = env | {"SLURM_PROCID": "3\n", "SLURMD_NODENAME": "ascendn1\n", "SLURM_STEP_GPUS": "0,1,\n2,3\n"}
    assert parse_job_env(padded) == parse_job_env(env)
    with pytest.raises(JobEnvError, match="not a list of GPU indices"):
        parse_job_env(env | {"SLURM_STEP_GPUS": "0\nexport LD_PRELOAD=/tmp/x.so"})
    with pytest.raises(JobEnvError, match="not a number"):
        parse_job_env(env | {"SLURM_LOCALID": "0\n1"})


# -- this task's GPUs ------------------------------------------------------------------------------


def test_step_gpus_not_job_gpus() -> None:
    env = parse_job_env(load("hetjob3_srun_task3.env.txt"))
    assert env.devices.gpu_indexes == (0, 1, 2, 3)  # SLURM_JOB_GPUS says 0,1 (component 0's)
    assert env.devices.source == "SLURM_STEP_GPUS"
    assert env.devices.visible["ROCR_VISIBLE_DEVICES"] == "0,1,2,3"


def test_job_gpus_apply_on_component_0_only() -> None:
    """Without SLURM_STEP_GPUS, SLURM_JOB_GPUS (inherited from component 0 on 22.05) is used on
    component 0's nodes; elsewhere the next fallback, CUDA_VISIBLE_DEVICES, is right."""
    first = task_devices(without(load("hetjob3_srun_task0.env.txt"), "SLURM_STEP_GPUS"))
    assert (first.gpu_indexes, first.source) == ((0, 1), "SLURM_JOB_GPUS")
    l40s = task_devices(without(load("hetjob3_srun_task2.env.txt"), "SLURM_STEP_GPUS"))
    assert (l40s.gpu_indexes, l40s.source) == ((0,), "CUDA_VISIBLE_DEVICES")
    pack_only = {k: v for k, v in load("hetjob3_srun_task3.env.txt").items() if "HET" not in k}
    ascend = task_devices(without(pack_only, "SLURM_STEP_GPUS"))
    assert (ascend.gpu_indexes, ascend.source) == ((0, 1, 2, 3), "CUDA_VISIBLE_DEVICES")
    unknown_component = without(load("hetjob3_srun_task0.env.txt"), "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES")
    unknown_component = without(
        unknown_component, "SLURM_JOB_NODELIST_HET_GROUP_0", "SLURM_JOB_NODELIST_PACK_GROUP_0"
    )
    assert task_devices(unknown_component).source is None  # cannot tell: not trusted


def test_gpu_fallbacks_outside_het_jobs() -> None:
    assert task_devices({"SLURM_STEP_GPUS": "1", "SLURM_JOB_GPUS": "0,1,2,3"}).gpu_indexes == (1,)
    assert task_devices({"SLURM_STEP_GPUS": "", "SLURM_JOB_GPUS": "3"}).gpu_indexes == (3,)
    assert task_devices({"SLURM_JOB_GPUS": "3", "CUDA_VISIBLE_DEVICES": "0"}).source == "SLURM_JOB_GPUS"
    assert task_devices({"CUDA_VISIBLE_DEVICES": "2,3"}).gpu_indexes == (2, 3)
    uuids = task_devices({"CUDA_VISIBLE_DEVICES": "GPU-5e0e7c9b,MIG-1f2a"})
    assert (uuids.gpu_indexes, uuids.source, dict(uuids.visible)) == (
        (),
        None,
        {"CUDA_VISIBLE_DEVICES": "GPU-5e0e7c9b,MIG-1f2a"},
    )
    assert task_devices({}).gpu_indexes == () and task_devices({"SLURM_STEP_GPUS": ","}).source is None
    with pytest.raises(JobEnvError, match="CUDA_VISIBLE_DEVICES='0,2,00' names a GPU twice"):
        task_devices({"CUDA_VISIBLE_DEVICES": "0,2,00"})


# -- the TaskProlog's view (lenient) ---------------------------------------------------------------


def test_task_env_from_a_real_task_prolog_environment() -> None:
    task = read_task_env(load("hetsrun3_task2.env.txt"))  # SLURM_SCRIPT_CONTEXT=prolog_task
    assert task.node_name == "l40sn1"
    assert (task.devices.gpu_indexes, task.devices.source) == ((0, 1), "SLURM_STEP_GPUS")
    assert task.shards_on_node is None


def test_task_env_with_only_some_variables() -> None:
    empty = read_task_env({})
    assert (empty.node_name, empty.devices.gpu_indexes, empty.shards_on_node) == (None, (), None)
    shards = read_task_env({"SLURM_JOB_GPUS": "1\n", "SLURM_SHARDS_ON_NODE": "3\n"})
    assert (shards.devices.gpu_indexes, shards.shards_on_node) == ((1,), 3)
    assert read_task_env({"SLURM_SHARDS_ON_NODE": "many"}).shards_on_node is None
    assert read_task_env({"SLURMD_NODENAME": " \n"}).node_name is None


KNOWN = [
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURMD_NODENAME",
    "SLURM_STEP_ID",
    "SLURM_JOB_ID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_HET_SIZE",
    "SLURM_PACK_SIZE",
    "SLURM_JOB_NODELIST_HET_GROUP_0",
    "SLURM_JOB_NODELIST_PACK_GROUP_1",
    "SLURM_JOB_ID_HET_GROUP_0",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
    "CUDA_VISIBLE_DEVICES",
    "SLURM_SHARDS_ON_NODE",
]


REAL = load("hetjob3_srun_task0.env.txt")


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(KNOWN), st.text(max_size=12)))
def test_any_environment_gives_a_result_or_a_named_error(env: dict[str, str]) -> None:
    """Whatever the values, alone or over a real task's environment, the readers answer or raise our
    own error (never KeyError, ValueError, ...)."""
    for reader in (read_task_env, parse_job_env):
        for task in (env, REAL | env):
            try:
                reader(task)
            except HeteroError:
                pass


@pytest.mark.parametrize("value", ["9" * 5000, ",".join(["1"] * 5000)])
def test_absurd_gpu_lists_are_one_clear_error(value: str) -> None:
    """Adversarial find: 5,000 digits raised Python's int-conversion limit; the bound on how many
    indices a task takes was lost when the TaskProlog's own parser gave way to this reader."""
    with pytest.raises(JobEnvError, match=r"SLURM_STEP_GPUS='.{60}\.\.\.' is not a list of GPU indices"):
        read_task_env({"SLURM_STEP_GPUS": value})


def test_first_ranks_of_a_131072_node_step_are_summed_once() -> None:
    """adv26b F4: a sum of the task counts per node made a 65,536-node plan quadratic (minutes)."""
    import time

    counts = tuple(1 + i % 3 for i in range(131_072))
    nodes = tuple(f"n{i}" for i in range(len(counts)))
    job = JobEnv(0, sum(counts), 0, "n0", nodes, counts, (0,) * len(counts), "1")
    started = time.process_time()
    firsts = [job.first_ranks[i] for i in range(len(counts))]
    assert time.process_time() - started < 2.0  # summed per node: 8.6e9 additions
    assert firsts[:4] == [0, 1, 3, 6] and firsts[-1] == sum(counts[:-1])
