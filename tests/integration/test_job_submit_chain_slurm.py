"""`job-submit render --chain` in the real slurmctld (both releases): the generated job_submit.lua
runs a site's own hook and slurm-hetero's, in the order asked; then the plain hook is restored."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Cluster, slurm
from tests.integration.test_job_submit_slurm import as_user, job_fields, render_hook


def site(cluster: Cluster) -> Path:
    """The site's hook; /tmp: the same path for a chrooted slurmctld (its root mounts it)."""
    return Path(f"/tmp/slurm-hetero-test-site-job-submit-{cluster.name}.lua")


SITE_HOOK = """
function slurm_job_submit(job_desc, part_list, submit_uid)
  if job_desc.name == "refused-by-site" then
    slurm.log_user("site policy: this job name is not allowed")
    return slurm.ERROR
  end
  job_desc.comment = "site saw " .. tostring(job_desc.tres_per_node)
  return slurm.SUCCESS
end
"""


def render_chain(cluster: Cluster, config: Path, order: str, text: str = SITE_HOOK) -> None:
    site(cluster).write_text(text)
    render_hook(cluster.inventory, config, "--chain", str(site(cluster)), "--chain-order", order)
    time.sleep(2)


@pytest.fixture
def chained(dev_cluster: Cluster, suite_config: Path) -> Iterator[Cluster]:
    try:
        yield dev_cluster
    finally:
        render_hook(dev_cluster.inventory, suite_config)
        site(dev_cluster).unlink(missing_ok=True)
        time.sleep(2)


def held(*options: str) -> subprocess.CompletedProcess:
    return as_user("sbatch", "--parsable", "-H", *options, "-o", "/dev/null", "--wrap", "true")


@pytest.mark.parametrize("order", ["site-first", "ours-first"])
def test_a_chained_site_hook_and_ours_both_decide(chained: Cluster, suite_config: Path, order: str) -> None:
    render_chain(chained, suite_config, order)
    run = held("--gres=gpumem:20G")
    assert run.returncode == 0, run.stderr
    fields = job_fields(run.stdout.strip().split(";")[0])
    slurm("scancel", fields["JobId"])
    assert fields["AdminComment"].startswith("slurm_hetero: gpumem:20G -> "), fields  # ours decided
    seen = fields["Comment"].removeprefix("site saw ")  # what the site's hook was shown
    if order == "site-first":
        assert seen in ("gres:gpumem:20G", "gres/gpumem:20G"), fields
    else:
        assert seen == fields["TresPerNode"] and seen not in ("gres:gpumem:20G", "gres/gpumem:20G"), fields
    refused = held("-J", "refused-by-site", "--gres=gpumem:20G")
    assert refused.returncode != 0 and "site policy: this job name is not allowed" in refused.stderr
    refused = held("--gres=gpumem:9000G")
    assert refused.returncode != 0 and "gpumem" in refused.stderr


def test_a_site_hook_that_fails_to_load_or_never_returns_refuses_jobs_naming_it(
    chained: Cluster, suite_config: Path
) -> None:
    # an error at load used to make slurmctld keep its previous job_submit.lua (our old table with
    # it, "using previous script"); an endless loop held slurmctld's job_submit lock for good
    render_chain(chained, suite_config, "site-first", "local policy = nil\npolicy.check()\n" + SITE_HOOK)
    refused = held("--gres=gpumem:20G")
    assert refused.returncode != 0, refused.stdout
    assert f"slurm_hetero chain: the site's hook {site(chained)} did not load (" in refused.stderr, (
        refused.stderr
    )
    assert "attempt to index" in refused.stderr, refused.stderr
    forever = "function() while true do end end"
    loops = "if job_desc.name == 'loops' then while true do end end\n"
    loops += f"if job_desc.name == 'in-coroutine' then coroutine.wrap({forever})() end\n"
    loops += f"if job_desc.name == 'in-handler' then xpcall({forever}, {forever}) end\n"
    site(chained).write_text(SITE_HOOK.replace("  if job_desc.name", "  " + loops + "  if job_desc.name", 1))
    run = held("--gres=gpumem:20G")  # read again when its text changed: no touch, no reconfigure
    assert run.returncode == 0, run.stderr
    fields = job_fields(run.stdout.strip().split(";")[0])
    slurm("scancel", fields["JobId"])
    assert fields["AdminComment"].startswith("slurm_hetero: gpumem:20G -> "), fields
    assert fields["Comment"] in ("site saw gres:gpumem:20G", "site saw gres/gpumem:20G"), fields
    for name in ("loops", "in-coroutine", "in-handler"):  # the last two wedged slurmctld (adv22b)
        refused = held("-J", name, "--gres=gpumem:20G")
        assert refused.returncode != 0, refused.stdout
        assert (
            f"the site's hook {site(chained)} ran past " in refused.stderr and "was stopped" in refused.stderr
        )
    run = held("--gres=gpumem:20G")  # slurmctld goes on
    assert run.returncode == 0, run.stderr
    slurm("scancel", run.stdout.strip().split(";")[0])
