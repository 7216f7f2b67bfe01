"""JobEnv on the real environment dumps of a 3-component heterogeneous job (Slurm 22.05)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_hetero.slurm.jobenv import JobEnvError, expand_tasks_per_node, parse_job_env

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm_env"


def load(name: str) -> dict[str, str]:
    lines = (SAMPLES / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_expand_tasks_per_node() -> None:
    assert expand_tasks_per_node("2,1(x2)") == [2, 1, 1]
    assert expand_tasks_per_node("4(x3)") == [4, 4, 4]
    with pytest.raises(JobEnvError):
        expand_tasks_per_node("2,x")


@pytest.mark.parametrize("task", range(4))
def test_het_job_nodes_follow_component_order_not_the_sorted_nodelist(task: int) -> None:
    env = parse_job_env(load(f"hetjob3_srun_task{task}.env.txt"))
    assert env.nodes == ("a100n1", "l40sn1", "ascendn1")
    assert env.tasks_per_node == (2, 1, 1)
    assert env.het_groups == (0, 1, 2)
    assert env.world_size == 4 and env.rank == task
    assert env.node_index == {0: 0, 1: 0, 2: 1, 3: 2}[task]


def test_step_gpus_not_job_gpus() -> None:
    env = parse_job_env(load("hetjob3_srun_task3.env.txt"))
    assert env.step_gpus == (0, 1, 2, 3)


def test_cyclic_placement_and_missing_variables_are_clear_errors() -> None:
    env = load("hetjob3_srun_task2.env.txt")
    env["SLURM_PROCID"] = "3"
    with pytest.raises(JobEnvError, match="not block-distributed"):
        parse_job_env(env)
    with pytest.raises(JobEnvError, match="run under srun"):
        parse_job_env({})


@pytest.mark.parametrize("task", range(4))
def test_het_srun_uses_pack_group_lists_and_sorted_tasks_per_node(task: int) -> None:
    """`srun A : B : C` exports only *_PACK_GROUP_* node lists, and tasks per node in name order."""
    env = parse_job_env(load(f"hetsrun3_task{task}.env.txt"))
    assert env.nodes == ("a100n1", "l40sn1", "ascendn1")
    assert env.tasks_per_node == (1, 2, 1)
    assert env.het_groups == (0, 1, 2)
    assert env.rank == task and env.world_size == 4
