"""Edits of a job's node lists (-x / -w) and of what the job record shows but the edit view did
not read (--mem, --mem-per-cpu), in `slurm_job_modify` (Lua under lupa, `hooked_edit`). Issue
10, adversarial pass A22-A26 / L22-L26 / S20 (dev cluster: one l40s node l40sn1, one a100 node
a100n1, as `gres_conf/examples/mixed.yaml`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slurm_hetero.engine.reasons import MESSAGES
from slurm_hetero.engine.score import compile_model
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.config import DEFAULTS, merge, settings_from_dict
from slurm_hetero.inventory.nodes import slurm_nodes
from slurm_hetero.submit import Job
from tests.unit.test_job_submit_lua import (
    SCRIPT_NAME,
    Config,
    Hook,
    configs,
    decided_edit,
    hooked_edit,
    render,
    type_of,
)
from tests.unit.test_score import MIXED


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Config]:
    return configs(tmp_path_factory.mktemp("edit_nodes"))


@pytest.fixture(scope="module")
def hooks(rendered: dict[str, Config]) -> dict[str, Hook]:
    return {name: Hook(config.directory / SCRIPT_NAME) for name, config in rendered.items()}


NOTE = "slurm_hetero: gpumem:20G -> ..."


def held(form: str, name: str = "l40s") -> Job:
    """A job the hook rewrote to one device of `name`, as its record shows it (22.05 `gres:`,
    24.11 `gres/`)."""
    return Job(tres_per_node=f"{form}gpu:{name}:1", user_id=1000, admin_comment=NOTE)


FORMS = ["gres:", "gres/"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("hosts", ["l40sn1", "a100n1,l40sn1", "l40sn[1-2]"])
def test_an_exclusion_edit_that_leaves_the_held_type_no_node_is_refused(
    rendered: dict[str, Config], hooks: dict[str, Hook], form: str, hosts: str
) -> None:
    """A22/L22, A26/L26: `scontrol update excnodelist=l40sn1` of a job rewritten to l40s:1 was
    accepted silently, and the job pended BadConstraints forever. Checked as a node-count edit:
    the type the job holds on the nodes the edited -x leaves; refused with the fit report."""
    edit = Job(exc_nodes=hosts, submit_uid=1000)
    ok, message, _ = hooked_edit(hooks["mixed"], edit, held(form))
    python = decided_edit(rendered["mixed"], edit, held(form))
    assert not ok and python.code == "ESLURM_INVALID_NODE_COUNT", message
    assert "do not fit its edited node or task count, node list" in message, message
    assert "l40s has 0 node(s)" in message, message


@pytest.mark.parametrize("form", FORMS)
def test_an_exclusion_edit_the_held_type_still_fits_is_accepted_untouched(
    rendered: dict[str, Config], hooks: dict[str, Hook], form: str
) -> None:
    edit = Job(exc_nodes="a100n1", submit_uid=1000)
    ok, message, after = hooked_edit(hooks["mixed"], edit, held(form))
    assert ok and message == "" and after.tres_per_node == f"{form}gpu:l40s:1", (message, after)


@pytest.mark.parametrize("form", FORMS)
def test_a_node_list_edit_naming_a_host_without_the_held_type_is_refused(
    rendered: dict[str, Config], hooks: dict[str, Hook], form: str
) -> None:
    """A23/L23: `scontrol update reqnodelist=a100n1` of a job on l40s:1 was accepted and the job
    pended BadConstraints forever. Each host an edited -w names must hold the job's devices."""
    config, hook = rendered["mixed"], hooks["mixed"]
    for hosts in ("a100n1", "l40sn1,a100n1"):
        ok, message, _ = hooked_edit(hook, Job(req_nodes=hosts, submit_uid=1000), held(form))
        expected = MESSAGES["edit_hosts"] % ("a100n1", 1)
        assert not ok and message == f"gpu:l40s:1: {expected}", message
    python = decided_edit(config, Job(req_nodes="a100n1", submit_uid=1000), held(form))
    assert python.code == "ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE"
    # the type's own host fits; a name the table does not know is left to slurmctld
    for hosts in ("l40sn1", "l40sn1,nosuchhost"):
        ok, message, after = hooked_edit(hook, Job(req_nodes=hosts, submit_uid=1000), held(form))
        assert ok and after.tres_per_node == f"{form}gpu:l40s:1", (hosts, message)
    # two devices per node: l40sn1 has 2, a100n1 4; a job on 3 a100 fits a100n1 only
    three = Job(tres_per_node=f"{form}gpu:a100_80g:3", user_id=1000, admin_comment=NOTE)
    assert hooked_edit(hook, Job(req_nodes="a100n1", submit_uid=1000), three)[0]
    ok, message, _ = hooked_edit(hook, Job(req_nodes="l40sn1", submit_uid=1000), three)
    assert not ok and "l40sn1" in message


def test_a_gpumem_edit_with_a_node_list_is_refused_as_at_submission(
    rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    edit = Job(tres_per_node="gres/gpumem:20G", req_nodes="a100n1", submit_uid=1000)
    ok, message, _ = hooked_edit(hooks["mixed"], edit, held("gres/"))
    assert not ok and message.startswith("gpumem:20G: ") and "-w/--nodelist" in message, message


def test_a_gpumem_edit_with_an_exclusion_is_decided_around_it(
    rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    """S20: `update excnodelist=l40sn1 gres=gpumem:20G` kept l40s. The edit's -x is counted: a100
    on 24.11 (the nvidia scope, as the dev cluster); 22.05 cannot change the type of a job it holds
    (edit_type) and says so."""
    hook = hooks["scoped"]
    edit = Job(tres_per_node="gres/gpumem:20G", exc_nodes="l40sn1", req_nodes="", submit_uid=1000)
    ok, _, after = hooked_edit(hook, edit, held("gres/"))
    assert ok and "a100_80g" in (after.tres_per_node or "") + (after.features or ""), after
    edit = Job(tres_per_node="gres:gpumem:20G", exc_nodes="l40sn1", req_nodes="", submit_uid=1000)
    ok, message, _ = hooked_edit(hook, edit, held("gres:"))
    assert not ok and message == f"gpumem:20G: {MESSAGES['edit_type'] % ('l40s', 'a100_80g')}", message


@pytest.mark.parametrize("size", ["20G", "30G"])
def test_a_gpumem_edit_keeps_the_type_the_job_holds_when_it_fits(
    rendered: dict[str, Config], hooks: dict[str, Hook], size: str
) -> None:
    """A24 / A25: a job on a100 with `-x l40sn1`, edited to gpumem:20G / 30G, was rewritten to
    l40s and never started: Slurm does not show slurm_job_modify the job's -x (job_rec has no
    exc_nodes, 22.05 and 24.11), so the type the job holds is kept whenever it fits."""
    config, hook = rendered["mixed"], hooks["mixed"]
    record = Job(tres_per_node="gres/gpu:a100_80g:1", user_id=1000)
    edit = Job(tres_per_node=f"gres/gpumem:{size}", submit_uid=1000)
    python = decided_edit(config, edit, record)
    assert type_of(python) == "a100_80g", python
    assert hooked_edit(hook, edit, record)[0]
    # stating the exclusions (none: `excnodelist=`) lets the hook choose by its policy again
    stated = Job(tres_per_node=f"gres/gpumem:{size}", exc_nodes="", req_nodes="", submit_uid=1000)
    free = decided_edit(config, stated, record)
    assert type_of(free) == "l40s", free
    assert hooked_edit(hook, stated, record)[0]


def test_a_gpumem_edit_to_another_type_without_the_jobs_exclusions_is_refused(
    rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    """The held type cannot take it (70G on l40s) and the job's -x is unknown: refused, naming
    how to state it; with `excnodelist=` (none) or the job's -x it is decided."""
    hook = hooks["mixed"]
    unstated = Job(tres_per_node="gres/gpumem:70G", submit_uid=1000)
    ok, message, _ = hooked_edit(hook, unstated, held("gres/"))
    assert not ok and message == f"gpumem:70G: {MESSAGES['edit_hidden'] % ('l40s', 'a100_80g')}", message
    for hosts in ("", "ascendn1"):
        edit = Job(tres_per_node="gres/gpumem:70G", exc_nodes=hosts, req_nodes="", submit_uid=1000)
        ok, message, after = hooked_edit(hook, edit, held("gres/"))
        assert ok and after.tres_per_node == "gres/gpu:a100_80g:1", (hosts, message, after)
    # adversarial round 6, N01 (24.11): `update reqnodelist=l40sn1` (checked, accepted), then `update
    # gres=gpumem:70G excnodelist=` moved the job to a100_80g beside ReqNodeList=l40sn1: it never started.
    # The job's -w is as hidden as its -x: a type move needs both stated.
    edit = Job(tres_per_node="gres/gpumem:70G", exc_nodes="", submit_uid=1000)
    ok, message, _ = hooked_edit(hook, edit, held("gres/"))
    assert not ok and message == f"gpumem:70G: {MESSAGES['edit_hidden'] % ('l40s', 'a100_80g')}", message
    assert "reqnodelist=" in message
    edit = Job(tres_per_node="gres/gpumem:70G", exc_nodes="a100n1", req_nodes="", submit_uid=1000)
    ok, message, _ = hooked_edit(hook, edit, held("gres/"))
    assert not ok and "-x/--exclude" in message, message


def memory_config(root: Path) -> tuple[Config, Hook]:
    """The mixed cluster (nvidia scope) with 8000 MiB on l40sn1 and 16000 on a100n1."""
    raw = yaml.safe_load(MIXED.read_text())
    for node in raw["nodes"]:
        node["real_memory_mib"] = 8000 if node["name"] == "l40sn1" else 16000
    nodes = slurm_nodes(inventory.inventory_from_dict(raw, "memory"), load_catalog())
    settings = settings_from_dict(merge(DEFAULTS, {}))
    config = render(root, compile_model(nodes, settings.scoring), settings, "memory.yaml")
    return config, Hook(config.directory / SCRIPT_NAME)


@pytest.mark.parametrize("memory", [{"min_mem_per_node": 12000}, {"min_mem_per_cpu": 12000}])
def test_a_gpumem_edit_reads_the_jobs_memory_from_its_record(tmp_path: Path, memory: dict[str, int]) -> None:
    """job_rec carries min_mem_per_node / min_mem_per_cpu (slurm_lua.c, 22.05 and 24.11); the edit
    view read neither, so a `--mem=12000` job edited to gpumem:20G went to l40s, whose node has
    8000 MiB: it never started."""
    config, hook = memory_config(tmp_path)
    edit = Job(tres_per_node="gres/gpumem:20G", submit_uid=1000)
    plain = decided_edit(config, edit, Job(user_id=1000))
    assert type_of(plain) == "l40s", plain  # without memory
    record = Job(user_id=1000, **memory)  # type: ignore[arg-type]
    python = decided_edit(config, edit, record)
    assert type_of(python) == "a100_80g", python
    ok, _, after = hooked_edit(hook, edit, record)
    assert ok and "a100_80g" in (after.tres_per_node or "") + (after.features or ""), after
    # the edit's own memory wins over the record's
    smaller = Job(tres_per_node="gres/gpumem:20G", submit_uid=1000, **{name: 4000 for name in memory})
    python = decided_edit(config, smaller, record)
    assert type_of(python) == "l40s", python
    assert hooked_edit(hook, smaller, record)[0]


def test_messages_name_the_node_lists() -> None:
    assert "node list" in MESSAGES["edit_counts"] and "excnodelist=" in MESSAGES["edit_hidden"]


ANY = Job(
    tres_per_node="gres/gpu:1",
    features="l40s|a100_80g",
    user_id=1000,
    admin_comment="slurm_hetero: gpumem:20G -> gres/gpu:1 constraint l40s|a100_80g (best-fit, any-fit)",
)


@pytest.mark.parametrize(
    ("edit", "fits"),
    [
        (Job(req_nodes="ascendn1", submit_uid=1000), False),
        (Job(req_nodes="a100n1", submit_uid=1000), True),
        (Job(exc_nodes="a100n1,l40sn1", submit_uid=1000), False),
        (Job(exc_nodes="ascendn1", submit_uid=1000), True),
        (Job(min_nodes=2, submit_uid=1000), False),  # one node of each type: never two of one
    ],
)
def test_a_checked_edit_of_an_untyped_job_keeps_the_types_its_constraint_names(
    rendered: dict[str, Config], hooks: dict[str, Hook], edit: Job, fits: bool
) -> None:
    """An any-fit job holds `gres/gpu:1` with the types in its constraint (`l40s|a100_80g`, which
    the hook added): a checked edit (no gpumem) keeps that constraint, where it dropped it and
    checked every type (reqnodelist=ascendn1 was accepted for a job that can only run on l40s or
    a100 nodes)."""
    ok, message, after = hooked_edit(hooks["mixed"], edit, ANY)
    assert ok == fits, message
    if ok:
        assert after.features == ANY.features and after.tres_per_node == ANY.tres_per_node, after
