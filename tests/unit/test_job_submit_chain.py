"""`job-submit render --chain`: the generated job_submit.lua runs a site's own hook and ours, in
the order asked, under Lua 5.1 (Debian's slurmctld) and 5.4 (lupa), through the shim every Python
caller uses (slurm_hetero.submit.hook); tests/integration/test_job_submit_chain_slurm.py runs it in
slurmctld."""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.submit import Job
from slurm_hetero.submit.hook import WRITTEN, _outcome
from slurm_hetero.submit.tables import CHAINED_NAME, SCRIPT_NAME
from tests.unit.test_job_submit_lua import Hook
from tests.unit.test_score import MIXED

pytest.importorskip("lupa.lua51")
import lupa.lua54  # noqa: E402

# A site hook: records what it saw, refuses one job name, fails on another, tags the comment.
SITE_HOOK = """
T = "the site's T"  -- a global of the site's own: stays in the site's environment
function slurm_job_submit(job_desc, part_list, submit_uid)
  _G.SITE_SAW = job_desc.tres_per_node  -- for the test to read
  if job_desc.name == "refused-by-site" then
    slurm.log_user("site policy: no")
    return slurm.ERROR
  end
  if job_desc.name == "site-bug" then error("site hook bug") end
  job_desc.comment = "site"
end
"""
OURS_RAN = "slurm_hetero: uid"  # our hook's log line on a rewrite


def render(tmp_path: Path, order: str, site: str = SITE_HOOK) -> Path:
    site_hook = tmp_path / "site_job_submit.lua"
    site_hook.write_text(site)
    out = tmp_path / "etc"
    args = ["job-submit", "render", "--inventory", str(MIXED), "--out", str(out), "--chain", str(site_hook)]
    result = CliRunner().invoke(cli, [*args, "--chain-order", order])
    assert result.exit_code == 0, result.output
    return out


class ChainHook(Hook):
    """The chained job_submit.lua in a fresh Lua state of the given version, through the shim."""

    def __init__(self, script: Path, lua_module: object) -> None:
        runtime = lua_module.LuaRuntime(unpack_returned_tuples=True)  # type: ignore[attr-defined]
        super().__init__(script, runtime=runtime)

    def run_named(self, job: Job, name: str) -> tuple[int, str, Job, list[tuple[str, str]]]:
        """As `run_rc`, for a job named `name` (a job_desc field the site hook reads, not a Job's)."""
        rc, store, log = self.lua.globals().submit(self._table(job, name=name), job.submit_uid)
        outcome = _outcome(rc, log, replace(job, **{field: store[field] for field in WRITTEN}))
        return outcome.rc, outcome.message, outcome.job, list(outcome.log)

    def site_saw(self) -> str | None:
        return self.lua.globals().SITE_SAW


def job(gres: str = "gpumem:20G") -> Job:
    return Job(tres_per_node=f"gres:{gres}", submit_uid=1000)


LUAS = [pytest.param(__import__("lupa.lua51").lua51, id="lua5.1"), pytest.param(lupa.lua54, id="lua5.4")]


@pytest.mark.parametrize("lua", LUAS)
def test_site_first_sees_the_users_request_then_ours_rewrites_it(tmp_path: Path, lua: object) -> None:
    hook = ChainHook(render(tmp_path, "site-first") / SCRIPT_NAME, lua)
    rc, _, after, log = hook.run_rc(job())
    assert rc == 0 and hook.site_saw() == "gres:gpumem:20G"
    assert hook.lua.globals().T is None  # the site's globals stay its own
    assert after.tres_per_node.startswith("gres:gpu:") and any(OURS_RAN in line for _, line in log)
    rc, user, after, log = hook.run_named(job(), "refused-by-site")
    assert rc == -1 and user == "site policy: no" and not any(OURS_RAN in line for _, line in log)


@pytest.mark.parametrize("lua", LUAS)
def test_ours_first_shows_the_site_the_concrete_request_and_our_refusal_ends_it(
    tmp_path: Path, lua: object
) -> None:
    hook = ChainHook(render(tmp_path, "ours-first") / SCRIPT_NAME, lua)
    rc, _, after, _ = hook.run_rc(job())
    assert rc == 0 and hook.site_saw() == after.tres_per_node and after.tres_per_node.startswith("gres:gpu:")
    hook.lua.execute("SITE_SAW = nil")
    rc, user, _, _ = hook.run_rc(job(gres="gpumem:9000G"))
    assert rc != 0 and "gpumem" in user and hook.site_saw() is None  # the site never ran


def test_a_site_hook_that_fails_is_logged_and_ours_still_decides(tmp_path: Path) -> None:
    hook = ChainHook(render(tmp_path, "site-first") / SCRIPT_NAME, lupa.lua54)
    rc, _, after, log = hook.run_named(job(), "site-bug")
    assert rc == 0 and after.tres_per_node.startswith("gres:gpu:")
    assert any(kind == "error" and "site hook bug" in line for kind, line in log), log


def test_a_site_hook_without_job_modify_leaves_edits_to_ours(tmp_path: Path) -> None:
    hook = ChainHook(render(tmp_path, "site-first") / SCRIPT_NAME, lupa.lua54)
    rc, _, _ = hook.lua.globals().modify(hook.lua.table_from({}), hook.lua.table_from({}), 1000)
    assert rc == 0  # no recursion into the chain's own global slurm_job_modify


def test_render_refuses_to_overwrite_a_site_hook_and_says_how_to_chain_it(tmp_path: Path) -> None:
    out = tmp_path / "etc"
    out.mkdir()
    (out / SCRIPT_NAME).write_text(SITE_HOOK)
    args = ["job-submit", "render", "--inventory", str(MIXED), "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "pass --chain" in result.output and "nothing changed" in result.output
    assert (out / SCRIPT_NAME).read_text() == SITE_HOOK
    result = CliRunner().invoke(cli, [*args, "--chain", str(out / SCRIPT_NAME)])
    assert result.exit_code == 1 and "move the site's hook first" in result.output
    assert not (out / CHAINED_NAME).exists()


def test_chaining_writes_our_hook_beside_and_the_srun_half_runs_ours_alone(tmp_path: Path) -> None:
    out = render(tmp_path, "site-first")
    assert "slurm_job_submit" in (out / CHAINED_NAME).read_text()
    assert f'local HOOK_PATH = "{out / CHAINED_NAME}"' in (out / "slurm_hetero_srun.lua").read_text()
    text = (out / SCRIPT_NAME).read_text()
    assert f'local SITE_PATH = "{tmp_path / "site_job_submit.lua"}"' in text
    assert "local SITE_FIRST = true" in text


@pytest.mark.parametrize("returned", ["true", '"ok"', "{}"])
def test_a_site_hook_returning_a_non_number_is_logged_and_ours_still_decides(
    tmp_path: Path, returned: str
) -> None:
    # slurmctld accepts the job of a lone hook that returns a non-number; the chain used to hand
    # that value back at once and our hook never ran (a raw gpumem request was accepted)
    site = f"function slurm_job_submit(job_desc, part_list, submit_uid) return {returned} end\n"
    hook = ChainHook(render(tmp_path, "site-first", site) / SCRIPT_NAME, __import__("lupa.lua51").lua51)
    rc, _, after, log = hook.run_rc(job())
    assert (
        rc == 0 and after.tres_per_node.startswith("gres:gpu:") and any(OURS_RAN in line for _, line in log)
    )
    assert any(kind == "error" and "not a number; going on" in line for kind, line in log), log
    numeric = "function slurm_job_submit(job_desc, part_list, submit_uid) return '2051' end\n"
    hook = ChainHook(render(tmp_path, "site-first", numeric) / SCRIPT_NAME, lupa.lua54)
    assert hook.run_rc(job())[0] == 2051  # a numeric string is its number, as lua_isnumber says


@pytest.mark.parametrize(
    "text, said",
    [
        ("function slurm_job_submit(\n", "expected near '<eof>'"),
        ("\x00\xd2\x1b garbage", "unexpected symbol"),
    ],
)
def test_render_refuses_a_site_hook_lua_cannot_load_naming_the_file(
    tmp_path: Path, text: str, said: str
) -> None:
    # slurmctld keeps its previous job_submit.lua when the chain fails to load: our new table too
    site_hook = tmp_path / "site_job_submit.lua"
    site_hook.write_bytes(text.encode("latin-1"))
    out = tmp_path / "etc"
    args = ["job-submit", "render", "--inventory", str(MIXED), "--out", str(out), "--chain", str(site_hook)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert f"--chain {site_hook}: Lua 5.1 cannot load it: " in result.output and said in result.output
    assert not (out / SCRIPT_NAME).exists()


def test_render_refuses_a_site_hook_where_it_writes_our_hook_and_chain_order_alone(tmp_path: Path) -> None:
    out = tmp_path / "etc"
    out.mkdir()
    (out / CHAINED_NAME).write_text(SITE_HOOK)  # would be overwritten by ours, then run ours twice
    args = ["job-submit", "render", "--inventory", str(MIXED), "--out", str(out)]
    result = CliRunner().invoke(cli, [*args, "--chain", str(out / CHAINED_NAME)])
    assert result.exit_code == 1 and f"render writes {CHAINED_NAME} there" in result.output
    assert (out / CHAINED_NAME).read_text() == SITE_HOOK
    result = CliRunner().invoke(cli, [*args, "--chain-order", "ours-first"])
    assert result.exit_code == 2 and "--chain-order needs --chain" in result.output


@pytest.mark.parametrize(
    ("kind", "said"), [("fifo", "a FIFO"), ("dir", "a directory"), ("zero", "a character")]
)
def test_a_site_hook_that_is_no_regular_file_is_named_as_such(tmp_path: Path, kind: str, said: str) -> None:
    """adv33 E31: --chain /dev/zero said "no such file"; a FIFO must not block the render."""
    site = {"fifo": tmp_path / "fifo", "dir": tmp_path, "zero": Path("/dev/zero")}[kind]
    if kind == "fifo":
        os.mkfifo(site)
    args = ["job-submit", "render", "--inventory", str(MIXED), "--out", str(tmp_path / "etc")]
    result = CliRunner().invoke(cli, [*args, "--chain", str(site)])
    assert result.exit_code == 1 and f"--chain {site}: site hook is {said}" in result.output, result.output
    assert not (tmp_path / "etc").exists()


REFUSED_LOADING = "did not load ("  # the chain's refusal while the site's hook does not load


@pytest.mark.parametrize("lua", LUAS)
@pytest.mark.parametrize(
    "text, said",
    [
        ("local policy = nil\npolicy.check()\n", "attempt to index"),
        ("function slurm_job_submit(\n", "expected near"),
        ("\x00\xd2\x1b\n garbage", "unexpected symbol"),
        ("function slurm_job_submit() end\nreturn slurm.ERROR\n", "returned -1 on load"),
    ],
)
@pytest.mark.parametrize("order", ["site-first", "ours-first"])
def test_a_site_hook_that_does_not_load_refuses_every_job_naming_it_and_ours_still_loads(
    tmp_path: Path, lua: object, text: str, said: str, order: str
) -> None:
    # slurmctld used to keep its previous job_submit.lua (our old table too) when the site's hook
    # failed at load; the chain now loads it itself: ours always loads, and the site's policy
    # holds by refusing every job (what slurmctld does when no job_submit.lua loads at start)
    out = render(tmp_path, order)
    (tmp_path / "site_job_submit.lua").write_bytes(text.encode("latin-1"))  # render compiles it: edit after
    hook = ChainHook(out / SCRIPT_NAME, lua)
    for _ in range(2):
        rc, user, _, log = hook.run_rc(job())
        assert rc == -1 and user.count("\n") == 0, user
        assert (
            f"the site's hook {tmp_path / 'site_job_submit.lua'} {REFUSED_LOADING}" in user and said in user
        )
        assert ("error", user) in log and not any(OURS_RAN in line for _, line in log)
    rc, user, _ = hook.lua.globals().modify(hook.lua.table_from({}), hook.lua.table_from({}), 1000)
    assert rc == -1  # edits too
    (tmp_path / "site_job_submit.lua").write_text(SITE_HOOK)  # fixed: the same Lua state goes on
    rc, _, after, log = hook.run_rc(job())
    assert (
        rc == 0 and after.tres_per_node.startswith("gres:gpu:") and any(OURS_RAN in line for _, line in log)
    )


def test_an_edited_site_hook_is_read_again_and_a_broken_edit_keeps_the_one_before(tmp_path: Path) -> None:
    site_hook = tmp_path / "site_job_submit.lua"
    hook = ChainHook(render(tmp_path, "site-first") / SCRIPT_NAME, lupa.lua54)
    assert hook.run_rc(job())[0] == 0 and hook.site_saw() == "gres:gpumem:20G"
    site_hook.write_text(SITE_HOOK.replace("_G.SITE_SAW = job_desc.tres_per_node", "_G.SITE_SAW = 'edited'"))
    assert hook.run_rc(job())[0] == 0 and hook.site_saw() == "edited"  # no touch, no reconfigure
    edited = site_hook.read_text()
    for broken in ("function slurm_job_submit(\n", None):  # a syntax error, then no file at all
        site_hook.unlink()
        if broken is not None:
            site_hook.write_text(broken)
        hook.lua.execute("SITE_SAW = nil")
        rc, _, after, log = hook.run_rc(job())
        assert rc == 0 and hook.site_saw() == "edited" and after.tres_per_node.startswith("gres:gpu:")
        assert [kind for kind, line in log if "using the hook loaded before" in line] == ["error"], log
        assert not any("using the hook loaded before" in line for _, line in hook.run_rc(job())[3])  # once
    site_hook.write_text("#!/usr/bin/lua\n" + edited.replace("'edited'", "'fixed'"))  # as loadfile: # skipped
    assert hook.run_rc(job())[0] == 0 and hook.site_saw() == "fixed"


STOPPED = "Lua instructions (an endless loop?) and was stopped"


@pytest.mark.parametrize("lua", LUAS)
def test_a_site_hook_that_never_returns_is_stopped_and_that_job_refused(tmp_path: Path, lua: object) -> None:
    site = """
function slurm_job_submit(job_desc, part_list, submit_uid)
  if job_desc.name == "loops" then while true do end end
  if job_desc.name == "catches" then  -- catches the stop and loops again
    while true do pcall(function() while true do end end) end
  end
  if job_desc.name == "wraps" then  -- a site that wraps its own work in pcall and says yes
    pcall(function() while true do end end)
  end
  return slurm.SUCCESS
end
"""
    hook = ChainHook(render(tmp_path, "site-first", site) / SCRIPT_NAME, lua)
    for name in ("loops", "catches", "wraps"):
        rc, user, _, log = hook.run_named(job(), name)
        said = f"the site's hook {tmp_path / 'site_job_submit.lua'} ran past 100000000 {STOPPED}"
        assert rc == -1 and user == f"slurm_hetero chain: {said}"
        assert ("error", user) in log and not any(OURS_RAN in line for _, line in log)
    rc, _, after, _ = hook.run_named(job(), "next")  # the next job goes through both hooks
    assert rc == 0 and after.tres_per_node.startswith("gres:gpu:")


def test_a_site_hook_that_never_returns_at_load_refuses_every_job(tmp_path: Path) -> None:
    out = render(tmp_path, "ours-first")
    (tmp_path / "site_job_submit.lua").write_text("while true do end\n")
    rc, user, _, _ = ChainHook(out / SCRIPT_NAME, lupa.lua54).run_rc(job())
    assert rc == -1 and REFUSED_LOADING in user and STOPPED in user


def in_child(call: Callable[[], Any], timeout: float = 60) -> Any:
    """`call()` in a forked child: a hook that never returns fails its test instead of hanging the suite."""
    fork = multiprocessing.get_context("fork")
    reader, writer = fork.Pipe(duplex=False)
    child = fork.Process(target=lambda: writer.send(call()))
    child.start()
    try:
        if not reader.poll(timeout):
            pytest.fail(f"the chain still ran after {timeout:.0f} s: the site's hook was not stopped")
        return reader.recv()
    finally:
        child.kill()
        child.join()


# Each escaped the budget of a chain that hooked the main thread alone (slurmctld wedged, issue 22).
ESCAPES = """
function slurm_job_submit(job_desc, part_list, submit_uid)
  if job_desc.name == "coroutine" then coroutine.wrap(function() while true do end end)() end
  if job_desc.name == "finite" then  -- past the budget in a coroutine, then resumed from another
    local n = 0
    local co = coroutine.create(function() for i = 1, 3e8 do n = n + 1 end end)
    coroutine.wrap(function() coroutine.resume(co) end)()
    _G.SITE_SAW = n
  end
  if job_desc.name == "handler" then
    xpcall(function() while true do end end, function(e) while true do end end)
  end
  if job_desc.name == "unhook" then debug.sethook(); while true do end end
  return slurm.SUCCESS
end
"""


@pytest.mark.parametrize("lua", LUAS)
@pytest.mark.parametrize("name", ["coroutine", "finite", "handler"])
def test_a_site_hook_that_loops_in_a_coroutine_or_an_xpcall_handler_is_stopped(
    tmp_path: Path, lua: object, name: str
) -> None:
    hook = ChainHook(render(tmp_path, "site-first", ESCAPES) / SCRIPT_NAME, lua)
    rc, user, _, log = in_child(lambda: hook.run_named(job(), name))
    assert rc == -1 and user.endswith(f"ran past 100000000 {STOPPED}"), user
    assert not any(OURS_RAN in line for _, line in log)
    rc, _, after, _ = hook.run_named(job(), "next")  # and the state goes on: the next job goes through
    assert rc == 0 and after.tres_per_node.startswith("gres:gpu:")


@pytest.mark.parametrize("lua", LUAS)
def test_a_site_hook_cannot_lift_the_budget_and_its_own_coroutines_and_handlers_still_work(
    tmp_path: Path, lua: object
) -> None:
    hook = ChainHook(render(tmp_path, "site-first", ESCAPES) / SCRIPT_NAME, lua)
    rc, _, after, log = in_child(lambda: hook.run_named(job(), "unhook"))
    assert rc == 0 and after.tres_per_node.startswith("gres:gpu:")  # an error, logged: ours decides
    assert any(kind == "error" and "debug.sethook is not for the site's hook" in line for kind, line in log)
    site = """
function slurm_job_submit(job_desc, part_list, submit_uid)
  local gen = coroutine.wrap(function(a) local b = coroutine.yield(a + 1); return b * 2 end)
  local ok, e = xpcall(function() error({ code = 7 }) end, function(e) return e.code end)
  _G.SITE_SAW = table.concat({ gen(1), gen(5), tostring(ok), e }, " ")
end
"""
    hook = ChainHook(render(tmp_path, "site-first", site) / SCRIPT_NAME, lua)
    assert hook.run_rc(job())[0] == 0 and hook.site_saw() == "2 10 false 7"
