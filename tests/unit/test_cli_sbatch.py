"""`slurm-hetero sbatch`: gpumem from the fit engine, merged into the user's sbatch arguments."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.cli.sbatch import device_count, with_gpumem
from slurm_hetero.errors import HeteroError


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_device_count_from_sbatch_options() -> None:
    assert device_count(["--gpus=4", "x.sh"]) == 4
    assert device_count(["-G", "2", "x.sh"]) == 2
    assert device_count(["--gpus-per-node=a100_80g:8", "x.sh"]) == 8
    assert device_count(["-p", "gpu", "x.sh"]) == 1
    with pytest.raises(HeteroError, match="expected a device count"):
        device_count(["--gpus=lots"])


def test_gpumem_is_merged_into_an_existing_gres() -> None:
    assert with_gpumem(["--gres=gpucore:50", "x.sh"], 20) == ["--gres=gpucore:50,gpumem:20G", "x.sh"]
    assert with_gpumem(["x.sh", "--gres=not-mine"], 7) == ["x.sh", "--gres=not-mine,gpumem:7G"]
    assert with_gpumem(["-N1", "x.sh"], 7) == ["--gres=gpumem:7G", "-N1", "x.sh"]
    with pytest.raises(HeteroError, match="already has gpumem"):
        with_gpumem(["--gres=gpumem:1G"], 2)


def test_dry_run_prints_the_command_with_the_fitted_gpumem() -> None:
    code, out, err = run(
        "sbatch",
        "--model",
        "llama-3-8b",
        "--mode",
        "infer",
        "--seq",
        "4096",
        "--dry-run",
        "--gpus=2",
        "-p",
        "gpu",
        "serve.sh",
        "--port",
        "8000",
    )
    assert code == 0, err
    assert out.startswith("sbatch --gres=gpumem:") and out.rstrip().endswith(
        "--gpus=2 -p gpu serve.sh --port 8000"
    )
    gib = int(out.split("gpumem:")[1].split("G")[0])
    assert 8 <= gib <= 16  # 16 GB of bf16 weights split over 2 devices, plus KV cache and overhead
    assert "llama-3-8b infer needs" in err


def test_training_needs_more_than_inference_and_bad_models_are_one_line_errors() -> None:
    _, train, _ = run("sbatch", "--model", "llama-3-8b", "--dry-run", "x.sh")
    _, infer, _ = run("sbatch", "--model", "llama-3-8b", "--mode", "infer", "--dry-run", "x.sh")
    assert int(train.split("gpumem:")[1].split("G")[0]) > int(infer.split("gpumem:")[1].split("G")[0])
    code, _, err = run("sbatch", "--model", "no-such-model", "--dry-run", "x.sh")
    assert code == 1 and err.startswith("slurm-hetero: unknown model")
