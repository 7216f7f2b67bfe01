"""job_submit.lua under Lua 5.1 (lupa), through the shim every Python caller uses
(`slurm_hetero.submit.hook`): the fake `slurm` table and job_desc tables behave like Slurm's
(`../shared/slurm-lab/slurm-local.md` section 4): setting a string field to "" unsets it, setting
nil is an error, log_user/log_info format their arguments. Every case of tests/cases/requests.yaml
runs through it and is checked against the case's `expect`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.core.errors import RequestError
from slurm_hetero.engine.reasons import MESSAGES
from slurm_hetero.engine.score import ClusterModel, ScoringOptions, compile_model
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.config import Settings, exempt_uids
from slurm_hetero.inventory.nodes import slurm_nodes
from slurm_hetero.submit import Job, job_from_options, sbatch_counts
from slurm_hetero.submit import hook as shim
from slurm_hetero.submit.hook import RECORD_HIDDEN, WRITTEN, Outcome, render_script, script_template
from slurm_hetero.submit.tables import (
    CHAIN_TEMPLATE,
    CLI_FILTER_NAME,
    CLI_SRUN_NAME,
    SCRIPT_NAME,
    SLURM_ERRNO,
    TABLE_NAME,
)
from tests.unit.test_score import MIXED, second_inventory, second_settings
from tests.unit.test_units import load_cases

lupa = pytest.importorskip("lupa.lua51")
ERROR_NUMBERS = SLURM_ERRNO


@dataclass(frozen=True)
class Config:
    """A cluster + settings, rendered to a directory with both Lua files."""

    model: ClusterModel
    directory: Path


def render(directory: Path, model: ClusterModel, settings: Settings, source: str = "test") -> Config:
    declared = ["NodeName=n[1-2] Name=gpu Type=a100 File=/dev/nvidia[0-7]"]  # a comment to Lua
    directory.mkdir(parents=True, exist_ok=True)
    shim.render_hook(
        directory, model, exempt_uids(settings.exempt_users), settings.fail_policy, source, declared
    )
    return Config(model, directory)


class Hook(shim.Hook):
    """The shim's hook with tuple answers for the tests."""

    def run(self, job: Job, **extra: Any) -> tuple[bool, str, Job, list[tuple[str, str]]]:
        """(accepted, user message, job after the hook, log lines); `extra`: het_job_offset."""
        rc, user, after, lines = self.run_rc(job, **extra)
        return rc == 0, user, after, lines

    def run_rc(
        self, job: Job, het_job_offset: int | None = None
    ) -> tuple[int, str, Job, list[tuple[str, str]]]:
        """As `run`, with the hook's return code."""
        outcome = self.submit(job, het_job_offset)
        return outcome.rc, outcome.message, outcome.job, list(outcome.log)


def run_edit(hook: Hook, edit: Job, record: Job) -> tuple[int, str, Job, list[tuple[str, str]]]:
    """slurm_job_modify on an edit of `record` by `edit.submit_uid`: (rc, user message, the job as
    Slurm stores it after the edit, log lines)."""
    outcome = hook.modify(edit, record)
    return outcome.rc, outcome.message, outcome.job, list(outcome.log)


_DECIDERS: dict[Path, Hook] = {}


def decided(config: Config, job: Job) -> Outcome:
    """What the hook of `config` does with `job` (one Lua state per config, as slurmctld keeps one)."""
    hook = _DECIDERS.setdefault(config.directory, Hook(config.directory / SCRIPT_NAME))
    return hook.submit(job)


def decided_edit(config: Config, edit: Job, record: Job) -> Outcome:
    hook = _DECIDERS.setdefault(config.directory, Hook(config.directory / SCRIPT_NAME))
    return hook.modify(_nil_empty(edit), _nil_empty(replace(record, **dict.fromkeys(RECORD_HIDDEN))))


def configs(root: Path) -> dict[str, Config]:
    from slurm_hetero.inventory.config import DEFAULTS, load_settings, merge, settings_from_dict

    default = load_settings(None, {"SLURM_HETERO_CONFIG": "/dev/null"})
    unscoped = settings_from_dict(merge(DEFAULTS, {"job_submit": {"default_vendors": "all"}}))
    nodes = slurm_nodes(inventory.load(MIXED), load_catalog())
    mixed = compile_model(nodes, unscoped.scoring)
    scoped = compile_model(nodes, default.scoring)
    second = compile_model(slurm_nodes(second_inventory(), load_catalog()), second_settings().scoring)
    gpu_ascend = settings_from_dict(merge(DEFAULTS, {"partitions": {"gpu": {"default_vendors": ["ascend"]}}}))
    return {
        "mixed": render(root / "mixed", mixed, unscoped, "mixed.yaml"),
        "scoped": render(root / "scoped", scoped, default, "mixed.yaml"),
        "gpuscope": render(
            root / "gpuscope", compile_model(nodes, gpu_ascend.scoring), gpu_ascend, "mixed.yaml"
        ),
        "second": render(root / "second", second, second_settings(), "second"),
    }


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Config]:
    return configs(tmp_path_factory.mktemp("job_submit"))


@pytest.fixture(scope="module")
def hooks(rendered: dict[str, Config]) -> dict[str, Hook]:
    return {name: Hook(config.directory / SCRIPT_NAME) for name, config in rendered.items()}


def _gpu_items(outcome: Outcome) -> list[list[str]]:
    """The name and type tokens of each item the hook wrote (`gres:gpu:l40s:1` -> gpu, l40s)."""
    texts = [getattr(outcome.job, name) or "" for name in WRITTEN[:4]]
    items = [item.split("=")[0] for text in texts for item in text.split(",") if item]
    return [re.sub(r"^gres[:/]", "", item).split(":") for item in items]


def kind_of(outcome: Outcome) -> str | None:
    """What the hook wrote: "shard", "gpu" (a typed item) or "any" (an untyped one), from the job."""
    items = _gpu_items(outcome)
    if any(t[0] == "shard" for t in items):
        return "shard"
    gpus = [t for t in items if t[0] == "gpu"]
    return "gpu" if type_of(outcome, typed_only=True) else ("any" if gpus else None)


def type_of(outcome: Outcome, typed_only: bool = False) -> str | None:
    """The type the hook chose: its typed gpu item's, else the first of the constraint it added."""
    for t in _gpu_items(outcome):
        if t[0] == "gpu" and len(t) > 1 and not t[1].isdigit():
            return t[1]
    if typed_only:
        return None
    tail = re.split(r"[&|()]+", (outcome.job.features or "").rsplit("&", 1)[-1])
    return next((name for name in tail if name), None)


def hooked(config: Config, hook: Hook, job: Job) -> tuple[bool, str, Job]:
    """Run the hook on one job: no internal error, a Slurm error number (or slurm.ERROR) for a
    refusal, a rewrite logged with its message. Returns (accepted, user message, job after)."""
    rc, message, after, log = hook.run_rc(job)
    assert not [line for kind, line in log if kind == "error"], log
    assert rc in (0, -1, *ERROR_NUMBERS.values()), (job, rc)
    if rc == 0 and message:
        uid = job.submit_uid if job.submit_uid is not None else "nil"
        assert ("info", f"slurm_hetero: uid {uid}: {message}") in log
    return rc == 0, message, after


def check(expected: dict[str, Any], answer: tuple[bool, str, Job]) -> None:
    ok, message, after = answer
    assert ok == expected["ok"], message
    if "message" in expected:
        assert expected["message"] in message if expected["message"] else message == ""
    for name in WRITTEN:
        if name in expected:
            assert getattr(after, name) == expected[name], name


@pytest.mark.parametrize("case", load_cases(), ids=lambda c: c["name"])
def test_shared_cases(case: dict[str, Any], rendered: dict[str, Config], hooks: dict[str, Hook]) -> None:
    name = case.get("config", "mixed")
    components = case.get("components", [case.get("job")])
    expected = case["expect"] if "components" in case else [case["expect"]]
    assert len(components) == len(expected)
    for offset, (raw, expect) in enumerate(zip(components, expected)):
        job = Job(**raw)
        if "components" not in case:
            check(expect, hooked(rendered[name], hooks[name], job))
            continue
        # Slurm calls the hook once per component, with its offset; later components know the
        # nodes the earlier ones take (components never share a node)
        rc, message, after, log = hooks[name].run_rc(job, het_job_offset=offset)
        check(expect, (rc == 0, message, after))
        assert all(f"component {offset}:" in text for kind, text in log if kind == "info")


def test_the_decision_memo_covers_every_field_a_submission_reads(rendered: dict[str, Config]) -> None:
    """slurm_job_submit remembers decisions by MEMO_FIELDS and the uid: a field a decision reads
    that the key lacks would hand one job another's decision."""
    script = (rendered["mixed"].directory / SCRIPT_NAME).read_text()
    listed = re.search(r"local MEMO_FIELDS = \{([^}]*)\}", script)
    assert listed
    memo_fields = set(re.findall(r'"([a-z_]+)"', listed.group(1)))
    hook = Hook(rendered["mixed"].directory / SCRIPT_NAME)
    for case in load_cases():
        for raw in case.get("components", [case.get("job")]):
            hook.run(Job(**raw))
    read = set(hook.lua.globals().READ.keys())
    assert "tres_per_node" in read and "features" in read
    # the outcome's own writes (apply) read these; they are not part of a decision
    assert read - memo_fields <= {"het_job_offset", "admin_comment"}, read - memo_fields


def test_a_remembered_decision_is_the_same_job_again(rendered: dict[str, Config]) -> None:
    hook = Hook(rendered["mixed"].directory / SCRIPT_NAME)
    job = job_from_options(gres="gpumem:20G", uid=1000)
    first, second = hook.run(job), hook.run(job)
    assert first == second and first[0]
    other = hook.run(replace(job, features="nosuchfeature"))  # one field differs: decided anew
    assert not other[0]


def test_a_submission_reads_each_job_desc_field_once(rendered: dict[str, Config]) -> None:
    """Slurm 22.05 answers every job_desc read with a C call that compares the name with the names
    of the job's fields one after another (~2,700 instructions for a tres_per_* field; 26 reads
    per job were a quarter of what the hook cost slurmctld): the hook reads each field at most
    once per job, deciding or remembering, and only the TRES fields of a job without gpumem."""
    hook = Hook(rendered["mixed"].directory / SCRIPT_NAME)

    def reads(job: Job) -> dict[str, int]:
        hook.lua.execute("READS = {}")
        assert hook.run(job)[0]
        return dict(hook.lua.globals().READS.items())

    job = job_from_options(gres="gpumem:20G", ntasks="2", uid=1000)
    for counts in (reads(job), reads(job)):  # decided, then remembered
        assert {"tres_per_node", "num_tasks", "user_id"} <= set(counts), counts
        assert max(counts.values()) == 1, counts
    plain = reads(job_from_options(gres="gpu:1", uid=1000))
    tres = {f"tres_per_{scope}" for scope in ("node", "job", "task", "socket")}
    assert set(plain) <= {"het_job_offset", *tres}, plain


def test_a_remembered_decision_does_not_scan_its_message_again(rendered: dict[str, Config]) -> None:
    """Escaping a message scans it byte by byte for control characters; twice per job for a
    140-byte message that cost slurmctld 22.05 as much as the rest of the hook's Lua. A
    remembered outcome keeps its escaped text: the same request again tells the same words
    without scanning them."""
    hook = Hook(rendered["scoped"].directory / SCRIPT_NAME)
    hook.lua.execute(
        """
        SCANNED = {}
        local find, gsub, match = string.find, string.gsub, string.match
        string.find = function(s, ...) SCANNED[s] = true; return find(s, ...) end
        string.gsub = function(s, ...) SCANNED[s] = true; return gsub(s, ...) end
        string.match = function(s, ...) SCANNED[s] = true; return match(s, ...) end
        """
    )
    job = job_from_options(gres="gpumem:20G", uid=1000)
    first = hook.run(job)
    assert first[0] and first[1] in hook.lua.globals().SCANNED  # escaped once, when decided
    hook.lua.execute("SCANNED = {}")
    second = hook.run(job)
    assert second == first and second[1] not in hook.lua.globals().SCANNED


def test_an_exclusion_of_long_names_is_not_expanded(
    rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    """`-x <4,000 characters>[1-4096]` names no host of the table: expanding it built 16 MB of
    strings in Lua under slurmctld's job lock (16,384 names: 2.8 s); now no longer than the
    same count of short names, and decided the same as explain."""
    import time

    hook = Hook(rendered["mixed"].directory / SCRIPT_NAME)  # its het memory stays its own

    def cost(spec: str) -> float:
        job = Job(tres_per_node="gres:gpumem:20G", exc_nodes=spec, submit_uid=1000)
        hooked(rendered["mixed"], hook, job)
        start = time.perf_counter()
        for _ in range(5):
            hook.run_rc(job, het_job_offset=0)  # a het component: never remembered
        return time.perf_counter() - start

    short = cost("n[1-4096]")
    assert cost("a" * 4000 + "[1-4096]") < 2 * short + 0.05


# ---------------------------------------------------------------------------------- edits


def _nil_empty(job: Job) -> Job:
    """Slurm hands the hook unset strings as nil, never "" (except an update's `ExcNodeList=` and
    `ReqNodeList=`, which arrive as "" and clear the job's -x / -w: slurmctld's _update_job, 22.05 and
    24.11)."""
    unset = [
        f.name for f in fields(Job) if getattr(job, f.name) == "" and f.name not in ("exc_nodes", "req_nodes")
    ]
    return replace(job, **dict.fromkeys(unset))


def hooked_edit(hook: Hook, edit: Job, record: Job) -> tuple[bool, str, Job]:
    """slurm_job_modify on one edit of `record` as Slurm hands them (unset strings nil, no
    `RECORD_HIDDEN` field): no internal error; a successful edit is told to slurmctld's log only
    (24.11's scontrol prints log_user as "error:")."""
    record = replace(record, **dict.fromkeys(RECORD_HIDDEN))
    record, edit = (_nil_empty(record), _nil_empty(edit))
    rc, message, after, log = run_edit(hook, edit, record)
    assert not [line for kind, line in log if kind == "error"], log
    assert rc in (0, -1, *ERROR_NUMBERS.values()), (edit, rc)
    assert rc != 0 or message == "", (edit, record)
    return rc == 0, message, after


RECORD = Job(tres_per_node="gres/gpu:l40s:1", user_id=1000, admin_comment="slurm_hetero: gpumem:20G -> ...")
NOTE = "slurm_hetero: gpumem:20G -> ..."


def test_an_edit_to_gpumem_70g_gets_a_70g_device(rendered: dict[str, Config], hooks: dict[str, Hook]) -> None:
    # ExcNodeList= (""): the edit states the job's -x (none), which Slurm does not show the hook
    edit = Job(tres_per_node="gres/gpumem:70G", submit_uid=1000, exc_nodes="", req_nodes="")
    config = rendered["mixed"]
    ok, message, after = hooked_edit(hooks["mixed"], edit, RECORD)
    assert ok and after.tres_per_node == "gres/gpu:a100_80g:1" and message == ""  # told in the log only
    told = [text for kind, text in decided_edit(config, edit, RECORD).log if kind == "info"]
    assert told and told[-1].endswith(": gpumem:70G -> gres/gpu:a100_80g:1 (best-fit)"), told
    assert after.admin_comment == RECORD.admin_comment  # users may not change it


@pytest.mark.parametrize(
    ("field", "held", "expected"),
    [
        ("tres_per_job", "gres/gpu:l40s:2", "gres/gpu:a100_80g:2"),  # --gpus=2
        ("tres_per_task", "gres/gpu:l40s=1", "gres/gpu:a100_80g:1"),  # --gpus-per-task=1, form of the gpumem
        ("tres_per_job", "gres/gpu:a100_80g:2", "gres/gpu:a100_80g:2"),  # same type: unchanged
    ],
)
def test_an_edit_keeps_the_jobs_device_count_and_scope_and_chooses_the_type_again(
    rendered: dict[str, Config], hooks: dict[str, Hook], field: str, held: str, expected: str
) -> None:
    """Issue 10 item 2, find 1: `scontrol update gres=gpumem:70G` of a job with `--gpus=2` or
    `--gpus-per-task` left the raw `gres/gpumem:70G` in tres_per_node beside the old device, and
    the job never started. The edit is decided as a submission with the job's count and scope; its
    own tres_per_node item is written "" (no change), so Slurm keeps the record's."""
    record = replace(RECORD, tres_per_node=None, num_tasks=2, **{field: held})
    # devices per task: the record hides the task count, so the edit gives it (test below)
    tasks = 2 if field == "tres_per_task" else None
    edit = Job(tres_per_node="gres/gpumem:70G", submit_uid=1000, num_tasks=tasks, exc_nodes="", req_nodes="")
    ok, _, after = hooked_edit(hooks["mixed"], edit, record)
    assert ok and getattr(after, field) == expected and after.tres_per_node is None, after


@pytest.mark.parametrize(
    ("held", "edit_gres", "expected"),
    [
        ("gres/gpu:a100_80g:2", "gres/gpumem:30G", "gres/gpumem:30G,gres/gpu:2"),  # --gpus-per-node=2 (R01)
        ("gres/gpu:l40s:2", "gres/gpumem:70G", "gres/gpumem:70G,gres/gpu:2"),  # a type move keeps it too
        ("gres:gpu:a100_80g:2", "gres:gpumem:30G", "gres:gpumem:30G,gres:gpu:2"),  # 22.05's form
        (
            "gres/gpu:a100_80g:2",
            "gres/gpumem:30G,gres/gpu:1",
            "gres/gpumem:30G,gres/gpu:1",
        ),  # restated: theirs
    ],
)
def test_a_gpumem_edit_keeps_the_jobs_per_node_device_count(
    rendered: dict[str, Config], hooks: dict[str, Hook], held: str, edit_gres: str, expected: str
) -> None:
    """Adversarial round 6, R01-R05 (22.05 and 24.11): a job of `--gpus-per-node=2 --gres=gpumem:20G`
    (a100_80g:2), or a typed `--gres=gpu:a100_80g:2`, edited `scontrol update gres=gpumem:30G` ran on ONE
    device: the update replaces tres_per_node whole, and the count went with it. The hook never picks a
    count itself, so the job's per-node count stays unless the edit gives one."""
    hook = hooks["mixed"]
    record = replace(RECORD, tres_per_node=held)
    moves = "70G" in edit_gres  # a type move states the job's node lists (none): excnodelist= reqnodelist=
    stated = "" if moves else None
    edit = Job(tres_per_node=edit_gres, submit_uid=1000, exc_nodes=stated, req_nodes=stated)
    ok, message, after = hooked_edit(hook, edit, record)
    count = expected.rsplit(":", 1)[1]
    assert ok and after.tres_per_node is not None and after.tres_per_node.endswith(f":{count}"), (
        message,
        after,
    )


def test_a_gpumem_edit_counts_the_cpus_per_task_a_24_11_record_shows(
    rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    """24.11 fuzz seed 20261126: a job with -c 64 (TresPerTask=cpu=64 in its record) edited to
    gpumem:20G was put on a type whose nodes have fewer CPUs ("Requested partition configuration
    not available now"): the edit view has no cpus_per_task, but the record's tres_per_task does."""
    config, hook = rendered["mixed"], hooks["mixed"]
    most = max(shape.cpus for facts in config.model.types.values() for shape in facts.shapes)
    record = replace(RECORD, tres_per_task=f"cpu={most + 1}")
    ok, message, _ = hooked_edit(hook, Job(tres_per_node="gres/gpumem:20G", submit_uid=1000), record)
    assert not ok, message  # no node has the CPUs
    ok, message, _ = hooked_edit(hook, Job(tres_per_node="gres/gpumem:20G", submit_uid=1000), RECORD)
    assert ok, message


@pytest.mark.parametrize("release_form", ["gres/gpu=2", "gres:gpu:2", "gres/gpu:l40s=1"])
def test_a_gpumem_edit_of_a_job_with_devices_per_task_is_refused_without_its_task_count(
    rendered: dict[str, Config], hooks: dict[str, Hook], release_form: str
) -> None:
    """Fuzz (22.05 and 24.11): `scontrol update gres=gpumem:1G` of a job with TresPerTask=gpu:2 and
    tasks on one node was put on a type with too few devices per node (slurmctld: "Requested
    partition configuration not available now"): Slurm's job_rec has no num_tasks or
    ntasks_per_node (22.05, 24.11), so the devices each node needs are unknown. Refused, saying
    what to do; with NumTasks in the same update it is decided."""
    hook = hooks["mixed"]
    record = replace(RECORD, tres_per_node=None, tres_per_task=release_form, num_tasks=4, ntasks_per_node=4)
    edit = Job(tres_per_node="gres/gpumem:1G", submit_uid=1000)
    ok, message, after = hooked_edit(hook, edit, record)
    assert not ok and message.startswith("gpumem:1G,"), message
    assert message.endswith(f": {MESSAGES['edit_tasks']}"), message
    assert after.tres_per_task == record.tres_per_task
    ok, message, _ = hooked_edit(hook, replace(edit, num_tasks=1), record)
    assert ok, message


def test_a_22_05_edit_that_changes_the_type_is_refused(
    rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    """Issue 10 item 2, finds 2 and 3: Slurm 22.05 merges an update's GRES into the job's, so
    `gres:gpu:a100_80g:1` went beside the held `gpu:l40s:1` (the job ran on l40sn1, or with
    `features=[ascend|nvidia]` ended in BadConstraints). A 22.05 record (`gres:` form) keeps its type."""
    hook = hooks["mixed"]
    held = (
        replace(RECORD, tres_per_node="gres:gpu:l40s:1"),
        replace(RECORD, tres_per_node=None, tres_per_job="gres:gpu:l40s:2"),
    )
    for record in held:
        for edit in (
            Job(tres_per_node="gres:gpumem:70G", submit_uid=1000),
            Job(tres_per_node="gres:gpumem:60G", features="[ascend|nvidia]", submit_uid=1000),
        ):
            ok, message, _ = hooked_edit(hook, edit, record)
            assert not ok and "Slurm 22.05 keeps the l40s devices" in message, (record, message)
    record = replace(RECORD, tres_per_node="gres:gpu:l40s:1")
    ok, _, after = hooked_edit(hook, Job(tres_per_node="gres:gpumem:30G", submit_uid=1000), record)
    assert ok and after.tres_per_node == "gres:gpu:l40s:1"  # the same type: accepted


@pytest.mark.parametrize(
    ("record", "edit", "accepted"),
    [
        (Job(tres_per_node="gres/gpu:l40s:1"), Job(min_nodes=2), False),  # one l40s node
        (Job(tres_per_node="gres/gpu:a100_80g:1"), Job(min_nodes=2), False),
        (Job(tres_per_task="gres/gpu:l40s=1"), Job(num_tasks=8), False),  # 8 per node, 2 there
        (Job(tres_per_task="gres/gpu:a100_80g=1"), Job(num_tasks=4), True),  # 4 per node: fits
        (Job(tres_per_node="gres/gpu:l40s:1"), Job(num_tasks=8), True),  # per node, one node
        (Job(tres_per_node="gres:shard:5,gres:gpumem:20G", features="l40s"), Job(min_nodes=2), False),
    ],
)
def test_an_edit_of_the_node_or_task_count_is_checked_against_the_devices_held(
    rendered: dict[str, Config], hooks: dict[str, Hook], record: Job, edit: Job, accepted: bool
) -> None:
    """Issue 10 item 2, find 4: `scontrol update numnodes=2` (or numtasks=8) of a rewritten job
    was accepted and the job never started. Refused, naming what would fit, when the devices the
    job holds do not fit the new count; a job the hook did not rewrite (no note) is left alone."""
    record = replace(record, user_id=1000, admin_comment=NOTE)
    edit = replace(edit, submit_uid=1000)
    ok, message, after = hooked_edit(hooks["mixed"], edit, record)
    assert ok == accepted, message
    if not ok:
        assert message.startswith(MESSAGES["edit_counts"].split("%s")[0]) and "gres=gpumem:SIZE" in message
    rc, _, _, _ = run_edit(hooks["mixed"], edit, replace(record, admin_comment=None))
    assert rc == 0  # not ours


@pytest.mark.parametrize(
    ("record", "edit", "accepted"),
    [
        (Job(tres_per_node="gres/gpu:l40s:1"), Job(partition="ascend"), False),  # no l40s there
        (Job(tres_per_node="gres/gpu:l40s:1"), Job(partition="nvidia"), True),
        (Job(tres_per_node="gres/gpu:l40s:1"), Job(partition="nvidia,ascend"), True),
        (Job(tres_per_task="gres/gpu:a100_80g=1"), Job(partition="ascend"), False),
        (Job(tres_per_node="gres/gpu:l40s:1"), Job(features="ib"), False),  # the l40s node has no ib
        (Job(tres_per_node="gres/gpu:l40s:1"), Job(features="nvidia"), True),
        (Job(tres_per_node="gres/gpu:a100_80g:1"), Job(features="ib"), True),
        (Job(tres_per_node="gres/gpu:a100_80g:1"), Job(features="ascend|hccs"), False),
        (Job(tres_per_node="gres:shard:5,gres:gpumem:20G", features="l40s"), Job(partition="ascend"), False),
    ],
)
def test_an_edit_of_the_partition_or_constraint_is_checked_against_the_devices_held(
    rendered: dict[str, Config], hooks: dict[str, Hook], record: Job, edit: Job, accepted: bool
) -> None:
    """`scontrol update jobid=N partition=P` (or features=F) of a pending rewritten job was not
    checked: the type it holds need not exist there, and the job pended forever. Checked as a
    count edit is: refused naming what would fit, or accepted."""
    record = replace(record, user_id=1000, admin_comment=NOTE)
    edit = replace(edit, submit_uid=1000)
    ok, message, _ = hooked_edit(hooks["mixed"], edit, record)
    assert ok == accepted, message
    if not ok:
        assert message.startswith(MESSAGES["edit_counts"].split("%s")[0]) and "gres=gpumem:SIZE" in message
    rc, _, _, _ = run_edit(hooks["mixed"], edit, replace(record, admin_comment=None))
    assert rc == 0  # not ours


@pytest.mark.parametrize("partition", ["nosuch", "nvidia,nosuch", ",", ",,", ""])
def test_an_unknown_partition_is_slurmctlds_invalid_partition_name(
    rendered: dict[str, Config], hooks: dict[str, Hook], partition: str
) -> None:
    """`sbatch -p nosuch --gres=gpumem:20G` was decided as if in the default partition, and that
    decision printed before slurmctld's "Invalid partition name". Refused by the hook itself, with
    slurmctld's error (2000 where the release's Lua API lacks the name), submission and edit alike."""
    config, hook = rendered["scoped"], hooks["scoped"]
    job = Job(tres_per_node="gres:gpumem:20G", partition=partition, submit_uid=1000, user_id=1000)
    python = decided(config, job)
    assert not python.ok and python.code == "ESLURM_INVALID_PARTITION_NAME", python
    assert python.message.startswith(f"--partition={partition}: ") and "ascend, gpu, nvidia" in python.message
    rc, message, _, _ = hook.run_rc(job)
    assert (rc, message) == (2000, python.message)
    if partition:  # an edit's "" is "no change" (the record's partition)
        record = replace(RECORD, admin_comment=NOTE)
        edit = Job(partition=partition, submit_uid=1000)
        for change in (edit, replace(edit, tres_per_node="gres:gpumem:20G")):
            ok, message, _ = hooked_edit(hook, change, record)
            assert not ok and message == python.message, message


def test_a_new_constraint_keeps_the_types_the_rewrite_chose(
    rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    """`features=ib` on an any-fit job (`gres:gpu:1`, constraint `TYPE|TYPE` chosen for its gpumem)
    would drop that constraint and let the job start on a device too small: ANDed instead."""
    config = rendered["second"]
    first = decided(config, Job(tres_per_node="gres:gpumem:50G", user_id=1000, submit_uid=1000))
    assert first.ok and kind_of(first) == "any" and first.job.features, first
    ours = first.job.features
    ok, _, after = hooked_edit(hooks["second"], Job(features="ib", submit_uid=1000), first.job)
    tail = ours if "|" not in ours else f"({ours})"
    assert ok and after.features == f"ib&{tail}", after.features
    ok, message, _ = hooked_edit(hooks["second"], Job(features="t4", submit_uid=1000), first.job)
    assert not ok and message.startswith(MESSAGES["edit_counts"].split("%s")[0]), message


def test_an_impossible_edit_is_refused_with_the_message(
    rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    edit = Job(tres_per_node="gres/gpumem:900G", submit_uid=1000)
    ok, message, _ = hooked_edit(hooks["mixed"], edit, RECORD)
    assert not ok and message.startswith("gpumem:900G: largest device is")


def test_edits_without_gpumem_and_exempt_editors_are_left_alone(
    rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    shard_job = Job(tres_per_node="gres:shard:5,gres:gpumem:10G", user_id=1000)  # decided once
    for edit, record in [(Job(features="ib", submit_uid=1000), shard_job), (Job(min_nodes=2), shard_job)]:
        rc, message, after, _ = run_edit(hooks["mixed"], edit, record)
        assert (rc, message, after.tres_per_node) == (0, "", shard_job.tres_per_node)
    rc, _, after, _ = run_edit(hooks["mixed"], Job(tres_per_node="gres:gpumem:900G", submit_uid=0), RECORD)
    assert (rc, after.tres_per_node) == (0, "gres:gpumem:900G")


def test_an_edit_drops_the_constraint_the_last_rewrite_added(
    rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    config = rendered["second"]
    for features, size in ((None, "100G"), ("ib", "20G")):  # any-fit: gres:gpu:1 and a constraint
        submitted = Job(tres_per_node="gres:gpumem:50G", features=features, user_id=1000, submit_uid=1000)
        first = decided(config, submitted)
        assert first.ok and first.job.features and first.job.features != features, first
        edit = Job(tres_per_node=f"gres:gpumem:{size}", submit_uid=1000)
        ok, _, after = hooked_edit(hooks["second"], edit, first.job)
        assert ok and after.features != first.job.features
        assert str(after.features).startswith(features or "")


# ------------------------------------------------------------------------ failure handling

GOOD = Job(tres_per_node="gres:gpumem:20G", submit_uid=1000)


def _copy(config: Config, directory: Path, table_edit: Any = None, script_edit: Any = None) -> Path:
    directory.mkdir()
    table = (config.directory / TABLE_NAME).read_text()
    script = (config.directory / SCRIPT_NAME).read_text()
    (directory / TABLE_NAME).write_text(table_edit(table) if table_edit else table)
    (directory / SCRIPT_NAME).write_text(script_edit(script) if script_edit else script)
    return directory / SCRIPT_NAME


def _corrupt_entry(table: str) -> str:
    return re.sub(r'\["mem"\] = \d+', '["mem"] = "lots"', table, count=1)


@pytest.mark.parametrize("name, accepted", [("mixed", True), ("second", False)])  # open, closed
def test_corrupted_entry_follows_the_fail_policy(
    rendered: dict[str, Config], tmp_path: Path, name: str, accepted: bool
) -> None:
    hook = Hook(_copy(rendered[name], tmp_path / "x", _corrupt_entry))
    ok, message, after, log = hook.run(GOOD)
    assert ok is accepted and after == GOOD  # never half-rewritten
    assert any(kind == "error" and "internal error, failing" in text for kind, text in log)
    assert message == (
        ""
        if accepted
        else "internal error in the slurm_hetero job_submit hook; job rejected, tell your admin"
    )
    assert hook.run(Job(tres_per_node="gres:gpu:l40s:1"))[0]  # jobs that are not ours still pass


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.replace("return {", "return {{", 1),  # syntax error
        lambda t: "return 42\n",  # not a table
        lambda t: t.replace('["format"] = 1', '["format"] = 2'),  # another format
        lambda t: re.sub(r'\["id"\] = "\w+"', '["id"] = "0000"', t),  # another render
    ],
    ids=["syntax", "not-a-table", "format", "id"],
)
@pytest.mark.parametrize("name, accepted", [("mixed", True), ("second", False)])
def test_unusable_table_follows_the_baked_fail_policy(
    rendered: dict[str, Config], tmp_path: Path, edit: Any, name: str, accepted: bool
) -> None:
    hook = Hook(_copy(rendered[name], tmp_path / "x", edit))
    ok, _, after, log = hook.run(GOOD)
    assert ok is accepted and after == GOOD
    assert any(kind == "error" for kind, _ in log)


def test_missing_table_is_logged_at_load(rendered: dict[str, Config], tmp_path: Path) -> None:
    script = _copy(rendered["second"], tmp_path / "x")
    (script.parent / TABLE_NAME).unlink()
    hook = Hook(script)
    at_load = [entry[2] for entry in hook.lua.globals().LOG.values()]
    assert any("cannot load" in line and "(fail policy closed)" in line for line in at_load), at_load
    assert not hook.run(GOOD)[0]


def test_unrendered_script_reads_any_table(rendered: dict[str, Config], tmp_path: Path) -> None:
    script = _copy(rendered["mixed"], tmp_path / "x", script_edit=lambda s: script_template())
    ok, message, after, _ = Hook(script).run(GOOD)
    assert ok and after.tres_per_node == "gres:gpu:l40s:1" and message


def test_het_component_and_uid_are_logged(rendered: dict[str, Config], hooks: dict[str, Hook]) -> None:
    lua = hooks["mixed"].lua
    job, store = lua.globals().make_job(
        lua.table_from({"tres_per_node": "gres:gpumem:20G", "het_job_offset": 1})
    )
    lua.execute("LOG = {}")
    assert lua.globals().slurm_job_submit(job, lua.table(), 1000) == 0
    lines = [entry[2] for entry in lua.globals().LOG.values()]
    assert "slurm_hetero: uid 1000 component 1: gpumem:20G -> gres:gpu:l40s:1 (best-fit)" in lines
    job, _ = lua.globals().make_job(
        lua.table_from({"tres_per_node": "gres:gpumem:20G", "het_job_offset": 4294967294})
    )
    lua.execute("LOG = {}")
    lua.globals().slurm_job_submit(job, lua.table(), 1000)
    assert "slurm_hetero: uid 1000: gpumem:20G -> gres:gpu:l40s:1 (best-fit)" in [
        entry[2] for entry in lua.globals().LOG.values()
    ]
    assert lua.globals().slurm_job_modify(job, lua.table(), lua.table(), 0) == 0


def test_the_hook_never_shells_out_or_reads_per_job() -> None:
    text = re.sub(r"--\[\[.*?\]\]", "", script_template(), flags=re.DOTALL)
    code = "\n".join(line.split("--")[0] for line in text.splitlines())
    for forbidden in (r"\brequire\b", r"\bio\.", r"\bos\.", r"\bpopen\b", r"\bloadfile\b", r"\bloadstring\b"):
        assert not re.search(forbidden, code), forbidden
    assert len(re.findall(r"\bdofile\b", code)) == 1  # the table, once, at load


# ------------------------------------------------------------------------- rejection codes

REJECTIONS = [
    (Job(tres_per_node="gres:gpumem:abc"), "ESLURM_INVALID_GRES"),
    (Job(tres_per_node="gres:gpumem:900G"), "ESLURM_INVALID_GRES"),
    (Job(tres_per_node="gres:gpumem:20G", features="a*2"), "ESLURM_INVALID_FEATURE"),
    (Job(tres_per_node="gres:gpumem:20G", features="nosuchfeature"), "ESLURM_INVALID_FEATURE"),
    (Job(tres_per_node="gres:gpumem:20G", min_nodes=500), "ESLURM_INVALID_NODE_COUNT"),
    # an -x the hook cannot read: slurmctld's own answer for it on a typed job (adversarial A14/A18)
    (Job(tres_per_node="gres:gpumem:70G", exc_nodes="a100n[3-1]"), "ESLURM_INVALID_NODE_NAME"),
    (Job(tres_per_node="gres:gpumem:70G", exc_nodes="a100n[1-999999]"), "ESLURM_INVALID_NODE_NAME"),
    (Job(tres_per_node="gres:gpumem:70G", exc_nodes="a" * 5000), "ESLURM_INVALID_NODE_NAME"),
]


@pytest.mark.parametrize("job, code", REJECTIONS, ids=lambda v: v if isinstance(v, str) else None)
def test_rejections_return_the_most_specific_slurm_error(
    job: Job, code: str, rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    python = decided(rendered["mixed"], job)
    assert (python.ok, python.code) == (False, code)
    rc, message, _, _ = hooks["mixed"].run_rc(job)
    assert (rc, message) == (ERROR_NUMBERS[code], python.message)


@pytest.mark.parametrize(
    "spec, message",
    [
        # adversarial T04: 4,096 names in 20 KB hit the 4,096-character limit, not the host limit
        (
            ",".join(f"a{i}" for i in range(1, 4097)),
            "gpumem:20G: -x/--exclude a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11,a12,a13,a14,a15,a16,a17,a18,a19,a20,"
            "a21,a22,a...: 23468 characters, more than the 4096 this hook reads (fold the names into "
            "ranges: name[1-3,5])",
        ),
        (
            "a[1-4097]",
            "gpumem:20G: -x/--exclude a[1-4097]: this hook reads host names, name[1-3,5] ranges and "
            "commas, naming at most 4096 hosts",
        ),
        (  # a long malformed one is shortened too, before a multi-byte character
            "a" * 79 + "\u00e9" * 10,
            "gpumem:20G: -x/--exclude " + "a" * 79 + "...: this hook reads host names",
        ),
    ],
    ids=["4096-names", "4097-hosts", "clipped"],
)
def test_an_unreadable_exclude_says_the_limit_it_hit_and_shows_it_shortened(
    spec: str, message: str, rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    job = Job(tres_per_node="gres:gpumem:20G", exc_nodes=spec)
    python = decided(rendered["mixed"], job)
    assert not python.ok and python.message.startswith(message), python.message
    assert python.code == "ESLURM_INVALID_NODE_NAME"
    rc, said, _, _ = hooks["mixed"].run_rc(job)
    assert (rc, said) == (ERROR_NUMBERS["ESLURM_INVALID_NODE_NAME"], python.message)


@pytest.mark.parametrize(
    "config, gres, message",
    [
        # issue 26 repro 8: each type with at most 1 per node; the hint named h100_sxm
        (
            "second",
            "gres:gpu:a100_40g:9,gres:gpumem:1G",
            "gpu:a100_40g:9,gpumem:1G: a100_40g has at most 1 per node",
        ),
        ("second", "gres:gpu:t4:3", None),  # no gpumem: not ours
        (
            "second",
            "gres:gpu:t4:3,gres:gpucore:10",
            "gpu:t4:3,gpucore:10: t4 has at most 2 per node; would fit: ",
        ),
        # a split keeps the type it was asked for
        (
            "mixed",
            "gres:gpu:l40s:1,gres:gpumem:60G",
            "gpu:l40s:1,gpumem:60G: l40s has 46068M per device; "
            "would fit: --gres=gpu:ascend910b3:1,gpumem:60G",
        ),
        (
            "mixed",
            "gres:gpu:a100_80g:2,gres:gpumem:100G",
            "gpu:a100_80g:2,gpumem:100G: a100_80g has 80G per device; "
            "request 3 devices with --gres=gpu:a100_80g:3,gpumem:67G",
        ),
    ],
)
def test_a_typed_refusal_names_no_other_type_but_one_that_would_fit(
    config: str, gres: str, message: str | None, rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    """A request naming a type hears of that type (issue 26, 8: `a100_80g has at most 1 per node;
    at most 1 devices per node (h100_sxm)`), and of another only as one that takes the very same
    request; the same words from the hook and from explain's shim."""
    job = Job(tres_per_node=gres, submit_uid=1000, user_id=1000)
    rc, said, _, _ = hooks[config].run_rc(job)
    if message is None:
        assert (rc, said) == (0, "")
        return
    assert rc != 0 and said.startswith(message), said
    asked = re.search(r"gpu:([a-z0-9_]+):", gres)
    assert asked
    why = said.split("; would fit: ")[0]
    others = set(rendered[config].model.types) - {asked.group(1)}
    assert not [name for name in others if re.search(rf"\b{name}\b", why)], said
    assert decided(rendered[config], job).message == said


def test_a_release_without_the_constant_gets_its_number(rendered: dict[str, Config]) -> None:
    """22.05 exports ESLURM_INVALID_NODE_COUNT but neither _GRES nor _FEATURE: the hook returns
    their numbers (slurm_errno.h), so the client's last line still names the problem."""
    hook = Hook(rendered["mixed"].directory / SCRIPT_NAME)
    hook.lua.execute("slurm.ESLURM_INVALID_GRES = nil; slurm.ESLURM_INVALID_FEATURE = nil")
    for job, code in REJECTIONS:
        rc, _, _, _ = hook.run_rc(job)
        assert rc == ERROR_NUMBERS[code], job


# ------------------------------------------------------------------------------------ CLI


def test_cli_render_then_check_is_clean_and_explain_agrees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_HETERO_CONFIG", "/dev/null")
    runner = CliRunner()
    args = ["job-submit", "render", "--inventory", str(MIXED), "--out", str(tmp_path)]
    assert runner.invoke(cli, args).exit_code == 0
    assert runner.invoke(cli, [*args, "--check"]).exit_code == 0
    table_id = re.search(r'\["id"\] = "(\w+)"', (tmp_path / TABLE_NAME).read_text()).group(1)  # type: ignore[union-attr]
    assert f'local TABLE_ID = "{table_id}"' in (tmp_path / SCRIPT_NAME).read_text()
    assert "local SRUN_PATH = nil  -- @render srun_path" in (tmp_path / CLI_FILTER_NAME).read_text()
    assert "local HOOK_PATH = nil  -- @render hook_path" in (tmp_path / CLI_SRUN_NAME).read_text()
    result = runner.invoke(
        cli,
        ["request", "explain", "--inventory", str(MIXED), "--gres", "gpumem:60G", "--gpus", "2", "--json"],
    )
    import json

    answer = json.loads(result.stdout)
    assert (  # the default vendor scope (nvidia) holds the request on a100_80g
        answer["ok"] and answer["tres_per_job"] == "gres:gpu:a100_80g:2" and answer["tres_per_node"] is None
    )
    ok, message, after, _ = Hook(tmp_path / SCRIPT_NAME).run(
        Job(tres_per_node="gres:gpumem:60G", tres_per_job="gres:gpu:2")
    )
    assert (ok, message, after.tres_per_job) == (True, answer["message"], answer["tres_per_job"])
    rejected = json.loads(
        runner.invoke(
            cli,
            [
                "request",
                "explain",
                "--inventory",
                str(MIXED),
                "--gres",
                "gpu:a100_80g:1,gpumem:90G",
                "--json",
            ],
        ).stdout
    )
    assert (
        not rejected["ok"] and rejected["tres_per_node"] is None and "a100_80g has 80G" in rejected["message"]
    )
    assert rejected["code"] == "ESLURM_INVALID_GRES" and answer["code"] is None


@pytest.mark.parametrize("het_job_id", [0, 4321])
def test_a_gpumem_edit_of_a_het_component_is_refused(
    rendered: dict[str, Config], hooks: dict[str, Hook], het_job_id: int
) -> None:
    """Issue 10 r3 (24.11): `scontrol update jobid=J+0 gres=gpumem:70G` of an (l40s + a100) het job
    made component 0 a100_80g:1 beside component 1's a100 (one a100 node): both pended forever.
    The Lua API shows an edit the job record only, not the other components: refused."""
    record = Job(tres_per_node="gres/gpu:l40s:1", user_id=1000, het_job_id=het_job_id)
    edit = Job(tres_per_node="gres/gpumem:70G", submit_uid=1000, exc_nodes="", req_nodes="")
    ok, message, after = hooked_edit(hooks["mixed"], edit, record)
    if het_job_id:
        assert not ok and message == f"gpumem:70G: {MESSAGES['edit_het']}", message
    else:
        assert ok and after.tres_per_node == "gres/gpu:a100_80g:1", (message, after)


@pytest.mark.parametrize("release", ["22.05", "24.11"])
def test_explain_answers_gpus_per_socket_as_the_hook_does(
    release: str, monkeypatch: pytest.MonkeyPatch, rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    """U14/Y05: `--gpus-per-socket=3 --gres=gpumem:20G` was accepted by the hook as TresPerSocket
    a100_80g:3 (22.05: pending on BadConstraints; 24.11: refused by slurmctld after the accept
    line), and `request explain` had no --gpus-per-socket, so it answered another request."""
    monkeypatch.setenv("SLURM_HETERO_CONFIG", "/dev/null")
    job = job_from_options(
        gres="gpumem:20G", gpus_per_socket="3", sockets_per_node="1", uid=1000, slurm_release=release
    )
    assert job.tres_per_socket == ("gres:" if release == "22.05" else "gres/") + "gpu:3"
    ok, message, _ = hooked(rendered["scoped"], hooks["scoped"], job)
    assert not ok and "cannot be decided with --gpus-per-socket" in message
    import json

    flags = ["--gres", "gpumem:20G", "--gpus-per-socket", "3", "--sockets-per-node", "1", "--uid", "1000"]
    flags += ["--slurm-release", release]
    result = CliRunner().invoke(cli, ["request", "explain", "--inventory", str(MIXED), "--json", *flags])
    answer = json.loads(result.stdout)
    assert (answer["ok"], answer["message"], answer["code"]) == (False, message, "ESLURM_INVALID_GRES")


@pytest.mark.parametrize(
    "gres",
    [
        "gpumem:abc\nslurmctld: error: forged line",
        "gpumem:20G,gpu:x\r\nforged",
        "gpumem:\x00\t\x1b[31m",
        "gpumem:" + "9" * 10_000,
        "gpumem:20G\\n",
    ],
    ids=["newline", "crlf", "nul-tab-escape", "10kb", "backslash-n"],
)
def test_user_text_never_forges_a_log_line(hooks: dict[str, Hook], gres: str) -> None:
    """Issue 9: a newline in --gres wrote a line of its own into slurmctld.log."""
    for hook in hooks.values():
        _, _, _, lines = hook.run(replace(GOOD, tres_per_node=f"gres:{gres}"))
        logged = [text for kind, text in lines if kind != "user"]
        assert logged, lines
        for text in logged:
            assert text.isprintable() and len(text) < 600, text


@pytest.mark.parametrize(
    "job",
    [
        Job(tres_per_node="gres:gpumem:20G", features="ib\nslurm_hetero: forged", submit_uid=1000),
        Job(tres_per_node="gres:gpumem:abc\nforged", submit_uid=1000),
        Job(tres_per_node="gres:gpumem:20G,gpu:x\\n\ty", submit_uid=1000),
        Job(tres_per_node="gres:gpumem:900G", features="(ib)\r", submit_uid=1000),
    ],
    ids=["constraint-newline", "gres-newline", "backslash-tab", "cr"],
)
def test_user_text_in_a_message_is_escaped_the_same_in_the_hook_and_explain(
    rendered: dict[str, Config], hooks: dict[str, Hook], job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`request explain -C $'ib\\nx'` printed the newline verbatim, its answer spanning lines, and
    the hook told the user the same. Both write control characters and backslashes as \\ddd
    (`reasons.one_line`, the hook's `escaped`); the text mode answer is one line."""
    import json

    ok, message, _ = hooked(rendered["mixed"], hooks["mixed"], job)
    assert not ok and message.isprintable() and "\\0" in message, message
    monkeypatch.setenv("SLURM_HETERO_CONFIG", "/dev/null")
    argv = ["request", "explain", "--inventory", str(MIXED), "--gres", str(job.tres_per_node)[5:]]
    argv += ["-C", job.features] if job.features else []
    text = CliRunner().invoke(cli, argv).stdout
    assert text.count("\n") == 1 and text.isprintable() is False and text[:-1].isprintable(), text
    answer = json.loads(CliRunner().invoke(cli, [*argv, "--json"]).stdout)
    assert answer["message"].isprintable() and not answer["ok"]
    assert answer["message"] == hooks["scoped"].run(replace(job, submit_uid=1000))[1]


# ------------------------------------------------------------------------------ cli_filter

CLI_HARNESS = r"""
LOG = {}
local function logger(kind)
  return function(fmt, ...) LOG[#LOG + 1] = { kind, string.format(fmt, ...) } end
end
slurm = { SUCCESS = 0, ERROR = -1, ESLURM_INVALID_GRES = 2072,
          log_info = logger("info"), log_error = logger("error"), log_debug = logger("debug"),
          log_verbose = logger("verbose") }
-- The options the user set, as the plugin's JSON: every option the test gives but those in
-- NOT_SET (srun reports an unset -n as "1", an unset -N as "1-0").
NOT_SET = {}
function slurm.json_cli_options(options)
  local parts = {}
  for name, value in pairs(options) do
    if not NOT_SET[name] then parts[#parts + 1] = string.format("%q:%q", name, value) end
  end
  return "{" .. table.concat(parts, ",") .. "}"
end
local real_open = io.open
-- The client's command line (/proc/self/cmdline: NUL-separated)
CMDLINE = "srun\0hostname\0"
function set_uid(uid, name)
  io.open = function(path, mode)
    if path == "/proc/self/cmdline" then
      return { read = function() return CMDLINE end, close = function() end }
    end
    if path ~= "/proc/self/status" then return real_open(path, mode) end
    local status = "Name:\t" .. (name or "srun") .. "\nUid:\t" .. uid .. "\t" .. uid .. "\n"
    return { read = function() return status end,
             close = function() end }
  end
end
-- The environment srun runs in (SLURM_* only; nothing leaks in from the test's own) and what
-- `scontrol show job` prints (SCONTROL: nil = scontrol fails); POPENED: the commands run.
ENV, SCONTROL, POPENED = {}, nil, {}
local real_getenv = os.getenv
os.getenv = function(name)
  if string.sub(name, 1, 6) == "SLURM_" then return ENV[name] end
  return real_getenv(name)
end
io.popen = function(command)
  POPENED[#POPENED + 1] = command
  local shown = SCONTROL or ""
  return { read = function() return shown end, close = function() end }
end
function pre_submit(options, offset)
  LOG = {}
  local rc = slurm_cli_pre_submit(options, offset or 0)
  return rc, options, LOG
end
"""


def install_cli_filter(directory: Path, srun_path: str | None = None, hook_path: str | None = None) -> Path:
    """cli_filter.lua and slurm_hetero_srun.lua rendered into `directory`; the filter's path."""
    (directory / CLI_SRUN_NAME).write_text(render_script(CLI_SRUN_NAME, hook_path=hook_path))
    path = directory / CLI_FILTER_NAME
    path.write_text(render_script(CLI_FILTER_NAME, srun_path=srun_path))
    return path


def load_cli_filter(path: Path, uid: int = 1000, client: str = "srun") -> Any:
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.execute(CLI_HARNESS)
    lua.globals().set_uid(uid, client)
    lua.globals().dofile(str(path))
    return lua


def cli_filter(config: Config, uid: int = 1000, client: str = "srun") -> Any:
    return load_cli_filter(install_cli_filter(config.directory), uid, client)


def run_cli(
    lua: Any, options: dict[str, str], unset: tuple[str, ...] = (), offset: int = 0
) -> tuple[int, dict[str, str], list[tuple[str, str]]]:
    """The filter on srun's options; `unset`: options srun reports that the user did not set;
    `offset`: the het component (cli_filter's pack_offset)."""
    lua.globals().NOT_SET = lua.table_from(dict.fromkeys(unset, True))
    rc, table, log = lua.globals().pre_submit(lua.table_from(options), offset)
    return int(rc), dict(table.items()), [(e[1], e[2]) for e in log.values()]


def _bare(text: str | None) -> str:
    return ",".join(re.sub(r"^gres[:/]", "", item) for item in (text or "").split(",") if item)


@pytest.mark.parametrize(
    ("config_name", "options"),
    [
        ("mixed", {"gres": "gres:gpumem:20G"}),
        ("mixed", {"gres": "gres/gpumem:20G"}),
        ("mixed", {"gres": "gpumem:70G", "nodes": "1"}),
        ("mixed", {"gres": "gres:gpumem:60G", "gpus": "2"}),
        ("mixed", {"gres": "gres:gpumem:20G", "gpus-per-task": "1", "ntasks": "2"}),
        ("second", {"gres": "gres:gpumem:10G"}),
        ("second", {"gres": "gres:gpumem:70G", "constraint": "ib"}),
    ],
)
def test_cli_filter_writes_the_hooks_decision_into_the_options(
    rendered: dict[str, Config], config_name: str, options: dict[str, str]
) -> None:
    config = rendered[config_name]
    job = job_from_options(
        gres=_bare(options["gres"]),
        gpus=options.get("gpus"),
        gpus_per_task=options.get("gpus-per-task"),
        constraint=options.get("constraint"),
        uid=1000,
        nodes=options.get("nodes"),
        ntasks=options.get("ntasks"),
        slurm_release="24.11" if options["gres"].startswith("gres/") else "22.05",
    )
    python = decided(config, job)
    assert python.ok and python.action == "rewrite", python
    rc, after, log = run_cli(cli_filter(config), options)
    assert rc == 0 and ("info", python.message) in log
    if python.job.tres_per_node is None:  # --gres emptied: a zero-count item Slurm skips
        assert re.fullmatch(r"gpu:(\w+:)?0", after["gres"]), after
    else:
        assert after["gres"] == _bare(python.job.tres_per_node)
    if "gpus" in options:
        assert after["gpus"] == _bare(python.job.tres_per_job).split("gpu:", 1)[1]
    assert after.get("constraint") == python.job.features


def test_cli_filter_leaves_refusals_and_what_it_cannot_say_to_the_hook(rendered: dict[str, Config]) -> None:
    lua = cli_filter(rendered["mixed"])
    # refusals are the hook's (its specific Slurm error is what the client prints last)
    assert run_cli(lua, {"gres": "gres:gpumem:900G"}) == (0, {"gres": "gres:gpumem:900G"}, [])
    for options in ({"gres": "gres:gpu:1"}, {}):
        assert run_cli(lua, options)[:2] == (0, options)
    root = cli_filter(rendered["mixed"], uid=0)  # exempt, as in the hook
    assert run_cli(root, {"gres": "gres:gpumem:20G"})[:2] == (0, {"gres": "gres:gpumem:20G"})


@pytest.mark.parametrize("client", ["sbatch", "salloc"])
def test_cli_filter_leaves_sbatch_and_salloc_to_the_hook(rendered: dict[str, Config], client: str) -> None:
    """The hook decides there and records why in the admin comment (the real-Slurm het job test
    found components the filter had rewritten without one)."""
    lua = cli_filter(rendered["mixed"], client=client)
    assert run_cli(lua, {"gres": "gres:gpumem:70G"}) == (0, {"gres": "gres:gpumem:70G"}, [])
    assert run_cli(cli_filter(rendered["mixed"]), {"gres": "gres:gpumem:70G"})[1]["gres"].startswith("gpu:")


@pytest.mark.parametrize("client", ["sbatch", "salloc"])
def test_cli_filter_returns_on_the_plugins_client_type_before_reading_any_file(
    rendered: dict[str, Config], client: str
) -> None:
    """Slurm's cli_filter/lua names the client in options.type (22.05, 24.11): sbatch and salloc
    return before /proc/self/status, slurm_hetero_srun.lua or the hook is read (bench_submit: the
    per-command cost)."""
    lua = cli_filter(rendered["mixed"], client="srun")  # /proc would say srun: type must win
    lua.execute("io.open = function() error('no file may be read') end; dofile = io.open")
    options = {"type": client, "gres": "gres:gpumem:70G"}
    assert run_cli(lua, options) == (0, options, [])
    srun = cli_filter(rendered["mixed"])
    assert run_cli(srun, {"type": "srun", "gres": "gres:gpumem:70G"})[1]["gres"].startswith("gpu:")


LOG_LOADS = (
    "LOADED = {}; local real_dofile = dofile; "
    "dofile = function(path) LOADED[#LOADED + 1] = path; return real_dofile(path) end"
)


@pytest.mark.parametrize(
    ("options", "env"),
    [
        ({}, {}),
        ({"gpus": "2", "constraint": "ib"}, {}),  # a new job, nothing named
        ({"gres": "gpu:a100_80g:1"}, {"SLURM_JOB_ID": "12"}),  # steps: only gpumem/gpucore matter
        ({"gpus": "2", "constraint": "ib"}, {"SLURM_JOB_ID": "12"}),
        ({"gres": "shard:2", "gpus-per-node": "1"}, {"SLURM_JOB_ID": "12"}),
        ({"nodelist": "a100n1", "gres": "gpu:1", "jobid": "12"}, {}),
        ({"gres": "(null)", "nodelist": "(null)", "jobid": "unset"}, {}),  # unset, as srun reads them
    ],
)
def test_srun_without_gpumem_or_gpucore_loads_nothing(
    rendered: dict[str, Config], options: dict[str, str], env: dict[str, str]
) -> None:
    """Requests the hook leaves alone are left alone without loading slurm_hetero_srun.lua: steps of
    an allocation without gpumem/gpucore, and new jobs that name neither a device nor hosts."""
    lua = cli_filter(rendered["mixed"])
    lua.globals().ENV = lua.table_from(env)
    lua.execute("io.open = function() error('no file may be read') end; dofile = io.open")
    options = {"type": "srun", **options}
    assert run_cli(lua, options) == (0, options, [])


@pytest.mark.parametrize(
    "options",
    [
        {"gres": "gpu:a100_80g:1"},
        {"gres": "gpu:1", "jobid": "unset"},  # srun reads an unset --jobid "unset": a new job
        {"nodelist": "a100n1"},
        {"gpus": "l40s:1", "nodes": "1"},
    ],
)
def test_a_new_job_srun_naming_a_device_or_hosts_loads_only_its_half(
    rendered: dict[str, Config], options: dict[str, str]
) -> None:
    """Without an allocation a het component that names a device or hosts is remembered for the
    next one (its nodes are taken): that needs the srun half, not the hook, and changes nothing."""
    lua = cli_filter(rendered["mixed"])
    lua.execute(LOG_LOADS)
    options = {"type": "srun", **options}
    assert run_cli(lua, options) == (0, options, [])
    assert [Path(p).name for p in lua.globals().LOADED.values()] == [CLI_SRUN_NAME]


@pytest.mark.parametrize("option", ["gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket"])
def test_srun_loads_its_half_for_gpumem_in_any_device_option(
    rendered: dict[str, Config], option: str
) -> None:
    """What the hook reads as a TRES item (a --gpus* value too) makes the filter load the decision."""
    lua = cli_filter(rendered["mixed"])
    lua.execute(LOG_LOADS)
    run_cli(lua, {"type": "srun", option: "gpumem:20G"})
    assert [Path(p).name for p in lua.globals().LOADED.values()][:2] == [CLI_SRUN_NAME, SCRIPT_NAME]


def test_the_cli_filter_stays_small() -> None:
    """Slurm's cli_filter/lua reads and compiles the whole file for every sbatch, salloc and srun:
    at 9 KB it cost 24.11's sbatch 6%, at 4 KB 3% (bench_submit); the srun half is loaded only when
    needed, so the filter holds the dispatch alone."""
    assert len(render_script(CLI_FILTER_NAME, srun_path=None).encode()) <= 3000


def test_the_wheel_ships_every_script_that_render_reads() -> None:
    """script_template() reads slurm_hetero/data/NAME in an installed package."""
    repo = Path(__file__).resolve().parents[2]
    names = {SCRIPT_NAME, CLI_FILTER_NAME, CLI_SRUN_NAME, CHAIN_TEMPLATE}
    assert {p.name for p in (repo / "job_submit").glob("*.lua")} == names
    pyproject = (repo / "pyproject.toml").read_text()
    for name in names:
        assert f'"job_submit/{name}" = "slurm_hetero/data/{name}"' in pyproject, name


def test_cli_filter_without_a_hook_file_changes_nothing(tmp_path: Path) -> None:
    lua = load_cli_filter(install_cli_filter(tmp_path))
    assert run_cli(lua, {"gres": "gres:gpumem:20G"})[:2] == (0, {"gres": "gres:gpumem:20G"})


def test_cli_filter_without_its_srun_half_changes_nothing(
    rendered: dict[str, Config], tmp_path: Path
) -> None:
    path = install_cli_filter(tmp_path, hook_path=str(rendered["mixed"].directory / SCRIPT_NAME))
    assert run_cli(load_cli_filter(path), {"gres": "gres:gpumem:20G"})[1]["gres"].startswith("gpu:")
    (tmp_path / CLI_SRUN_NAME).unlink()
    rc, options, log = run_cli(load_cli_filter(path), {"gres": "gres:gpumem:20G"})
    assert (rc, options) == (0, {"gres": "gres:gpumem:20G"}) and log and log[0][0] == "debug", log


def test_render_bakes_the_srun_and_hook_paths(rendered: dict[str, Config], tmp_path: Path) -> None:
    """--srun-path and --hook-path: the three client-side files need not sit side by side."""
    elsewhere = tmp_path / "lib"
    elsewhere.mkdir()
    srun = elsewhere / "srun-half.lua"
    hook = rendered["mixed"].directory / SCRIPT_NAME
    out = tmp_path / "etc"
    args = ["job-submit", "render", "--inventory", str(MIXED), "--out", str(out)]
    result = CliRunner().invoke(cli, [*args, "--srun-path", str(srun), "--hook-path", str(hook)])
    assert result.exit_code == 0, result.output
    (out / CLI_SRUN_NAME).rename(srun)
    (out / SCRIPT_NAME).unlink()
    rc, options, _ = run_cli(load_cli_filter(out / CLI_FILTER_NAME), {"gres": "gres:gpumem:20G"})
    assert rc == 0 and options["gres"].startswith("gpu:"), options


# --------------------------------------------- what sbatch sends (found by the real-Slurm fuzz)

# (options, release) -> (min_nodes, num_tasks, ntasks_per_node) that a probe job_submit.lua printed
# on the dev cluster (docs/submit-protocol.md); None where the job_desc holds NO_VAL/NO_VAL16.
SBATCH_SENDS = [
    ({"ntasks": 4, "per_task": True}, "22.05", (None, 4, None)),
    ({"nodes": 2, "per_task": True}, "22.05", (2, 2, None)),
    ({"nodes": 2, "per_task": True}, "24.11", (2, 2, None)),
    ({"nodes": 2, "ntasks_per_node": 2, "per_task": True}, "24.11", (2, 4, 2)),
    ({"ntasks_per_node": 2, "per_task": True}, "22.05", (None, 2, 2)),
    ({"nodes": 3, "ntasks": 2, "per_task": True}, "22.05", (2, 2, None)),
    ({"nodes": 3, "ntasks": 1, "per_task": True}, "24.11", (1, 1, None)),
    ({"nodes": 2, "ntasks": 1, "job_total": True}, "22.05", (1, 1, None)),
    ({"nodes": 2, "ntasks_per_node": 2}, "22.05", (2, 4, 2)),
    ({"nodes": 2, "ntasks_per_node": 2}, "24.11", (2, None, 2)),
    ({"ntasks_per_node": 2}, "22.05", (None, 2, 2)),
    ({"ntasks_per_node": 2}, "24.11", (None, None, 2)),
    ({"ntasks": 4, "ntasks_per_node": 2, "per_task": True}, "22.05", (None, 4, 2)),
    ({"ntasks": 4, "ntasks_per_node": 2, "per_task": True}, "24.11", (2, 4, 2)),
    ({"ntasks": 3, "ntasks_per_node": 2}, "24.11", (2, 3, 2)),
    ({"nodes": 2}, "24.11", (2, None, None)),
    ({"ntasks": 2, "ntasks_per_node": 1, "hosts_named": True}, "24.11", (None, 2, 1)),  # -w counts first
]


@pytest.mark.parametrize(("options", "release", "sent"), SBATCH_SENDS)
def test_job_from_options_holds_what_sbatch_sends(options: dict[str, Any], release: str, sent: tuple) -> None:
    args = {"nodes": None, "ntasks": None, "ntasks_per_node": None, "per_task": False, "job_total": False}
    assert sbatch_counts(**(args | options), slurm_release=release) == sent


@pytest.mark.parametrize(
    ("options", "release", "fields"),
    [
        ({"nodes": "1", "cpus_per_task": "9"}, "24.11", {"tres_per_task": "cpu=9", "cpus_per_task": 9}),
        ({"nodes": "1", "cpus_per_task": "9"}, "22.05", {"tres_per_task": None, "cpus_per_task": 9}),
        (
            {"ntasks": "2", "gpus_per_task": "1", "cpus_per_task": "2"},
            "24.11",
            {"tres_per_task": "cpu=2,gres/gpu=1"},
        ),
        (
            {"gpus": "2", "cpus_per_gpu": "8", "mem_per_gpu": "10G"},
            "22.05",
            {"cpus_per_tres": "gres:gpu:8", "mem_per_tres": "gres:gpu:10240", "min_mem_per_node": None},
        ),
        ({"mem": "2000"}, "22.05", {"min_mem_per_node": 2000, "min_mem_per_cpu": None}),
        ({"mem_per_cpu": "1G"}, "22.05", {"min_mem_per_node": None, "min_mem_per_cpu": 1024}),
        ({"mem": "8796093022208T"}, "24.11", {"min_mem_per_node": None, "min_mem_per_cpu": 0}),  # 2^63
        ({"mem": "10GB"}, "24.11", {"min_mem_per_node": 10240, "min_mem_per_cpu": None}),
        ({"mem": "2049K"}, "24.11", {"min_mem_per_node": 3, "min_mem_per_cpu": None}),  # rounded up
        ({"overcommit": "yes", "ntasks": "32", "nodes": "2"}, "22.05", {"min_cpus": 2, "pn_min_cpus": None}),
        ({"mincpus": "6", "cpus_per_task": "8"}, "22.05", {"pn_min_cpus": 8}),  # sbatch raises it to -c
        ({"mincpus": "65537"}, "24.11", {"pn_min_cpus": 1}),  # 16 bits
        (
            {"nodes": "2", "nodelist": "a100n1", "exclude": "l40sn1"},
            "24.11",
            {"req_nodes": "a100n1", "max_nodes": 2},
        ),
    ],
)
def test_job_from_options_holds_the_node_fields_sbatch_sends(
    options: dict[str, Any], release: str, fields: dict[str, Any]
) -> None:
    """-c, --cpus-per-gpu, --mem*, -w, -N's max as the hook reads them (24.11 also writes -c into
    tres_per_task: the stored TresPerTask=cpu=9 of `-N1 -c 9` on the real 24.11)."""
    job = job_from_options(gres="gpumem:20G", slurm_release=release, **options)
    assert {name: getattr(job, name) for name in fields} == fields


@pytest.mark.parametrize("release", ["22.05", "24.11"])
def test_gpus_per_task_without_a_task_count_is_sbatchs_refusal(release: str) -> None:
    """The fuzz read sbatch's own refusal of `--gres=gpumem:20g --gpus-per-task=2` as the hook's."""
    with pytest.raises(RequestError, match="--gpus-per-task .*used without either --gpus or -n/--ntasks"):
        job_from_options(gres="gpumem:20g", gpus_per_task="2", slurm_release=release)
    extra = {"ntasks_per_node": "2"} if release == "22.05" else {"nodes": "2"}
    assert job_from_options(gres="gpumem:20g", gpus_per_task="2", slurm_release=release, **extra).num_tasks


def test_24_11_per_task_count_comes_in_the_equals_form(
    rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    job = job_from_options(gres="gpumem:20G", gpus_per_task="1", ntasks="2", uid=1000, slurm_release="24.11")
    assert job.tres_per_task == "gres/gpu=1"  # as 24.11's sbatch sends it
    ok, _, after = hooked(rendered["mixed"], hooks["mixed"], job)
    assert ok and after.tres_per_task and after.tres_per_task.startswith("gres/gpu:")


def test_more_nodes_than_tasks_is_decided_on_the_lowered_node_count(
    rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    """`-N3 -n1 --gpus-per-node=2` reaches the hook as min_nodes 1 (the fuzz predicted 3 and a
    rejection; the hook accepted)."""
    job = job_from_options(gres="gpumem:10G", gpus_per_node="2", nodes="3", ntasks="1", uid=1000)
    assert (job.min_nodes, job.num_tasks) == (1, 1)
    assert hooked(rendered["mixed"], hooks["mixed"], job)[0]
    # srun lowers -N3 to -n1 too: the filter decides on one node (srun's own check keeps -N3 at 1)
    options = {"gres": "gres:gpumem:10G", "gpus-per-node": "2", "nodes": "3", "ntasks": "1"}
    python = decided(rendered["mixed"], job)
    rc, after, log = run_cli(cli_filter(rendered["mixed"]), options)
    assert (rc, after["nodes"], log) == (0, "3", [("info", python.message)])
    # without slurm.json_cli_options the client cannot tell -N3 from -N3 -n1 (an unset -n reads
    # "1"): the filter leaves it to the hook
    lua = cli_filter(rendered["mixed"])
    lua.execute("slurm.json_cli_options = nil")
    assert run_cli(lua, options)[:2] == (0, options)


@pytest.mark.parametrize("gres", ["gpumem:10G", "gpucore:30", "gpumem:10G,gpucore:50", "gpumem:1G"])
def test_a_shard_request_the_cli_filter_rewrote_is_decided_again_to_the_same(
    rendered: dict[str, Config], hooks: dict[str, Hook], gres: str
) -> None:
    """The fuzz stored `gres:shard:3,gres:shard:3,gres:gpumem:10G`: cli_filter.lua wrote
    `shard:3,gpumem:10G` and constraint t4 into the options, and the hook, seeing gpumem again,
    added a second shard item (and `t4&t4`)."""
    config, hook = rendered["second"], hooks["second"]
    direct = decided(config, job_from_options(gres=gres, uid=1000))
    assert kind_of(direct) == "shard"
    rc, options, _ = run_cli(cli_filter(config), {"gres": f"gres:{gres}"})
    assert rc == 0 and options["gres"] == _bare(direct.job.tres_per_node)
    filtered = job_from_options(gres=options["gres"], constraint=options.get("constraint"), uid=1000)
    ok, _, after = hooked(config, hook, filtered)
    assert ok and (after.tres_per_node, after.features) == (direct.job.tres_per_node, direct.job.features)


def test_cpus_per_gpu_keeps_a_request_below_a_device_on_whole_devices(
    rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    """22.05 fuzz seed 20261126: `--gres=gpumem:10G --cpus-per-gpu=8` was rewritten to shards and
    slurmctld refused the job (Invalid generic resource: cpus_per_tres names gpu, the job has
    none); a per-gpu CPU or memory field now keeps the hook and explain on whole devices (24.11's
    sbatch refuses --cpus-per-gpu without a gpu item itself)."""
    config, hook = rendered["second"], hooks["second"]
    plain = decided(config, job_from_options(gres="gpumem:1G", uid=1000))
    assert kind_of(plain) == "shard"
    job = job_from_options(gres="gpumem:1G", uid=1000, cpus_per_gpu="8")
    for sent in (job, replace(job, cpus_per_tres=None, mem_per_tres="gres:gpu:1024")):
        ok, message, after = hooked(config, hook, sent)
        assert ok and "shard" not in (after.tres_per_node or ""), message


@pytest.mark.parametrize(
    ("per_gpu", "edit"),
    [
        ({"cpus_per_tres": "gres:gpu:2"}, "gres:gpumem:512"),  # 22.05: --cpus-per-gpu without a gpu
        ({"mem_per_tres": "gres:gpu:1024"}, "gres:gpumem:512"),
        ({"cpus_per_tres": "gres/gpu:2", "mem_per_tres": "gres/gpu:1024"}, "gres/gpumem:512"),  # 24.11 form
    ],
)
def test_a_gpumem_edit_of_a_job_with_cpus_or_memory_per_gpu_gets_whole_devices(
    rendered: dict[str, Config], hooks: dict[str, Hook], per_gpu: dict[str, str], edit: str
) -> None:
    """22.05 fuzz (seed 20261127): a job submitted with --cpus-per-gpu and no gpu (22.05 accepts
    it), edited as its user to `gres=gpumem:512`, was rewritten to shards by the hook and its twin,
    and slurmctld refused the update (shards beside cpus_per_tres / mem_per_tres). slurm_job_modify's
    job_rec carries both fields (both releases, dev cluster): the edit view reads them, so the edit
    gets whole devices exactly as a submission does."""
    config, hook = rendered["second"], hooks["second"]
    change = Job(tres_per_node=edit, submit_uid=1000)
    plain = decided_edit(config, change, Job(user_id=1000))
    assert kind_of(plain) == "shard"  # without per-gpu fields: shards
    record = Job(user_id=1000, **per_gpu)
    python = decided_edit(config, change, record)
    assert kind_of(python) != "shard", python
    ok, message, after = hooked_edit(hook, change, record)
    assert ok and "shard" not in (after.tres_per_node or ""), (message, after)


def test_an_edit_of_a_job_with_devices_stays_on_whole_devices(
    rendered: dict[str, Config], hooks: dict[str, Hook]
) -> None:
    """Slurm 22.05 refuses `scontrol update gres=...` from a gpu request to shards (found by the
    real-Slurm fuzz: the hook chose shard:8 for gpumem:30G and slurmctld answered "Invalid generic
    resource"); a job that was shards may be edited to shards."""
    config, hook = rendered["second"], hooks["second"]
    edit = Job(tres_per_node="gres:gpumem:10G", submit_uid=1000)
    # untyped stays untyped (22.05: "with and without type identification"), the type in -C
    mixed = decided_edit(rendered["mixed"], edit, Job(tres_per_node="gres:gpu:1"))
    assert mixed.job.tres_per_node == "gres:gpu:1" and mixed.job.features == "l40s", mixed
    assert hooked_edit(hooks["mixed"], edit, Job(tres_per_node="gres:gpu:1", user_id=1000))[0]
    for record, kind in [
        (Job(tres_per_node="gres:gpu:1", user_id=1000), False),
        (Job(tres_per_node="gres:gpu:t4:1", user_id=1000, admin_comment="slurm_hetero: x"), False),
        (Job(tres_per_node="gres:shard:5,gres:gpumem:20G", features="t4", user_id=1000), True),
    ]:
        python = decided_edit(config, edit, record)
        assert (kind_of(python) == "shard") == kind, (record, python)
        assert hooked_edit(hook, edit, record)[0]
    # a job on shards stays on shards: an edit to whole devices is refused with the reason
    shards = Job(tres_per_node="gres:shard:5,gres:gpumem:20G", features="t4", user_id=1000)
    two = Job(tres_per_node="gres:gpumem:10G,gres:gpu:2", submit_uid=1000)
    ok, message, _ = hooked_edit(hook, two, shards)
    assert not ok and message == "gpumem:10G,gpu:2: " + MESSAGES["edit_shards"]


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ({"gres": "gpumem:1G,gpu:t4:2", "gpus_per_node": "1"}, "with and without type identification"),
        ({"gres": "gpumem:1G,gpu:t4:2", "gpus": "4"}, "with and without type identification"),
        ({"gres": "gpumem:1G,gpu:3", "gpus_per_task": "2", "ntasks": "1"}, "not multiple of --gpus-per-task"),
        ({"gres": "gpumem:1G,gpu:3", "gpus": "4"}, "--gpus is not multiple of"),
        ({"gres": "gpumem:1G", "gpus": "1", "nodes": "3"}, "--gpus < -N"),
        # the order sbatch checks in (both releases): ensure, task count, the rest
        ({"gres": "gpu:1", "gpus_per_task": "2"}, "Failed to ensure --gpus >= --gpus-per-task"),
        ({"gres": "gpu:3", "gpus_per_task": "2"}, "used without either --gpus or -n/--ntasks"),
    ],
)
def test_sbatchs_own_gpu_refusals(options: dict[str, Any], refusal: str) -> None:
    with pytest.raises(RequestError, match=re.escape(refusal)):
        job_from_options(**options)
    if "nodes" in options:  # -N is first lowered to the task count: then --gpus covers it
        assert job_from_options(**options, ntasks="1").min_nodes == 1


@pytest.mark.parametrize("release", ["22.05", "24.11"])
@pytest.mark.parametrize(
    "options",
    [
        ["--gres", "gpumem:60G", "--gpus-per-node", "2"],  # the issue: worded differently from the hook
        ["--gres", "gpumem:900G", "--gpus-per-node", "1"],
        ["--gres", "gpumem:20G", "--gpus-per-task", "1", "-n", "4"],
        ["--gres", "gpumem:20G", "-N", "3", "-n", "1", "--gpus-per-node", "2"],
        ["--gres", "gpumem:20G", "-C", "ib|nosuch"],
        ["--gres", "gpumem:20G", "-N", "9"],
    ],
    ids=lambda o: " ".join(o) if isinstance(o, list) else o,
)
def test_request_explain_prints_the_hooks_own_words(
    rendered: dict[str, Config],
    hooks: dict[str, Hook],
    options: list[str],
    release: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Item 8: the command's message is the hook's, byte for byte, on the job_desc that sbatch of
    the release sends for the same options."""
    import json

    monkeypatch.setenv("SLURM_HETERO_CONFIG", "/dev/null")
    argv = ["request", "explain", "--inventory", str(MIXED), *options, "--slurm-release", release, "--json"]
    answer = json.loads(CliRunner().invoke(cli, argv).stdout)
    flags = dict(zip(options[::2], options[1::2]))
    names = {
        "--gres": "gres",
        "--gpus-per-node": "gpus_per_node",
        "--gpus-per-task": "gpus_per_task",
        "-C": "constraint",
        "-N": "nodes",
        "-n": "ntasks",
    }
    job = job_from_options(**{names[k]: v for k, v in flags.items() if k in names}, slurm_release=release)
    ok, message, _, _ = hooks["scoped"].run(job)  # the command reads the default settings
    assert (ok, message) == (answer["ok"], answer["message"])
    assert message and not message.startswith("slurm-hetero")


@pytest.mark.parametrize("depth", [2, 20, 500, 5000])
def test_deeply_nested_constraint_is_one_refusal_in_hooked(
    rendered: dict[str, Config], hooks: dict[str, Hook], depth: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 10: 500 levels of parentheses crashed `request explain` (RecursionError) while the
    hook passed them on to slurmctld, which refuses any `(` inside parentheses ("Invalid feature
    specification", measured at 20 levels on 22.05)."""
    import json

    features = "(" * depth + "ib" + ")" * depth
    job = Job(tres_per_node="gres:gpumem:20G", features=features, submit_uid=1000)
    ok, message, _ = hooked(rendered["mixed"], hooks["mixed"], job)
    assert not ok and message == f"--constraint={features}: " + MESSAGES["constraint_deep"] % 1
    monkeypatch.setenv("SLURM_HETERO_CONFIG", "/dev/null")
    argv = ["request", "explain", "--inventory", str(MIXED), "--gres", "gpumem:20G", "-C", features, "--json"]
    answer = json.loads(CliRunner().invoke(cli, argv).stdout)
    assert (answer["ok"], answer["message"], answer["code"]) == (False, message, "ESLURM_INVALID_FEATURE")


# Issue 10: srun without an allocation, the count in another option than the gpumem item. The
# hook rewrote the job and the step kept gpumem: on 22.05 "Step requested GRES (gpumem:(null)) not
# found in the job" after allocating; on 24.11 --gpus-per-node gave "Invalid GRES specification
# (with and without type identification)". An option cannot be unset from the filter: --gres gets a
# zero-count gpu item, which Slurm skips (measured on both: the step gets the job's devices).
SRUN_SPLIT = [
    ({"gpus": "2"}, {"gpus": "a100_80g:2"}),
    ({"ntasks": "4", "gpus-per-task": "1"}, {"gpus-per-task": "a100_80g:1"}),
    ({"gpus-per-node": "2"}, {"gpus-per-node": "a100_80g:2"}),
]


@pytest.mark.parametrize("prefix", ["gres:", "gres/"])
@pytest.mark.parametrize(("options", "written"), SRUN_SPLIT)
def test_srun_carries_the_decision_into_the_step_when_the_count_is_elsewhere(
    rendered: dict[str, Config], options: dict[str, str], written: dict[str, str], prefix: str
) -> None:
    given = {"gres": f"{prefix}gpumem:20G", **options}
    rc, after, log = run_cli(cli_filter(rendered["scoped"]), given)  # the dev cluster's settings
    # -N unset: the node count the hook pins (devices per task or job) goes into the options too
    # (it never sees the gpumem); a per-node count is not pinned
    pinned = {} if "gpus-per-node" in options else {"nodes": "1"}
    assert rc == 0 and after == {**given, **written, "gres": "gpu:a100_80g:0", **pinned}, log
    assert [kind for kind, _ in log] == ["info"]
    # what srun then sends: the hook leaves it alone (no gpumem), sbatch's reading skips the 0
    release = "22.05" if prefix == "gres:" else "24.11"
    job = job_from_options(
        gres=after["gres"],
        gpus=after.get("gpus"),
        gpus_per_node=after.get("gpus-per-node"),
        gpus_per_task=after.get("gpus-per-task"),
        ntasks=after.get("ntasks"),
        uid=1000,
        slurm_release=release,
    )
    assert decided(rendered["scoped"], job).action == "untouched"


def test_srun_refuses_what_its_options_cannot_carry(tmp_path: Path) -> None:
    """Two gpu items where --gpus holds one (a hook that decides so): refused with the options to
    ask instead, rather than a job whose step fails."""
    real = tmp_path / "real_job_submit.lua"  # the module's readers; its decision replaced
    real.write_text(script_template())
    hook = tmp_path / "job_submit.lua"
    hook.write_text(
        f"dofile('{real}')\n"
        "function slurm_hetero_hook.submit(job, part, uid)\n"
        '  job.tres_per_node = ""\n'
        '  job.tres_per_job = "gres:gpu:a100_80g:2,gres:gpu:l40s:1"\n'
        '  slurm.log_user("%s", "gpumem:20G,gpu:2 -> two")\n'
        "  return slurm.SUCCESS\n"
        "end\n"
    )
    lua = load_cli_filter(install_cli_filter(tmp_path, hook_path=str(hook)))
    given = {"gres": "gres:gpumem:20G", "gpus": "2"}
    rc, after, log = run_cli(lua, given)
    assert (rc, after) == (-1, given)
    assert log == [
        (
            "error",
            "gpumem:20G,gpu:2 -> two; srun cannot give the job step these devices with these options: "
            "ask --gpus=a100_80g:2,l40s:1 instead",
        )
    ]


def test_srun_per_node_count_with_other_gres_items_needs_no_clearing(rendered: dict[str, Config]) -> None:
    """--gpus-per-node takes the gpu item and --gres keeps the other items, on either release."""
    for pre in ("gres:", "gres/"):
        given = {"gres": f"{pre}gpumem:20G,{pre}mps:10", "gpus-per-node": "2"}
        rc, after, log = run_cli(cli_filter(rendered["scoped"]), given)
        assert (rc, after) == (0, {"gres": "mps:10", "gpus-per-node": "a100_80g:2"}), log


# Issue 10 follow-up: srun's half ignored -w/-x, -c and --mem*, so srun rewrote jobs the hook
# refuses (-w with gpumem) or chose a type whose nodes cannot hold the job; the job then reached
# the hook without gpumem and ran there. Each case: the srun options and the job_desc srun sends.
SRUN_NODE_FIELDS = [
    ({"nodelist": "a100n1"}, {"req_nodes": "a100n1"}),
    ({"exclude": "l40sn1"}, {"exc_nodes": "l40sn1"}),
    ({"cpus-per-task": "12"}, {"cpus_per_task": 12}),
    ({"cpus-per-task": "20"}, {"cpus_per_task": 20}),
    ({"mem": "16G"}, {"min_mem_per_node": 16384}),
    ({"mem-per-cpu": "3000", "ntasks": "8"}, {"min_mem_per_cpu": 3000, "num_tasks": 8}),
    ({"mem-per-gpu": "20G", "gpus": "1"}, {"mem_per_tres": "gres:gpu:20480", "tres_per_job": "gres:gpu:1"}),
    ({"cpus-per-gpu": "12", "gpus": "1"}, {"cpus_per_tres": "gres:gpu:12", "tres_per_job": "gres:gpu:1"}),
    ({"mincpus": "12"}, {"pn_min_cpus": 12}),  # adversarial (stop 29): ignored, pended BadConstraints
]


@pytest.mark.parametrize(
    ("options", "sent"), SRUN_NODE_FIELDS, ids=lambda o: ",".join(o) if isinstance(o, dict) else o
)
def test_srun_decides_with_the_node_options_as_the_hook_does(
    rendered: dict[str, Config], hooks: dict[str, Hook], options: dict[str, str], sent: dict[str, Any]
) -> None:
    """The filter's decision is the hook's on the job srun sends: the same refusal (left to the
    hook, which then refuses with the message and its Slurm error) or the same rewrite."""
    config = rendered["mixed"]
    given = {"gres": "gres:gpumem:20G", **options}
    job = Job(tres_per_node="gres:gpumem:20G", submit_uid=1000, user_id=1000, **sent)
    python = decided(config, job)
    plain = decided(config, replace(job, **{k: None for k in sent if not k.startswith("tres_per")}))
    assert (python.ok, python.message) != (plain.ok, plain.message)  # the option decides
    assert hooked(config, hooks["mixed"], job)[:2] == (python.ok, python.message)
    rc, after, log = run_cli(cli_filter(config), given)
    if not python.ok:
        assert (rc, after, log) == (0, given, [])
        return
    assert rc == 0 and log == [("info", python.message)]
    assert f"gpu:{type_of(python)}:" in after["gres"] + after.get("gpus", "")


def test_srun_overcommit_takes_one_tasks_cpus_a_node_as_the_hook_does(rendered: dict[str, Config]) -> None:
    """Adversarial (stop 29): `srun -O -n 32 --gres=gpumem:20G` was refused for 32 CPUs a node;
    Slurm allocates one task's CPUs a node for -O (srun sends min_cpus = the nodes)."""
    config = rendered["mixed"]
    given = {"gres": "gres:gpumem:20G", "ntasks": "32"}
    rc, after, log = run_cli(cli_filter(config), given)
    assert (rc, after, log) == (0, given, [])  # 32 CPUs a node: no type, left to the hook
    rc, after, log = run_cli(cli_filter(config), {**given, "overcommit": "set"})
    assert rc == 0 and after["gres"].startswith("gpu:l40s:") and log[0][0] == "info", (after, log)


@pytest.mark.parametrize(
    ("options", "unset", "nodes"),
    [
        ({"nodes": "2", "ntasks": "1"}, ("ntasks",), 2),  # srun -N2: one task per node, num_tasks unset
        ({"nodes": "2-2", "ntasks": "1"}, ("ntasks",), 2),
        ({"nodes": "1-0", "ntasks": "4", "gpus-per-task": "1"}, ("nodes",), 1),  # the hook pins one node
    ],
)
def test_srun_without_n_is_decided_on_its_node_count_and_pins_it(
    rendered: dict[str, Config],
    hooks: dict[str, Hook],
    options: dict[str, str],
    unset: tuple[str, ...],
    nodes: int,
) -> None:
    """`srun -N2 --gres=gpumem:20G cmd` (no -n) kept gpumem in the step: the filter could not tell
    -N2 from -N2 -n1 and left the job to the hook, which rewrote only the job. The options the user
    set (slurm.json_cli_options) tell; the node count the hook assumes goes into --nodes when -N was
    not given (the hook never sees this gpumem, so it pins nothing)."""
    config = rendered["second"]  # two h100 nodes, four l40s
    given = {"gres": "gres:gpumem:20G", **options}
    sent = {"min_nodes": nodes, "max_nodes": nodes} if "nodes" not in unset else {}
    if "ntasks" not in unset:
        sent["num_tasks"] = int(options["ntasks"])
    if "gpus-per-task" in options:
        sent["tres_per_task"] = "gres:gpu:" + options["gpus-per-task"]
    job = Job(tres_per_node="gres:gpumem:20G", submit_uid=1000, user_id=1000, **sent)
    python = decided(config, job)
    assert python.ok and python.action == "rewrite" and hooked(config, hooks["second"], job)[0], python
    rc, after, log = run_cli(cli_filter(config), given, unset)
    assert rc == 0 and log == [("info", python.message)], log
    gres = re.escape(_bare(python.job.tres_per_node)) or r"gpu:(\w+:)?0"  # emptied: a zero-count item
    assert re.fullmatch(gres, after["gres"]) and after["nodes"].split("-")[0] == str(python.job.min_nodes)
    assert python.job.min_nodes == nodes


def test_srun_without_n_or_N_and_a_per_node_count_pins_no_node_count(rendered: dict[str, Config]) -> None:
    """Devices per node hold on any node count: srun leaves -N to Slurm (one node pinned makes
    Slurm want every task's cores there, refusing `-O -n 32` with gres on 8 CPUs)."""
    given = {"gres": "gres:gpumem:20G", "nodes": "1-0", "ntasks": "1"}
    rc, after, log = run_cli(cli_filter(rendered["second"]), given, ("nodes", "ntasks"))
    assert rc == 0 and after["nodes"] == "1-0" and log[0][0] == "info", (after, log)


@pytest.mark.parametrize(("ntasks", "accepted"), [(2, False), (3, False), (1, True)])
def test_a_job_total_below_the_nodes_the_job_spans_is_refused(
    rendered: dict[str, Config], hooks: dict[str, Hook], ntasks: int, accepted: bool
) -> None:
    """22.05 fuzz seed 7: `gpumem:1G --gpus=1 -n2 --ntasks-per-node=1 -p gaudi,nvidia` was rewritten
    to `gpu:l40s:1` (tres_per_job) with min_nodes pinned to the 2 nodes the tasks span, and slurmctld
    refused it (gres.c: gres_per_job < min_nodes, "Invalid generic resource"; 24.11's sbatch refuses
    it itself, --gpus < -N). Refused with the reason, Python and Lua alike."""
    config, hook = rendered["mixed"], hooks["mixed"]
    job = job_from_options(gres="gpumem:1G", gpus="1", ntasks=str(ntasks), ntasks_per_node="1", uid=1000)
    # (mixed.yaml has no gaudi partition, which the hook now refuses: the same list of known ones)
    ok, message, _ = hooked(config, hook, replace(job, partition="nvidia,ascend"))
    assert ok == accepted, message
    if not ok:
        assert message == f"gpumem:1G,gpu:1: {MESSAGES['job_total'] % (1, ntasks, ntasks)}", message


# Issue 21 item 2: srun inside an allocation makes a step, not a job: its devices are the job's.
# The filter once decided steps as new jobs (issue 10 item 5: `-> gres/gpu:a100_80g:1` in an l40s
# allocation, then "Invalid generic resource"), then among the job's devices (release quirks, counts
# per node, per task and in all, -w/-x, inherited counts: half of slurm_hetero_srun.lua). Now
# gpumem/gpucore in a step is refused in one line naming what the job holds and the count to ask.
def _shown_nodes(job_id: str, held: dict[str, int]) -> str:
    """`scontrol show job -d -o` of a running job on one node per type, `held[type]` devices each
    (the fields the filter reads, as 22.05 and 24.11 print them)."""
    nodes = "".join(
        f"Nodes={gpu_type}n1 CPU_IDs=0 Mem=500 GRES=gpu:{gpu_type}:{n}(IDX:0-{n - 1}) "
        for gpu_type, n in held.items()
    )
    total = ",".join(f"gpu:{gpu_type}:{n}" for gpu_type, n in held.items())
    head = f"JobId={job_id} JobName=sh JobState=RUNNING NumNodes={len(held)} JOB_GRES={total}   "
    return f"{head}{nodes}MinCPUsNode=1 TresPerNode=gres/gpumem:20G\n"


def _in_allocation(lua: Any, shown: str | None, env: dict[str, str] | None = None) -> None:
    lua.globals().ENV = lua.table_from(env if env is not None else {"SLURM_JOB_ID": "12"})
    lua.globals().SCONTROL = shown


@pytest.mark.parametrize(
    ("held", "options", "asked", "holds", "count"),
    [
        ({"a100_80g": 2}, {"gres": "gres:gpumem:10G"}, "gpumem:10G", "gpu:a100_80g:2 on a100_80gn1", 2),
        ({"l40s": 1}, {"gres": "gres/gpumem:70G"}, "gpumem:70G", "gpu:l40s:1 on l40sn1", 1),
        (  # every device option named, as the hook reads them; the fewest any node holds
            {"a100_80g": 2, "l40s": 1},
            {"gres": "gres/gpumem:abc", "gpus": "2", "nodelist": "l40sn1"},
            "gpumem:abc,gpu:2",
            "gpu:a100_80g:2 on a100_80gn1, gpu:l40s:1 on l40sn1",
            1,
        ),
        (
            {"l40s": 1},
            {"gres": "gres/gpucore:50", "gpus-per-task": "1"},
            "gpucore:50,gpu:1",
            "gpu:l40s:1 on l40sn1",
            1,
        ),
    ],
)
def test_gpumem_in_a_step_is_refused_naming_what_the_job_holds(
    rendered: dict[str, Config],
    held: dict[str, int],
    options: dict[str, str],
    asked: str,
    holds: str,
    count: int,
) -> None:
    lua = cli_filter(rendered["scoped"])
    _in_allocation(lua, _shown_nodes("12", held))
    rc, after, log = run_cli(lua, options)
    assert (rc, after) == (-1, options)
    assert log == [
        (
            "error",
            f"{asked}: this srun is a step of job 12, which holds {holds}; gpumem/gpucore choose a new "
            f"job's devices and a step gets its job's: ask --gres=gpu:N (N up to {count} per node), or leave "
            "the device options out for all of them",
        )
    ]
    assert list(lua.globals().POPENED.values()) == ["scontrol show job -d -o 12 2>&1"]


def test_a_step_without_gpumem_reads_nothing(rendered: dict[str, Config]) -> None:
    lua = cli_filter(rendered["scoped"])
    _in_allocation(lua, _shown_nodes("12", {"l40s": 1}))
    given = {"gres": "gres/gpu:1"}
    assert run_cli(lua, given) == (0, given, [])
    assert list(lua.globals().POPENED.values()) == []


@pytest.mark.parametrize(
    ("shown", "why"),
    [
        (  # scontrol failed
            None,
            " and slurm-hetero cannot read which devices it holds; ask for that job's devices instead "
            "(--gres=gpu:N)",
        ),
        (  # another job
            "JobId=123 JobName=other\n",
            " and slurm-hetero cannot read which devices it holds; ask for that job's devices instead "
            "(--gres=gpu:N)",
        ),
        (
            "JobId=12 JobName=sh JobState=RUNNING   Nodes=n1 CPU_IDs=0 GRES=shard:5(IDX:0) MinCPUsNode=1\n",
            ", which holds no gpu devices; a step gets devices only from its job (ask for them with "
            "salloc or sbatch)",
        ),
    ],
)
def test_srun_in_an_allocation_whose_devices_are_unknown_is_refused(
    rendered: dict[str, Config], shown: str | None, why: str
) -> None:
    lua = cli_filter(rendered["scoped"])
    _in_allocation(lua, shown)
    given = {"gres": "gres:gpumem:10G"}
    rc, after, log = run_cli(lua, given)
    assert (rc, after) == (-1, given)
    assert log == [("error", f"gpumem:10G: this srun is a step of job 12{why}")]


def test_srun_in_a_job_that_does_not_exist_is_left_to_srun(rendered: dict[str, Config]) -> None:
    """Adversarial round 6, D07b: `srun --jobid=99999 --gres=gpumem:20G` was refused "slurm-hetero cannot
    read which devices it holds; ask --gres=gpu:N", hiding srun's own "Invalid job id specified"."""
    lua = cli_filter(rendered["scoped"])
    _in_allocation(lua, "slurm_load_jobs error: Invalid job id specified\n", env={})
    given = {"gres": "gres/gpumem:20G", "jobid": "99999"}
    assert run_cli(lua, given) == (0, given, [])


def test_srun_with_jobid_is_a_step_of_that_job_and_only_its_digits_reach_scontrol(
    rendered: dict[str, Config],
) -> None:
    lua = cli_filter(rendered["scoped"])
    _in_allocation(lua, _shown_nodes("77", {"a100_80g": 1}), env={})
    rc, _, log = run_cli(lua, {"gres": "gres/gpumem:10G", "jobid": "77; touch /tmp/x"})
    assert rc == -1 and "step of job 77, which holds gpu:a100_80g:1 on a100_80gn1" in log[0][1], log
    assert list(lua.globals().POPENED.values()) == ["scontrol show job -d -o 77 2>&1"]


def test_exempt_srun_in_an_allocation_is_left_alone(rendered: dict[str, Config]) -> None:
    lua = load_cli_filter(install_cli_filter(rendered["scoped"].directory), uid=0)
    _in_allocation(lua, None)
    given = {"gres": "gres/gpumem:10G"}
    assert run_cli(lua, given)[:2] == (0, given)


@pytest.mark.parametrize("option", ["nodelist", "exclude"])
def test_a_new_jobs_node_list_is_left_to_the_hook_and_its_exclusion_decided(
    rendered: dict[str, Config], option: str
) -> None:
    """A new job with -w is refused by the hook (it picks a type, not nodes): left to it; -x is
    decided as the hook decides it (branch excl): away from the excluded node."""
    lua = cli_filter(rendered["scoped"])
    _in_allocation(lua, None, env={})
    given = {"gres": "gres/gpumem:10G", option: "l40sn1"}
    rc, after, log = run_cli(lua, given)
    if option == "nodelist":
        assert (rc, after, log) == (0, given, []), log
    else:
        assert rc == 0 and [kind for kind, _ in log] == ["info"] and "l40s" not in after["gres"], log


# Issue 10 item 5: `srun --gres=gpumem:20G A : --gres=gpumem:20G B` (no allocation) rewrote both
# components to l40s, the cluster's one l40s node, and the job waited forever (components never
# share a node). srun calls the filter once per component (pack_offset 0, 1, ...) in one Lua
# state: the hook's own het bookkeeping decides each on the nodes the earlier ones leave.
@pytest.mark.parametrize("sizes", [("20G", "20G", "20G"), ("70G", "70G"), ("70G", "20G")])
def test_srun_het_components_are_decided_on_the_nodes_earlier_ones_leave(
    rendered: dict[str, Config], sizes: tuple[str, ...]
) -> None:
    config = rendered["scoped"]
    lua = cli_filter(config)
    het = Hook(config.directory / SCRIPT_NAME)
    refused = False
    for offset, size in enumerate(sizes):
        job = job_from_options(gres=f"gpumem:{size}", uid=1000, slurm_release="24.11")
        python = het.submit(job, offset)
        given = {"gres": f"gres/gpumem:{size}"}
        rc, after, log = run_cli(lua, given, offset=offset)
        if python.ok:
            assert rc == 0 and after["gres"] == _bare(python.job.tres_per_node), (offset, log)
            assert log == [("info", python.message)]
        else:  # the hook's own words, from srun: slurmctld's hook never sees the earlier gpumem
            assert (rc, after, log) == (-1, given, [("error", python.message)])
            refused = True
            break
    assert refused == (sizes != ("70G", "20G"))
    # a new srun starts again at component 0
    rc, after, log = run_cli(lua, {"gres": f"gres/gpumem:{sizes[0]}"}, offset=0)
    assert (
        rc == 0
        and log[0][1]
        == decided(
            config,
            job_from_options(gres=f"gpumem:{sizes[0]}", uid=1000, slurm_release="24.11"),
        ).message
    )


# Issue 10 adversarial B33 (24.11): `srun --gres=gpu:l40s:1 A : --gres=gpumem:20G B` rewrote B to
# gres/gpu:l40s:1 beside A's l40s node (the cluster's one), and the job waited on an idle cluster:
# cli_filter.lua returned at once for A (no gpumem), so the hook in srun never counted its node,
# unlike slurmctld's hook for sbatch. The filter now keeps such components for the srun half,
# which passes them through the hook (its het bookkeeping) before the first one it decides.
@pytest.mark.parametrize(
    "components",
    [
        ("gpu:l40s:1", "gpumem:20G"),
        ("gpumem:20G", "gpu:a100_80g:1", "gpumem:20G"),
        ("gpu:a100_80g:1", "gpu:l40s:1", "gpumem:20G"),
        ("gpu:l40s:1", "gpumem:20G", "gpumem:20G"),
    ],
)
def test_srun_het_components_left_alone_still_take_their_nodes(
    rendered: dict[str, Config], components: tuple[str, ...]
) -> None:
    config = rendered["scoped"]
    lua = cli_filter(config)
    het = Hook(config.directory / SCRIPT_NAME)
    for offset, gres in enumerate(components):
        job = job_from_options(gres=gres, uid=1000, slurm_release="24.11")
        python = het.submit(job, offset)
        given = {"gres": f"gres/{gres}"}
        rc, after, log = run_cli(lua, given, offset=offset)
        if "gpumem" not in gres:
            assert python.action == "untouched" and (rc, after, log) == (0, given, [])
        elif python.ok:
            assert rc == 0 and after["gres"] == _bare(python.job.tres_per_node), (offset, log)
            assert log == [("info", python.message)]
        else:
            assert "no device type fits" in python.message, python
            if any("gpumem" in earlier for earlier in components[:offset]):
                # slurmctld's hook never sees the gpumem of a component rewritten here: refused here
                assert (rc, after, log) == (-1, given, [("error", python.message)])
            else:  # left to slurmctld's hook, which sees every component and refuses it the same
                assert (rc, after, log) == (0, given, [])
            return
    assert "l40s" not in after["gres"]  # the last component never lands on the typed l40s node


# Issue 10 adversarial C05 (24.11) / M24 (22.05): `srun --gres=gpumem:20G A : --gres=gpu:l40s:1 B`
# put A on the one l40s node and B, typed l40s, waited for resources forever: cli_filter.lua left B
# alone, and slurmctld's hook, which sees A already typed, never refuses it. sbatch's hook refuses
# that shape (het_typed): the filter now passes such a component through the hook in srun too.
@pytest.mark.parametrize(
    ("components", "refused"),
    [
        (({"gres": "gpumem:20G"}, {"gres": "gpu:l40s:1"}), True),
        (({"gres": "gpumem:20G"}, {"gpus": "l40s:1"}), True),
        (({"gres": "gpumem:70G"}, {"gres": "gpu:l40s:1"}), False),
        (({"gres": "gpumem:20G"}, {"gres": "gpu:a100_80g:1"}), False),
        (({"gres": "gpu:l40s:1"}, {"gres": "gpumem:20G"}, {"gres": "gpu:a100_80g:1"}), True),
        (({"gres": "gpumem:20G"}, {"gres": "gpu:a100_80g:1"}, {"gres": "gpu:l40s:1"}), True),
    ],
)
def test_srun_het_typed_component_after_a_decided_one_is_refused_as_the_hook_does(
    rendered: dict[str, Config], components: tuple[dict[str, str], ...], refused: bool
) -> None:
    config = rendered["scoped"]
    lua = cli_filter(config)
    het = Hook(config.directory / SCRIPT_NAME)
    for offset, options in enumerate(components):
        job = job_from_options(**options, uid=1000, slurm_release="24.11")
        python = het.submit(job, offset)
        given = {name: f"gres/{value}" if name == "gres" else value for name, value in options.items()}
        rc, after, log = run_cli(lua, given, offset=offset)
        if not python.ok:  # the hook's own words (het_typed), from srun
            assert offset > 0 and "gpumem" not in str(options) and "put it before" in python.message, python
            assert (rc, after, log) == (-1, given, [("error", python.message)])
            assert refused
            return
        if python.action == "untouched":
            assert (rc, after, log) == (0, given, [])
        else:
            assert rc == 0 and after["gres"] == _bare(python.job.tres_per_node), log
            assert log == [("info", python.message)]
    assert not refused


# Issue 10 adversarial G02 (24.11) / G06 (22.05): `srun -w l40sn1 A : --gres=gpumem:20G B` wrote B as
# l40s, and srun failed "Requested node configuration is not available": slurmctld gives every
# component the other components' -w hosts as exc_nodes (proc_req.c, _exclude_het_job_nodes), which
# the hook decides around for sbatch (A08), but srun's filter sees each component's own options only
# (-w is reset for every component; -x is not, so `srun -x l40sn1 A : B` already worked). The filter
# now keeps a component's -w for the srun half, as it keeps its devices.
@pytest.mark.parametrize(
    "first",
    [
        {"nodelist": "l40sn1"},
        {"nodelist": "l40sn1", "gres": "gpu:l40s:1"},
        {"nodelist": "a100n1"},
        {"nodelist": "ascendn1"},
    ],
)
@pytest.mark.parametrize("size", ["20G", "70G"])
def test_srun_het_component_is_decided_around_the_hosts_earlier_ones_name(
    rendered: dict[str, Config], first: dict[str, str], size: str
) -> None:
    config = rendered["scoped"]
    lua = cli_filter(config)
    het, sbatch_het = Hook(config.directory / SCRIPT_NAME), Hook(config.directory / SCRIPT_NAME)
    leader = job_from_options(**first, uid=1000, slurm_release="24.11")
    het.submit(leader, 0)
    sbatch_het.submit(leader, 0)
    given = {name: f"gres/{value}" if name == "gres" else value for name, value in first.items()}
    assert run_cli(lua, given, offset=0) == (0, given, [])
    job = job_from_options(gres=f"gpumem:{size}", uid=1000, slurm_release="24.11")
    python = het.submit(job, 1)
    # what slurmctld's hook decides for sbatch, where Slurm gives this component the -w hosts in exc_nodes
    sbatch = sbatch_het.submit(replace(job, exc_nodes=first["nodelist"]), 1)
    assert (python.ok, python.message) == (sbatch.ok, sbatch.message)
    rc, after, log = run_cli(lua, {"gres": f"gres/gpumem:{size}"}, offset=1)
    if not python.ok:  # left to slurmctld's hook, which sees the exc_nodes and refuses it the same
        assert (rc, after, log) == (0, {"gres": f"gres/gpumem:{size}"}, [])
        return
    assert rc == 0 and after["gres"] == _bare(python.job.tres_per_node) and log == [("info", python.message)]
    assert type_of(python) not in first["nodelist"], python.message


# Issue 10 adversarial round 6, S06 (22.05 and 24.11): `srun --gres=gpumem:20G A : -w l40sn1 B` wrote A
# as l40s (B's -w is parsed after A's filter call) and srun failed "Requested node configuration is not
# available": slurmctld keeps A off B's -w hosts too. The srun half reads later components' -w from
# /proc/self/cmdline (srun's options up to each component's command) and decides A around them, as
# slurmctld's hook decides the sbatch form (B06).
@pytest.mark.parametrize(
    ("later", "excluded"),
    [
        (["-w", "l40sn1", "hostname"], "l40sn1"),
        (["-wl40sn1", "hostname"], "l40sn1"),
        (["--nodelist=l40sn1", "hostname"], "l40sn1"),
        (["--nodelist", "l40sn1", "hostname"], "l40sn1"),
        (["--nodel=l40sn1", "hostname"], "l40sn1"),  # getopt takes a unique prefix
        (["-N1", "-lw", "l40sn1", "hostname"], "l40sn1"),  # -l is a flag, -w takes the next word
        (["-p", "nvidia", "--exclusive", "-w", "l40sn1", "hostname"], "l40sn1"),
        (["-w", "l40sn1", "hostname", ":", "-w", "a100n1", "true"], "l40sn1,a100n1"),
        (["hostname", "-w", "l40sn1"], None),  # the command's own arguments
        (["--exclusive", "hostname", "-w", "l40sn1"], None),  # a flag or a value: not read past
        (["--", "-w", "l40sn1"], None),
        (["-w", "./hosts", "hostname"], None),  # a host file: srun reads it, not this filter
        (["-w", "a100n1", "-w", "l40sn1", "hostname"], "l40sn1"),  # the last one counts, as in srun
    ],
)
def test_srun_het_component_is_decided_around_later_components_hosts(
    rendered: dict[str, Config], later: list[str], excluded: str | None
) -> None:
    config = rendered["scoped"]
    lua = cli_filter(config)
    command = ["srun", "--gres=gpumem:20G", "-N1", "sh", "-c", "..", ":", *later]
    lua.globals().CMDLINE = "\0".join(command) + "\0"
    job = job_from_options(gres="gpumem:20G", uid=1000, slurm_release="24.11", exclude=excluded)
    python = decided(config, job)
    rc, after, log = run_cli(lua, {"gres": "gres/gpumem:20G"}, offset=0)
    if not python.ok:  # left to slurmctld's hook, which sees the exc_nodes and refuses it the same
        assert (rc, after, log) == (0, {"gres": "gres/gpumem:20G"}, []), python.message
        return
    assert rc == 0 and after["gres"] == _bare(python.job.tres_per_node) and log == [("info", python.message)]
    if excluded:
        assert type_of(python) != "l40s", python.message


# Issue 10 adversarial B26 (24.11): inside `salloc --gres=gpumem:20G : --gres=gpumem:70G` (an l40s
# component, then an a100_80g one), `srun --het-group=0 --gres=gpumem:70G` was written for a type
# component 0 lacks. srun calls the filter once per component it runs on (pack_offset: the
# --het-group index, 0 by default); scontrol shows each component's GRES on its own line, and the
# refusal names what that component holds.
def _het_shown(leader: int, types: tuple[str, ...]) -> str:
    """`scontrol show job -d -o LEADER` of a running het job, one component per line."""
    return "".join(
        f"JobId={leader + offset} HetJobId={leader} HetJobOffset={offset} JobName=sh "
        f"UserId=nobody(65534) JobState=RUNNING NumNodes=1 JOB_GRES=gpu:{gpu_type}:1   "
        f"Nodes={gpu_type}n1 CPU_IDs=0 Mem=500 GRES=gpu:{gpu_type}:1(IDX:0) MinCPUsNode=1\n"
        for offset, gpu_type in enumerate(types)
    )


@pytest.mark.parametrize("offset", [0, 1])
def test_srun_in_a_het_allocation_names_its_components_devices(
    rendered: dict[str, Config], offset: int
) -> None:
    held = ("l40s", "a100_80g")[offset]
    lua = cli_filter(rendered["scoped"])
    _in_allocation(lua, _het_shown(10, ("l40s", "a100_80g")), env={"SLURM_JOB_ID": "10"})
    rc, _, log = run_cli(lua, {"gres": "gres/gpumem:20G"}, offset=offset)
    assert list(lua.globals().POPENED.values()) == ["scontrol show job -d -o 10 2>&1"]
    assert rc == -1 and len(log) == 1, log
    assert log[0][1].startswith(
        f"gpumem:20G: this srun is a step of job 10+{offset}, which holds gpu:{held}:1 on "
    ), log


def test_srun_on_a_het_component_scontrol_does_not_show_is_refused(rendered: dict[str, Config]) -> None:
    lua = cli_filter(rendered["scoped"])
    _in_allocation(lua, _het_shown(10, ("l40s", "a100_80g")), env={"SLURM_JOB_ID": "10"})
    rc, _, log = run_cli(lua, {"gres": "gres/gpumem:20G"}, offset=2)
    assert rc == -1 and log[0][1].startswith("gpumem:20G: this srun is a step of job 10+2 and "), log


# Issue 10 adversarial B30 (24.11): the filter wrote --gpus-per-task=a100_80g:1 and srun failed
# "Invalid GRES specification (with and without type identification)": srun 24.11 keeps the per-task
# count in tres_per_task as well (untyped: SLURM_TRES_PER_TASK=gres/gpu=1, measured), and adds the
# typed item beside it. The filter writes its gpu item as it writes --gpus-per-task.
def srun_tres_per_task(tres_per_task: str | None, gpus_per_task: str) -> str:
    """srun 24.11's tres_per_task after _opt_verify, given --gpus-per-task (slurm_opt.c:
    `_set_tres_per_task_from_sibling_opt`): `gres/gpu[:TYPE]` is looked up in tres_per_task
    (xstrcasestr); found, its count becomes the option's, else `gres/gpu[:TYPE]=N` is added."""
    gpu_type, _, count = gpus_per_task.rpartition(":")
    name = "gres/gpu" + (f":{gpu_type}" if gpu_type else "")
    if tres_per_task and name.lower() in tres_per_task.lower():
        return re.sub(re.escape(name) + r"[:=]\d+", f"{name}={count}", tres_per_task, flags=re.I)
    return ",".join(filter(None, [f"{name}={count}", tres_per_task]))


def _typed_and_untyped(tres_per_task: str) -> bool:
    gpu = [item for item in tres_per_task.split(",") if re.match(r"gres/gpu[:=]", item)]
    return any(re.fullmatch(r"gres/gpu[:=]\d+", i) for i in gpu) and any(
        not re.fullmatch(r"gres/gpu[:=]\d+", i) for i in gpu
    )


@pytest.mark.parametrize(
    ("held", "again"),
    [
        ("gres/gpu=1", True),
        ("cpu=2,gres/gpu=1", True),
        ("gres/gpu:1", True),
        ("cpu=2", True),
        (None, True),
        (
            "gres/gpu=1",
            False,
        ),  # `srun -n 2 --tres-per-task=gres/gpu=1 --gres=gpumem:30G`: the count there only
        ("cpu=2,gres/gpu=1", False),
    ],
)
def test_srun_types_the_per_task_count_srun_also_holds(
    rendered: dict[str, Config], held: str | None, again: bool
) -> None:
    """The per-task count, where srun 24.11 holds it twice, is written alike in both."""
    config = rendered["scoped"]
    lua = cli_filter(config)
    given = {"gres": "gres/gpumem:30G", "ntasks": "2", **({"gpus-per-task": "1"} if again else {})}
    if held is not None:
        given["tres-per-task"] = held
    rc, after, log = run_cli(lua, given)
    job = job_from_options(gres="gpumem:30G", gpus_per_task="1", ntasks="2", uid=1000, slurm_release="24.11")
    python = decided(config, job)
    gpu_type = type_of(python)
    assert gpu_type is not None and rc == 0 and [kind for kind, _ in log] == ["info"], log
    assert f" -> gres/gpu:{gpu_type}:1 " in log[0][1], log
    assert after.get("gpus-per-task") == (f"{gpu_type}:1" if again else None)
    sent = (
        srun_tres_per_task(after.get("tres-per-task"), after["gpus-per-task"])
        if again
        else after["tres-per-task"]
    )
    assert not _typed_and_untyped(sent), sent
    assert f"gres/gpu:{gpu_type}=1" in sent.split(","), sent
    if held is not None:  # the other items stay
        kept = [item for item in held.split(",") if not item.startswith("gres/gpu")]
        assert [item for item in after["tres-per-task"].split(",") if not item.startswith("gres/gpu")] == kept


def test_srun_model_of_tres_per_task_shows_the_measured_refusal() -> None:
    """The model above gives the mix srun refused (24.11, measured: SLURM_TRES_PER_TASK=gres/gpu=1
    and --gpus-per-task=a100_80g:1), and what srun accepted (the env typed: step ran, rc 0)."""
    assert _typed_and_untyped(srun_tres_per_task("gres/gpu=1", "a100_80g:1"))
    assert srun_tres_per_task("gres/gpu:a100_80g=1", "a100_80g:1") == "gres/gpu:a100_80g=1"
    assert srun_tres_per_task(None, "a100_80g:2") == "gres/gpu:a100_80g=2"


# Issue 10 adversarial round 6, L01/P02b (22.05 and 24.11): a -w/-x value with a "/" names a host
# file, which srun reads itself and sends its hosts (proc_args.c verify_node_list ->
# slurm_read_hostfile), so slurmctld's hook sees host names; the srun half did not read it:
# `srun --gres=gpumem:20G A : -w FILE B` wrote A as l40s (FILE naming l40sn1; the sbatch form is
# a100_80g), and 22.05 `srun -x FILE --gres=gpumem:20G cmd` was left unrewritten (the hook in the
# client refused the unreadable -x), slurmctld's hook rewrote the job and the step failed "Step
# requested GRES (gpumem:(null)) not found in the job". Both now read the file as srun does.
def _hostfile(tmp_path: Path, text: str = "# the l40s node\nl40sn1 # its only host\n\n") -> str:
    path = tmp_path / "hosts"
    path.write_text(text)
    return str(path)


def test_srun_het_component_is_decided_around_a_later_components_host_file(
    rendered: dict[str, Config], tmp_path: Path
) -> None:
    config = rendered["scoped"]
    lua = cli_filter(config)
    command = ["srun", "--gres=gpumem:20G", "sh", "-c", "..", ":", "-w", _hostfile(tmp_path), "hostname"]
    lua.globals().CMDLINE = "\0".join(command) + "\0"
    job = job_from_options(gres="gpumem:20G", uid=1000, slurm_release="24.11", exclude="l40sn1")
    python = decided(config, job)
    rc, after, log = run_cli(lua, {"gres": "gres/gpumem:20G"}, offset=0)
    assert rc == 0 and after["gres"] == _bare(python.job.tres_per_node) and log == [("info", python.message)]
    assert type_of(python) != "l40s", python.message


@pytest.mark.parametrize(
    "text",
    [
        "# the l40s node\nl40sn1 # its only host\n\n",
        "l40sn1*2\n",  # name*N: the host N times
        "l40sn1,\n",
        "a100n9 l40sn1 # two names a line\n",
    ],
)
def test_srun_jobs_own_exclude_host_file_is_read_as_srun_reads_it(
    rendered: dict[str, Config], tmp_path: Path, text: str
) -> None:
    config = rendered["scoped"]
    lua = cli_filter(config)
    _in_allocation(lua, None, env={})
    given = {"gres": "gres/gpumem:20G", "exclude": _hostfile(tmp_path, text)}
    hosts = "a100n9,l40sn1" if "a100n9" in text else "l40sn1"
    job = job_from_options(gres="gpumem:20G", uid=1000, slurm_release="24.11", exclude=hosts)
    python = decided(config, job)
    rc, after, log = run_cli(lua, given)
    assert python.ok and rc == 0 and log == [("info", python.message)], log
    # srun keeps the file (it reads it itself)
    assert (after["gres"], after["exclude"]) == (_bare(python.job.tres_per_node), given["exclude"])
    assert type_of(python) != "l40s", python.message


@pytest.mark.parametrize("text", [None, " l40sn1\n", "# nothing\n"])
def test_srun_host_file_it_cannot_read_is_left_to_srun(
    rendered: dict[str, Config], tmp_path: Path, text: str | None
) -> None:
    """A missing file, a line srun refuses (not a letter or digit first), no host: left as given
    for srun to refuse (22.05 and 24.11: "Invalid hostfile ... contents" / "Hostlist is empty!")."""
    lua = cli_filter(rendered["scoped"])
    _in_allocation(lua, None, env={})
    path = str(tmp_path / "missing") if text is None else _hostfile(tmp_path, text)
    given = {"gres": "gres/gpumem:20G", "exclude": path}
    rc, after, _ = run_cli(lua, given)
    assert (rc, after) == (0, given)
    command = ["srun", "--gres=gpumem:20G", "sh", ":", "-w", path, "hostname"]
    lua.globals().CMDLINE = "\0".join(command) + "\0"
    rc, after, log = run_cli(lua, {"gres": "gres/gpumem:20G"}, offset=0)
    assert rc == 0 and after["gres"] != "gres/gpumem:20G", log  # decided without B's hosts


@pytest.mark.parametrize(
    ("fields", "fits"),
    [
        ({}, True),  # 9 tasks: 5 + 4 on two 8-CPU nodes
        ({"max_nodes": 2}, True),  # -N 1-2
        ({"num_tasks": 2, "cpus_per_task": 5}, True),
        ({"min_mem_per_cpu": 2001, "num_tasks": 8}, True),  # 16008M on one 16000M node, half on two
        ({"num_tasks": 16, "pn_min_cpus": 8}, True),
        ({"tres_per_job": "gres:gpu:2", "num_tasks": 16}, True),  # one device on each node
        ({"num_tasks": 17}, False),  # three nodes' worth: the type has two
        ({"num_tasks": 9, "cpus_per_task": 3}, False),
        ({"max_nodes": 1}, False),  # -N 1: no room
        ({"ntasks_per_node": 9}, False),  # the tasks a node set
        ({"num_tasks": 16, "min_cpus": 2, "min_nodes": 2, "max_nodes": 2}, True),  # -O
    ],
)
def test_a_jobs_tasks_spread_over_more_nodes_where_n_leaves_room(
    tmp_path: Path, fields: dict[str, Any], fits: bool
) -> None:
    """Adversarial (stop 30): `-n 9 --gres=gpumem:20G -C l40s` was refused for 9 CPUs a node (the
    fit took the fewest nodes) though Slurm runs the typed job on two 8-CPU l40s nodes; so were
    -N 1-2, --gpus with -n, --mem-per-cpu and --mincpus jobs of the same shape. The fewest nodes
    that take the job, where -N leaves room."""
    from slurm_hetero.inventory.config import DEFAULTS, merge, settings_from_dict

    settings = settings_from_dict(merge(DEFAULTS, {"job_submit": {"default_vendors": "all"}}))
    mixed = inventory.load(MIXED)
    l40s = next(node for node in mixed.nodes if node.name == "l40sn1")
    two = dataclasses.replace(mixed, nodes=(*mixed.nodes, dataclasses.replace(l40s, name="l40sn2")))
    config = render(tmp_path, compile_model(slurm_nodes(two, load_catalog()), settings.scoring), settings)
    job = Job(tres_per_node="gres:gpumem:20G", features="l40s", num_tasks=9, submit_uid=1000, user_id=1000)
    ok, message, after, _ = Hook(config.directory / SCRIPT_NAME).run(dataclasses.replace(job, **fields))
    assert ok is fits, message
    if fits and "tres_per_job" in fields:  # per-job devices follow the node count: pinned
        assert (after.min_nodes, after.max_nodes, after.tres_per_job) == (2, 2, "gres:gpu:l40s:2"), after


@pytest.mark.parametrize(
    ("fields", "needs"),
    [
        # -O: sbatch sends min_cpus = the nodes; Slurm allocates one task's CPUs a node
        ({"num_tasks": 32, "min_cpus": 1}, None),
        ({"ntasks_per_node": 32, "min_nodes": 1, "max_nodes": 1, "min_cpus": 1}, None),  # 24.11: no num_tasks
        ({"num_tasks": 32, "min_cpus": 1, "cpus_per_task": 12}, 12),
        ({"num_tasks": 32, "min_cpus": 32}, 32),  # no -O: the tasks' CPUs
        ({"ntasks_per_node": 32, "min_nodes": 1, "max_nodes": 2, "min_cpus": 1}, 32),  # -N 1-2: tasks unknown
        ({"pn_min_cpus": 12}, 12),  # --mincpus
        ({"pn_min_cpus": 6}, None),
        ({"num_tasks": 32, "min_cpus": 1, "pn_min_cpus": 9}, 9),
    ],
)
def test_overcommit_and_mincpus_count_as_slurm_allocates_the_cpus(
    hooks: dict[str, Hook], fields: dict[str, Any], needs: int | None
) -> None:
    """Issue 26 (adversarial, stop 29): `-O -n 32` was refused for 32 CPUs a node, though Slurm
    runs it with one task's CPUs a node; `--mincpus=12` was rewritten onto 8-CPU nodes, where the
    job pended (BadConstraints)."""
    job = Job(tres_per_node="gres:gpumem:20G", submit_uid=1000, user_id=1000, **fields)
    ok, message, after, _ = hooks["mixed"].run(job)
    if needs is None:
        assert ok and after.tres_per_node == "gres:gpu:l40s:1", message
        if fields.get("min_cpus") == 1:  # -O: Slurm refuses `-O -n 32 -N1` with gres on 8 CPUs
            assert after.max_nodes == fields.get("max_nodes"), after
    else:
        assert after.tres_per_node != "gres:gpu:l40s:1", message  # never onto the 8-CPU l40s nodes
        assert ok or message.endswith(f"the job needs {needs} per node"), message


@pytest.mark.parametrize(
    ("fields", "needs"),
    [
        ({"ntasks_per_node": 65535}, 65535),  # INFINITE16: a count, as slurmctld holds the job to it
        ({"cpus_per_task": 65535}, 65535),
        ({"num_tasks": 65534}, 65534),  # a 32-bit field's 65534 is 65534 tasks, not NO_VAL16
        ({"ntasks_per_node": 65534}, None),  # NO_VAL16: unset
        ({"cpus_per_task": 65534}, None),
        ({"pn_min_cpus": 65535}, 65535),  # --mincpus: 16 bits too
        ({"pn_min_cpus": 65534}, None),
        ({"num_tasks": 4294967294, "min_nodes": 4294967294}, None),  # NO_VAL: unset
        # memory is 64 bits: unset only as NO_VAL64 without the per-CPU bit (an unset --mem)
        ({"min_mem_per_cpu": 2**63 - 2}, None),
        ({"min_mem_per_node": 4294967294}, "4294967294M"),
        ({"min_mem_per_node": 5000000000}, "5000000000M"),
        ({"min_mem_per_cpu": 5000000000}, "5000000000M"),
        ({"mem_per_tres": "gres:gpu:102399999999998976", "tres_per_job": "gres:gpu:1"}, "99999999999999G"),
    ],
)
def test_slurms_sentinels_are_read_per_field_width_as_slurmctld_reads_them(
    hooks: dict[str, Hook], fields: dict[str, Any], needs: int | str | None
) -> None:
    """Issue 26 repro 3: `--ntasks-per-node=65535` was read as unset (any count >= 65534 was), so
    the hook rewrote a job that then pended forever on 22.05 (PartitionConfig) and was refused by
    24.11 after the rewrite was printed. Memory the same: `--mem=5000000000` was read as unset (at
    or above NO_VAL), and a 15-digit --mem-per-gpu as none."""
    job = Job(tres_per_node="gres:gpumem:20G", submit_uid=1000, user_id=1000, **fields)
    ok, message, after, _ = hooks["mixed"].run(job)
    if needs is None:
        assert ok and after.tres_per_node == "gres:gpu:l40s:1", message
    else:
        assert not ok and after.tres_per_node == "gres:gpumem:20G", message
        assert message.endswith(f"the job needs {needs} per node"), message


def test_an_inventorys_whole_float_reaches_the_table() -> None:
    """An inventory's `cpus: 1e3` (a float the inventory accepts) made `job-submit render` fail
    with a TypeError; the table writes it as a Lua number."""
    import yaml

    from slurm_hetero.submit.tables import lua_value, render_table

    data = yaml.safe_load(MIXED.read_text())
    data["nodes"][0]["cpus"] = 1e3
    nodes = slurm_nodes(inventory.inventory_from_dict(data, str(MIXED)), load_catalog())
    table, _ = render_table(compile_model(nodes, ScoringOptions()), [], "open", "mixed.yaml", [])
    assert '["cpus"] = 1000.0,' in table
    with pytest.raises(ValueError, match="inf"):
        lua_value(float("inf"))


@pytest.mark.parametrize(("local", "item"), [("24.11.1", "gres/gpu:l40s:1"), ("22.05.8", "gres:gpu:l40s:1")])
def test_request_explain_models_the_local_sbatch_without_slurm_release(
    local: str, item: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a 24.11 cluster `request explain` gave 22.05's form where the hook wrote 24.11's."""
    import json

    from slurm_hetero.cli import submit

    monkeypatch.setenv("SLURM_HETERO_CONFIG", "/dev/null")
    monkeypatch.setattr(submit, "local_slurm_release", lambda: local)
    argv = ["request", "explain", "--inventory", str(MIXED), "--gres", "gpumem:20G", "--json"]
    assert json.loads(CliRunner().invoke(cli, argv).stdout)["tres_per_node"] == item


def test_the_hook_runs_as_one_of_the_measured_releases() -> None:
    with pytest.raises(ValueError, match="23.02"):
        shim.Hook(Path("/nonexistent/job_submit.lua"), "23.02")
