"""gres render --slurm-release: 22.05 output is today's (golden), later releases get whole-socket
Cores= (Slurm 24.11 marks a node INVALID otherwise; measured on the dev cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.cli import gres as gres_cli
from slurm_hetero.core.errors import ConfigError, ToolError
from slurm_hetero.inventory import document as inventory
from slurm_hetero.inventory.catalog import load_catalog
from slurm_hetero.render.context import RenderOptions, build_context
from slurm_hetero.render.templates import _whole_sockets, release_key, render_configs
from tests.conftest import REPO

EXAMPLE = REPO / "gres_conf" / "examples" / "mixed.yaml"
SPLIT = """version: 1
nodes:
  - name: n[1-2]
    cpus: 16
    sockets: 2
    cores_per_socket: 8
    threads_per_core: 1
    devices:
      - {vendor: nvidia, model: NVIDIA L40S, type: l40s, index: 0, file: /dev/nvidia0,
         memory_mib: 46068, cores: 0-3}
      - {vendor: nvidia, model: NVIDIA L40S, type: l40s, index: 1, file: /dev/nvidia1,
         memory_mib: 46068, cores: 8-15}
  - name: flat1
    cpus: 16
    devices:
      - {vendor: nvidia, model: NVIDIA L40S, type: l40s, index: 0, file: /dev/nvidia0,
         memory_mib: 46068, cores: 0-3}
"""


def rendered(path: Path, release: str | None) -> dict[str, str]:
    context = build_context(inventory.load(path), load_catalog(), RenderOptions())
    context["source"] = path.name
    return render_configs(context, slurm_release=release)


@pytest.mark.parametrize(
    ("cores", "per_socket", "expected"),
    [("0-1", 4, "0-3"), ("4-7", 4, "4-7"), ("0-1,9", 4, "0-3,8-11"), ("3-4", 4, "0-7"), ("5", 1, "5")],
)
def test_whole_sockets(cores: str, per_socket: int, expected: str) -> None:
    assert _whole_sockets(cores, per_socket) == expected


def test_22_05_is_the_golden_output_and_24_11_changes_nothing_without_socket_layout() -> None:
    golden = {
        name: (EXAMPLE.with_name(f"mixed.{name}.example")).read_text() for name in rendered(EXAMPLE, None)
    }
    assert rendered(EXAMPLE, "22.05") == golden
    assert rendered(EXAMPLE, None) == golden  # the default release is 22.05
    assert rendered(EXAMPLE, "24.11") == golden  # no node of the example declares its sockets


def test_24_11_widens_split_sockets_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "split.yaml"
    path.write_text(SPLIT)
    old, new = rendered(path, "22.05")["gres.conf"], rendered(path, "24.11")["gres.conf"]
    assert "NodeName=n[1-2] Name=gpu Type=l40s File=/dev/nvidia0 Cores=0-3 Flags=nvidia_gpu_env\n" in old
    assert "NodeName=n[1-2] Name=gpu Type=l40s File=/dev/nvidia0 Cores=0-7 Flags=nvidia_gpu_env\n" in new
    assert "File=/dev/nvidia1 Cores=8-15 Flags" in old and "File=/dev/nvidia1 Cores=8-15 Flags" in new
    assert "# note: n[1-2]: gpu l40s /dev/nvidia0: Cores=0-3 widened to whole sockets, Cores=0-7" in new
    # one core per socket
    assert "NodeName=flat1 Name=gpu Type=l40s File=/dev/nvidia0 Cores=0-3 Flags=nvidia_gpu_env\n" in new
    assert rendered(path, "23.11") == rendered(path, "24.11")


def test_release_values() -> None:
    assert release_key("24.11") == (24, 11) and release_key("22.05.8") == (22, 5)
    for bad in ("24", "24.11.x", "v24.11", ""):
        with pytest.raises(ConfigError):
            release_key(bad)


def test_the_default_release_comes_from_scontrol(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gres_cli.proc, "run", lambda argv, timeout=60.0: "slurm-wlm 24.11.5\n")
    assert gres_cli.local_slurm_release() == "24.11"

    def missing(argv: list[str], timeout: float = 60.0) -> str:
        raise ToolError(argv, None, "No such file or directory")

    monkeypatch.setattr(gres_cli.proc, "run", missing)
    assert gres_cli.local_slurm_release() == "22.05"


def test_cli_option(tmp_path: Path) -> None:
    path = tmp_path / "split.yaml"
    path.write_text(SPLIT)
    args = ["gres", "render", "--inventory", str(path), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(cli, [*args, "--slurm-release", "24.11", "--json"])
    assert result.exit_code == 0, result.output
    assert '"slurm_release": "24.11"' in result.stdout
    assert "Cores=0-7" in (tmp_path / "out" / "gres.conf").read_text()
    result = CliRunner().invoke(cli, [*args, "--slurm-release", "latest"])
    assert result.exit_code == 1 and "is not YY.MM" in result.stderr
