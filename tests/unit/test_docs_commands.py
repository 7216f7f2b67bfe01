"""Docs are tests: every command README.md and docs/ show runs as written, or carries a visible
`# not run here: <why>` marker (tests/doccommands.py has the rules).

Here: the commands that need no Slurm, each in a fresh directory holding what the docs assume
(cluster.yaml, the captures an admin copied, train.sh, ...), in document order within a file.
Those that need Slurm run against the dev cluster on both releases in
tests/integration/test_docs_commands_slurm.py. A new command that fails here names its file and
line: make it work, or mark it with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import FIXTURES, REPO
from tests.doccommands import DocCommand, all_commands
from tests.hosttree import ATLAS, sysfs_tree

EXAMPLE = REPO / "gres_conf" / "examples" / "mixed.yaml"
COMMANDS = all_commands()
LOCAL = [c for c in COMMANDS if not c.marked and not c.needs_slurm]


def sandbox(directory: Path, inventory: Path = EXAMPLE) -> dict[str, str]:
    """What the docs' commands assume, in `directory`; returns the environment to run them in
    (`slurm-hetero` is this checkout's)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(inventory, directory / "cluster.yaml")
    nodes = yaml.safe_load(inventory.read_text())["nodes"]
    (directory / "nodes.jsonl").write_text(
        "".join(json.dumps({"version": 1, "nodes": [n]}) + "\n" for n in nodes)
    )
    for script in ("train.sh", "serve.sh", "infer.sh", "x.sh"):
        (directory / script).write_text("#!/bin/bash\nhostname\n")
        (directory / script).chmod(0o755)
    (directory / "train.py").write_text("print('train.py ran')\n")
    ascend = FIXTURES / "ascend"
    shutil.copyfile(ascend / "npu-smi-info_8x-910b3_drv24.1.rc1.txt", directory / "npu-smi-info.txt")
    shutil.copyfile(
        ascend / "npu-smi-info-t-topo_8x-910b3_hccs_cpu-affinity.txt", directory / "npu-smi-topo.txt"
    )
    if not (directory / "npu07-topo").exists():
        sysfs_tree(directory / "npu07-topo", ATLAS)
    (directory / "my-model").mkdir(exist_ok=True)
    shutil.copyfile(
        REPO / "slurm_hetero" / "data" / "hf_configs" / "mistral-7b.json",
        directory / "my-model" / "config.json",
    )
    bin_dir = directory / ".bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "slurm-hetero").write_text(f'#!/bin/sh\nexec {sys.executable} -m slurm_hetero "$@"\n')
    (bin_dir / "slurm-hetero").chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "HOME": str(directory),
    }


def check(command: DocCommand, result: subprocess.CompletedProcess) -> None:
    """The exit status the docs promise: 0, non-zero for a documented refusal, 0 or 1 for `exit 1 if`."""
    ok = (
        result.returncode != 0
        if command.expects_failure
        else result.returncode in ((0, 1) if command.may_exit_1 else (0,))
    )
    assert ok, (
        f"{command.where}: the documented command exits {result.returncode}; make it work as written, "
        f"or mark it `# not run here: <why>`:\n{command.text}\n"
        f"--- output ---\n{(result.stdout + result.stderr)[-3000:]}"
    )


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, tuple[Path, dict[str, str]]]:
    """One sandbox per document, shared by its commands (a later command may use an earlier one's file)."""
    root = tmp_path_factory.mktemp("docs")
    return {path: (root / path.stem, sandbox(root / path.stem)) for path in {c.path for c in LOCAL}}


@pytest.mark.parametrize("command", LOCAL, ids=lambda c: c.where)
def test_a_documented_command_runs_as_written(
    command: DocCommand, workdirs: dict[Path, tuple[Path, dict[str, str]]]
) -> None:
    directory, env = workdirs[command.path]
    result = subprocess.run(
        ["bash", "-c", command.text], cwd=directory, env=env, capture_output=True, text=True, timeout=600
    )
    check(command, result)


def test_every_command_runs_somewhere_or_says_why_not() -> None:
    slurm = [c for c in COMMANDS if c.needs_slurm and not c.marked]
    marked = [c for c in COMMANDS if c.marked]
    print(
        f"documented commands: {len(COMMANDS)}; run here {len(LOCAL)}, "
        f"on the dev cluster {len(slurm)}, marked {len(marked)}"
    )
    for command in marked:
        assert len(command.marked or "") >= 10, f"{command.where}: say why it cannot run here"
    assert len(LOCAL) + len(slurm) + len(marked) == len(COMMANDS)
    assert len(LOCAL) >= 15 and len(slurm) >= 10  # the extraction finds the docs' commands


def test_the_nhc_recipe_keeps_its_timeout_within_nhcs_own() -> None:
    """NHC's check_cmd_status refuses `-t` above NHC's TIMEOUT (30 s unless raised): "Command
    timeout 60 exceeds NHC timeout 30" (lbnl_cmd.nhc). Debian ships no NHC package to run it."""
    import re

    text = (REPO / "docs" / "admin-guide.md").read_text()
    timeouts = [int(t) for t in re.findall(r"check_cmd_status -t (\d+)", text)]
    assert timeouts and all(t <= 30 for t in timeouts), timeouts
