"""Settings against the cluster they are rendered for (`config.check_for_cluster`), through
`job-submit render`: a name the cluster lacks is one line, exit 1, and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_hetero.cli import cli
from tests.conftest import REPO

EXAMPLE = REPO / "gres_conf" / "examples" / "mixed.yaml"  # a100_80g, ascend910b3, l40s (46068M)


def render(tmp_path: Path, settings: str) -> tuple[int, str, Path]:
    config, out = tmp_path / "config.yaml", tmp_path / "out"
    config.write_text(settings)
    out.mkdir()
    argv = ["job-submit", "render", "--inventory", str(EXAMPLE), "--out", str(out), "--config", str(config)]
    result = CliRunner().invoke(cli, argv)
    return result.exit_code, result.stderr, out


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (  # issue 26 repro 6
            "job_submit: {default_partition: nosuch}",
            "job_submit.default_partition: 'nosuch' is not a partition the hook knows (ascend, gpu, nvidia)",
        ),
        ("scoring: {allow_types: [nosuch]}", "scoring.allow_types: no device type 'nosuch' in this cluster"),
        (
            "scoring: {deny_types: [l40]}",
            "scoring.deny_types: no device type 'l40' in this cluster; types: a100_80g",
        ),
        ("partitions: {x: {allow_types: [h100]}}", "partitions.x.allow_types: no device type 'h100'"),
        ("partitions: {x: {deny_types: [h100]}}", "partitions.x.deny_types: no device type 'h100'"),
        (
            "sharing: {shard_size: {l40s: 100G}}",
            "shard size l40s=100G (sharing.shard_size or --share): larger",
        ),
        (
            "sharing: {shard_size: {l4: 4G}}",
            "shard size l4=4G (sharing.shard_size or --share): no device of type",
        ),
    ],
)
def test_a_setting_naming_what_the_cluster_lacks_is_refused(tmp_path: Path, settings: str, said: str) -> None:
    code, err, out = render(tmp_path, settings)
    assert code == 1 and said in err and err.count("\n") == 1, err
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (
            "sharing: {shard_size: {l40s: 0x10}}",
            "config.yaml: line 1: l40s: 0x10 is 16 written in a form slurm-hetero does not read; write 16",
        ),
        (
            "sharing: {shard_size: {l40s: 010}}",
            "line 1: l40s: 010 is ambiguous (8 in YAML 1.1, 10 in YAML 1.2)",
        ),
        ("partitions: {'bad name,x': {}}", "partitions.bad name,x: expected a partition name:"),
        ("partitions: {'a,b': {}}", "partitions.a,b: expected a partition name:"),
        (
            "job_submit: {exempt_users: [root, -1]}",
            "job_submit.exempt_users[1]: -1 is not a user name or a uid",
        ),
        (
            "job_submit: {exempt_users: [4294967295]}",
            "4294967295 is not a user name or a uid (0 to 4,294,967,294)",
        ),
        ("job_submit: {exempt_users: ['a b']}", "job_submit.exempt_users[0]: 'a b' is not a user name"),
        ("job_submit: {exempt_users: [1e20]}", "1e20 is ambiguous"),
        (
            "job_submit: {default_partition: 5}",
            "job_submit.default_partition: expected a partition name (text), got 5",
        ),
    ],
)
def test_a_setting_of_the_wrong_form_is_refused(tmp_path: Path, settings: str, said: str) -> None:
    """adv26 js-share_hex, gr-share_hex (0x10 read as 16 MiB: 2,879 shards), js-part_badname,
    js-exempt_int (uids -1 and 1e20 accepted), and a non-text default_partition's wording."""
    code, err, out = render(tmp_path, settings)
    assert code == 1 and said in err and err.count("\n") == 1, err
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    "settings",
    [
        "job_submit: {default_partition: ascend}",
        "partitions: {batch: {}}\njob_submit: {default_partition: batch}",
        "scoring: {allow_types: [l40s, a100_80g]}\npartitions: {x: {deny_types: [ascend910b3]}}",
        "sharing: {shard_size: {l40s: 46068M}}",
    ],
)
def test_settings_naming_the_clusters_own_are_rendered(tmp_path: Path, settings: str) -> None:
    code, err, out = render(tmp_path, settings)
    assert code == 0 and (out / "job_submit.lua").exists(), err
