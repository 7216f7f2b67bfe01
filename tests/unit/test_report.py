"""`slurm-hetero report`: figures computed by hand on a small window, and bad input in one line."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_hetero.accounting import report
from slurm_hetero.cli import cli
from slurm_hetero.core import proc
from slurm_hetero.engine.score import TypeFacts
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.inventory.nodes import slurm_nodes
from slurm_hetero.slurm import sacct
from slurm_hetero.slurm.scontrol import parse_show_node
from tests.conftest import REPO

EXAMPLE = (
    REPO / "gres_conf" / "examples" / "mixed.yaml"
)  # a100_80g x4 (80G), l40s x2 (46068M), ascend910b3 x8
SINCE, UNTIL, NOW = datetime(2026, 11, 2, 10), datetime(2026, 11, 2, 12), datetime(2026, 11, 2, 11, 40)
TRES = "billing=1,cpu=1,gres/gpu={n},gres/gpu:{t}={n},mem=500M,node=1"
SACCT = "\n".join(
    [
        # gpumem:20G rewritten to one l40s: 1 h inside, waited 600 s, stranded (46068 - 20480) MiB for 1 h
        "1|alice|gpu|COMPLETED|2026-11-02T09:50:00|2026-11-02T10:00:00|2026-11-02T11:00:00|"
        + TRES.format(n=1, t="l40s")
        + "|slurm_hetero: gpumem:20G -> gres:gpu:l40s:1 (best-fit)",
        # still running at NOW: 1 h x 2 devices
        "2|alice|nvidia|RUNNING|2026-11-02T10:30:00|2026-11-02T10:40:00|Unknown|"
        + TRES.format(n=2, t="a100_80g")
        + "|",
        # started before the window: half an hour inside, no wait counted
        "3|bob|gpu|COMPLETED|2026-11-02T09:00:00|2026-11-02T09:30:00|2026-11-02T10:30:00|"
        + TRES.format(n=1, t="a100_80g")
        + "|",
        "4|alice|gpu|CANCELLED by 0|2026-11-02T11:00:00|2026-11-02T11:05:00|2026-11-02T11:35:00|"
        + TRES.format(n=1, t="l40s")
        + "|a site note; slurm_hetero: gpumem:40G,gpucore:50 -> gres:gpu:l40s:1 (fastest) [vendor nvidia: n]",
        "5|carol|gpu|PENDING|2026-11-02T11:50:00|Unknown|Unknown||",
    ]
)
LOG = """[2026-11-02T09:59:59.100] slurm_hetero: uid 1000: rejected [NODE_TOO_SMALL]: gpumem:2T: no device
[2026-11-02T10:15:00.001] slurm_hetero: uid 1000: rejected [NODE_TOO_SMALL]: gpumem:2T: largest is a100_80g
[2026-11-02T10:16:00.001] slurm_hetero: uid 1001 edit of job 7: rejected [request]: gpumem:abc: not a size
[2026-11-02T10:17:00.001] sched: Allocate JobId=8 NodeList=l40sn1 #CPUs=1 Partition=gpu
"""
NODES = """NodeName=a100n1 Arch=x86_64 Gres=gpu:a100_80g:4(S:0-7),gpumem:320G,gpucore:400 State=IDLE
NodeName=ascendn1 Gres=gpu:ascend910b3:8(S:0-15),gpumem:512G,gpucore:800 State=IDLE
NodeName=l40sn1 Gres=gpu:l40s:2(S:0-7),gpumem:92136M,gpucore:200 State=IDLE
"""
TRES_LINE = "gres/gpu,gres/gpu:a100_80g,gres/gpu:ascend910b3,gres/gpu:l40s,gres/gpumem,gres/gpucore"


def caps() -> Mapping[str, TypeFacts]:
    return report.capacity(slurm_nodes(inventory.load(EXAMPLE), load_catalog()))


def test_figures_equal_those_computed_by_hand() -> None:
    doc = report.build(
        sacct.parse(SACCT), sacct.parse_refusals(LOG.splitlines()), caps(), SINCE, UNTIL, NOW, "type"
    )
    rows = {r["type"]: r for r in doc["rows"]}
    assert set(rows) == {"a100_80g", "l40s", "ascend910b3"}
    assert (rows["ascend910b3"]["device_hours"], rows["ascend910b3"]["share"]) == (0, 0)  # idle
    assert rows["l40s"]["device_hours"] == pytest.approx(1.5)
    assert rows["l40s"]["share"] == pytest.approx(1.5 / (2 * 2))
    assert rows["a100_80g"]["device_hours"] == pytest.approx(2 + 0.5)
    assert rows["a100_80g"]["share"] == pytest.approx(2.5 / (4 * 2))
    assert (rows["l40s"]["wait_mean_s"], rows["l40s"]["wait_max_s"]) == (450.0, 600.0)
    assert (rows["a100_80g"]["wait_mean_s"], rows["a100_80g"]["jobs"]) == (600.0, 2)
    stranded = (46068 - 20480) / 1024 * 1 + (46068 - 40960) / 1024 * 0.5
    assert rows["l40s"]["stranded_gib_hours"] == pytest.approx(stranded, abs=1e-4)
    assert doc["rewrites"] == {"fastest": 1}  # job 1 was submitted before the window
    assert doc["refusals"] == {"NODE_TOO_SMALL": 1, "request": 1}  # the 09:59:59 one is outside
    assert doc["off_type"] == [{"user": "alice", "typical": "l40s", "ran_on": "a100_80g", "jobs": 1}]
    assert (doc["jobs"], doc["gpu_jobs"]) == (5, 4)


def test_vendor_rows_add_their_types_and_user_rows_split_by_type() -> None:
    jobs = sacct.parse(SACCT)
    by_vendor = report.build(jobs, None, caps(), SINCE, UNTIL, NOW, "vendor")
    ascend, nvidia = by_vendor["rows"]
    assert ascend["vendor"] == "ascend" and ascend["devices"] == 8 and ascend["jobs"] == 0
    assert nvidia["vendor"] == "nvidia" and nvidia["devices"] == 6
    assert nvidia["share"] == pytest.approx(4.0 / (6 * 2), abs=1e-6) and by_vendor["refusals"] is None
    by_user = report.build(jobs, None, caps(), SINCE, UNTIL, NOW, "user")
    assert [(r["user"], r["type"], r["device_hours"]) for r in by_user["rows"]] == [
        ("alice", "a100_80g", 2.0),
        ("alice", "l40s", 1.5),
        ("bob", "a100_80g", 0.5),
    ]


def test_sacct_lines_keep_a_bar_inside_the_admin_comment_and_refuse_short_lines() -> None:
    (job,) = sacct.parse("9|u|p|COMPLETED|2026-11-02T10:00:00|None|Unknown||x | y; slurm_hetero: a -> b (c)")
    assert job.admin_comment == "x | y; slurm_hetero: a -> b (c)" and job.start is None
    assert job.decision == "a -> b (c)"
    with pytest.raises(Exception, match="fields"):
        sacct.parse("9|u|p")
    with pytest.raises(Exception, match="SLURM_TIME_FORMAT"):
        sacct.parse("9|u|p|COMPLETED|Mon 10:00|None|Unknown||")


def test_inventory_and_slurm_disagreements_are_named_per_host() -> None:
    nodes = slurm_nodes(inventory.load(EXAMPLE), load_catalog())
    slurm = {n.name: n for n in parse_show_node(NODES.replace("gpu:a100_80g:4", "gpu:a100_80g:2"))}
    assert report.disagreement("inv.yaml", nodes, slurm) == (
        "inv.yaml disagrees with Slurm's nodes: a100n1: inventory gpu:a100_80g:4, Slurm gpu:a100_80g:2; "
        "pass the inventory the cluster was rendered from, or re-render (gres render) and reconfigure"
    )
    assert report.disagreement("inv.yaml", nodes, {n.name: n for n in parse_show_node(NODES)}) is None


class FakeSlurm:
    """Answers the Slurm commands `report` runs."""

    def __init__(self, tmp_path: Path, **overrides: str) -> None:
        log = tmp_path / "slurmctld.log"
        log.write_text(overrides.pop("log", LOG))
        self.answers = {
            "scontrol show config": f"AccountingStorageType   = accounting_storage/slurmdbd\n"
            f"AccountingStorageTRES   = cpu,mem,energy,node,billing,{TRES_LINE}\n"
            f"SlurmctldLogFile        = {log}\nSlurmUser               = slurm(64030)\n",
            "scontrol show node": NODES,
            "sacct": SACCT,
            "sacctmgr show config": "PrivateData             = jobs,usage\n",
            "squeue": "2                               (null)\n",
        }
        self.answers.update(overrides)

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> str:
        for prefix, text in sorted(self.answers.items(), key=lambda kv: -len(kv[0])):
            if " ".join(argv).startswith(prefix):
                return text
        raise AssertionError(f"unexpected command {argv}")


def run_report(monkeypatch: pytest.MonkeyPatch, fake: FakeSlurm, *args: str):
    monkeypatch.setattr(proc, "run", fake.run)
    window = ["--since", "2026-11-02T10:00", "--until", "2026-11-02T12:00"]
    return CliRunner().invoke(cli, ["report", "--inventory", str(EXAMPLE), *window, *args])


def test_report_json_and_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    result = run_report(monkeypatch, FakeSlurm(tmp_path), "--json", "--plot", str(tmp_path / "r.png"))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["refusals"] == {"NODE_TOO_SMALL": 1, "request": 1} and doc["hours"] == 2
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    text = run_report(monkeypatch, FakeSlurm(tmp_path), "--by", "partition")
    assert text.exit_code == 0 and "PARTITION" in text.stdout and "off-type: alice" in text.stdout


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (
            {"scontrol show config": "AccountingStorageType   = accounting_storage/none\n"},
            "Slurm keeps no job accounting (AccountingStorageType=accounting_storage/none); set "
            "AccountingStorageType=accounting_storage/slurmdbd",
        ),
        (
            {"scontrol show config": "AccountingStorageType   = accounting_storage/none\n"},
            '(docs/admin-guide.md, "Accounting by device type, the usage report and metrics")',
        ),
        (
            {
                "scontrol show config": "AccountingStorageType   = accounting_storage/slurmdbd\n"
                "AccountingStorageTRES   = cpu,mem,gres/gpu\n"
            },
            "AccountingStorageTRES does not name gres/gpu:a100_80g (and 2 more types)",
        ),
        (
            {"scontrol show node": NODES.replace("NodeName=l40sn1", "NodeName=l40sn2")},
            "disagrees with Slurm's nodes: l40sn1: inventory gpu:l40s:2, Slurm nothing (and 1 more)",
        ),
        (
            {"sacct": "", "log": ""},
            "no jobs between 2026-11-02T10:00:00 and 2026-11-02T12:00:00; widen --since/--until",
        ),
    ],
)
def test_bad_input_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict[str, str], said: str
) -> None:
    result = run_report(monkeypatch, FakeSlurm(tmp_path, **overrides))
    assert result.exit_code == 1 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("slurm-hetero: ") and said in line, line


def test_a_user_whom_private_data_hides_other_jobs_is_told_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_hetero.cli import report as cli_report

    monkeypatch.setattr(cli_report.os, "geteuid", lambda: 4242)
    monkeypatch.setattr(cli_report.pwd, "getpwuid", lambda uid: type("E", (), {"pw_name": "alice"}))
    result = run_report(monkeypatch, FakeSlurm(tmp_path), "--json")
    assert result.exit_code == 0
    assert "PrivateData=jobs shows you only your own jobs" in result.stderr
    open_data = FakeSlurm(tmp_path, **{"sacctmgr show config": "PrivateData             = none\n"})
    assert "PrivateData" not in run_report(monkeypatch, open_data, "--json").stderr
    empty = run_report(monkeypatch, FakeSlurm(tmp_path, sacct="", log=""))
    assert empty.exit_code == 1 and empty.stderr == (
        "slurm-hetero: none of your jobs between 2026-11-02T10:00:00 and 2026-11-02T12:00:00, and Slurm's "
        "PrivateData=jobs shows you only your own; run as root or SlurmUser to see every job, or widen "
        "--since/--until\n"
    )


def test_the_rewrite_reason_is_the_policy_the_hook_names() -> None:
    shard = "gpumem:20G -> gres:shard:5 constraint l40s (best-fit, shares of l40s) [vendor nvidia: x (y)]"
    assert report.rewrite_reason(shard) == "best-fit"
    assert report.rewrite_reason("gpumem:20G -> gres:gpu:l40s:1") == "rewritten"
    assert report.rewrite_reason("something else") is None


def test_times_are_read_or_refused_in_one_line() -> None:
    from slurm_hetero.cli.report import parse_when
    from slurm_hetero.core.errors import HeteroError

    assert parse_when("now-2h", NOW) == datetime(2026, 11, 2, 9, 40)
    assert parse_when("2026-11-01", NOW) == datetime(2026, 11, 1)
    for bad in ("yesterday", "now-99999999d", "now-1w"):
        with pytest.raises(HeteroError):
            parse_when(bad, NOW)


def test_a_log_the_user_names_must_be_readable_as_metrics_requires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_report(monkeypatch, FakeSlurm(tmp_path), "--log", str(tmp_path / "absent.log"))
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == f"slurm-hetero: {tmp_path / 'absent.log'}: no such slurmctld log\n"
    fake = FakeSlurm(tmp_path)
    (tmp_path / "slurmctld.log").unlink()  # SlurmctldLogFile not on this host: a note, refusals unknown
    result = run_report(monkeypatch, fake, "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["refusals"] is None
    assert "refusals not counted" in result.stderr


def test_a_hung_sacct_ends_in_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_hetero.core.errors import ToolError

    hung = tmp_path / "sacct"
    hung.write_text("#!/bin/sh\nsleep 30\n")
    hung.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.raises(ToolError) as raised:
        sacct.jobs(SINCE, UNTIL, timeout=0.5)
    assert str(raised.value).startswith("`sacct -a -X -P -n -S 2026-11-02T10:00:00")
    assert str(raised.value).endswith("failed (timed out after 0.5s)") and raised.value.exit_code == 3


def test_plot_names_a_file_of_a_known_format_and_is_written_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    for bad in (tmp_path, tmp_path / "chart", tmp_path / "chart.txt"):
        result = run_report(monkeypatch, FakeSlurm(tmp_path, sacct="never run"), "--plot", str(bad))
        assert result.exit_code == 1 and result.stdout == "", result.output
        assert (
            result.stderr
            == f"slurm-hetero: --plot {bad}: "
            + ("a directory; " if bad == tmp_path else "")
            + "name a file ending in .png, .svg, .pdf"
            + ("" if bad == tmp_path else " (the chart's format)")
            + "\n"
        )
    assert not (tmp_path / "chart.png").exists() and not tmp_path.with_suffix(".png").exists()
    pytest.importorskip("matplotlib")
    old = tmp_path / "r.svg"
    old.write_text("old chart")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("slurm_hetero.core.writefile.os.fsync", full)
    result = run_report(monkeypatch, FakeSlurm(tmp_path), "--plot", str(old))
    assert result.exit_code == 1 and "No space left on device; nothing changed" in result.stderr
    assert old.read_text() == "old chart" and [p.name for p in tmp_path.glob(".r.svg*")] == []


def test_the_window_ends_now_at_the_latest_and_starts_where_slurm_keeps_time() -> None:
    from slurm_hetero.cli.report import window
    from slurm_hetero.core.errors import HeteroError

    assert window("2026-11-02T10:00", "2030-01-01", NOW) == (datetime(2026, 11, 2, 10), NOW)
    assert window("now-1h", "now", NOW) == (datetime(2026, 11, 2, 10, 40), NOW)
    for since, said in [
        ("0001-01-01", "--since 0001-01-01: before 1970-01-01"),
        ("2026-11-02T12:00", "--since 2026-11-02T12:00 is not before --until 2030-01-01 (nor before now)"),
    ]:
        with pytest.raises(HeteroError, match=re.escape(said)) as raised:
            window(since, "2030-01-01", NOW)
        assert raised.value.exit_code == 1


def test_a_future_until_is_clamped_to_now_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proc, "run", FakeSlurm(tmp_path).run)
    args = ["report", "--inventory", str(EXAMPLE), "--since", "2026-11-02T10:00", "--until", "2999-01-01"]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["until"] < "2999"
    assert "--until 2999-01-01 is past now: the report ends now" in result.stderr


def test_the_accounting_section_the_messages_name_is_in_the_admin_guide() -> None:
    from slurm_hetero.cli.report import ACCOUNTING_SECTION

    titles = re.findall(r"^## (?:\d+\. )?(.+)$", (REPO / "docs" / "admin-guide.md").read_text(), re.M)
    assert ACCOUNTING_SECTION in titles


def test_running_jobs_count_the_comment_squeue_shows_until_sacct_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # slurmdbd gets AdminComment when a job ends: sacct prints it empty for running job 2
    queued = "2                               slurm_hetero: gpumem:60G -> gres:gpu:a100_80g:2 (best-fit)\n"
    result = run_report(monkeypatch, FakeSlurm(tmp_path, squeue=queued), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["rewrites"] == {"best-fit": 1, "fastest": 1}  # job 2 was submitted inside the window
    a100 = next(r for r in doc["rows"] if r["type"] == "a100_80g")
    # the window ends at 12:00, before the real now: job 2 ran 10:40 .. 12:00 inside it
    assert a100["stranded_gib_hours"] == pytest.approx((81920 - 61440) / 1024 * 2 * 80 / 60, abs=1e-4)


def test_log_lines_with_an_empty_or_huge_reason_code_are_not_refusals() -> None:
    """adv34 G13: `rejected []` was counted, and a 10 KB code printed whole and exported as a
    Prometheus label; the hook writes short word codes only."""
    stamp = "[2026-11-02T10:15:00.001] slurm_hetero: uid 1000: rejected "
    lines = [
        stamp + "[]: x",
        stamp + f"[{'A' * 10_000}]: x",
        stamp + "[a b]: x",
        stamp + "[request]: gpumem:abc",
    ]
    assert [r.reason for r in sacct.parse_refusals(lines)] == ["request"]


def test_build_refuses_an_unknown_grouping() -> None:
    from slurm_hetero.core.errors import HeteroError

    at = datetime(2026, 11, 30)
    with pytest.raises(HeteroError, match="--by node"):
        report.build([], None, {}, at, at, at, by="node")
