"""proc.run, the one process runner: whatever a tool prints or however it hangs, the caller gets
text or one ToolError, in bounded time and memory, and nothing the tool started outlives it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from slurm_hetero.core import proc
from slurm_hetero.core.errors import ToolError


def sh(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "tool"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return [str(script)]


def test_output_that_is_not_utf8_is_text_with_replacement_characters(tmp_path: Path) -> None:
    """adv26 h-*-garbage/latin1: random or latin-1 bytes were a UnicodeDecodeError traceback."""
    out = proc.run(sh(tmp_path, r"printf 'caf\351 \377\376 ok\r\n'"))
    assert out == "caf\ufffd \ufffd\ufffd ok\n"


def test_a_failing_tool_reports_its_exit_code_and_last_stderr_line(tmp_path: Path) -> None:
    with pytest.raises(ToolError) as e:
        proc.run(sh(tmp_path, r"printf 'first\n\377 driver gone\n' >&2; exit 4"))
    assert e.value.rc == 4 and str(e.value).endswith("failed (exit code 4): \ufffd driver gone")


def test_a_tool_that_floods_its_output_is_killed_at_the_cap(tmp_path: Path) -> None:
    """adv26 h-asc-flood: `yes` as npu-smi grew health's memory by 200 MB/s without end."""
    started = time.monotonic()
    with pytest.raises(ToolError, match=r"failed \(printed more than 1 MiB; killed\)"):
        proc.run(sh(tmp_path, "exec yes"), timeout=30, max_output=2**20)
    assert time.monotonic() - started < 10


def test_output_at_the_cap_is_read_whole(tmp_path: Path) -> None:
    out = proc.run(sh(tmp_path, "head -c 1048576 /dev/zero | tr '\\0' x"), max_output=2**20)
    assert len(out) == 2**20


def test_a_hung_tool_is_killed_with_its_children(tmp_path: Path) -> None:
    """adv26 h-asc-hang-orphan: a shell script's `sleep` outlived the timeout."""
    pid_file = tmp_path / "sleep.pid"
    with pytest.raises(ToolError, match=r"failed \(timed out after 0.5s\)"):
        proc.run(sh(tmp_path, f"sleep 300 & echo $! > {pid_file}; wait"), timeout=0.5)
    pid = int(pid_file.read_text())
    for _ in range(50):  # SIGKILL is delivered at once; reaping by init may take a moment
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(") ")[1].startswith("Z"):
                return
        time.sleep(0.1)
    pytest.fail(f"the tool's child {pid} outlived the timeout")


def test_a_missing_tool_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match=r"failed \(not found\)"):
        proc.run([str(tmp_path / "nosuch")])


@pytest.mark.parametrize("delay", [-1.0, float("nan"), float("inf")])
def test_run_later_refuses_a_delay_that_is_not_seconds(delay: float) -> None:
    with pytest.raises(ValueError, match="run_later"):
        proc.run_later([(delay, ["true"])])
