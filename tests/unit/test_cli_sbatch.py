"""`slurm-hetero sbatch`: the script's request merged with fit's figure and checked against the
cluster (gres_conf/examples/mixed.yaml: a100_80g 80G x 4 per node, l40s, ascend910b3 64G)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_hetero.cli import cli
from tests.conftest import REPO

INVENTORY = str(REPO / "gres_conf" / "examples" / "mixed.yaml")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def wrapper(*args: str) -> dict[str, Any]:
    code, out, err = run("sbatch", "--inventory", INVENTORY, "--json", *args)
    assert code == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


def script(tmp_path: Path, *directives: str) -> str:
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\n" + "".join(f"#SBATCH {d}\n" for d in directives) + "srun hostname\n")
    return str(path)


def test_a_named_type_in_the_script_is_kept_and_checked(tmp_path: Path) -> None:
    job = script(tmp_path, "--gres=gpu:a100_80g:2", "-J train")
    data = wrapper("--model", "llama-3-8b", job)
    assert data["argv"] == ["sbatch", job]  # nothing replaced: the script's own request stands
    assert data["components"][0]["devices"] == 2
    code, _, err = run(
        "sbatch", "--inventory", INVENTORY, "--model", "llama-3-8b", "--mode", "train", "--dry-run", job
    )
    assert code == 1
    assert "llama-3-8b needs 130.6 GiB per device on 2 device(s); a100_80g has 80G" in err
    assert "would fit with --zero 3: --gpus=a100_80g:2" in err


def test_gpumem_only_where_no_type_is_named_and_the_command_line_wins(tmp_path: Path) -> None:
    job = script(tmp_path, "--gpus=4", "--gres=gpucore:50", "-p", "gpu")
    data = wrapper("--model", "llama-3-8b", job, "--lr", "1")
    gres = data["components"][0]["gres"]
    assert gres.startswith("gpucore:50,gpumem:") and data["argv"] == [
        "sbatch",
        f"--gres={gres}",
        job,
        "--lr",
        "1",
    ]
    assert data["components"][0]["devices"] == 4
    over = wrapper("--model", "llama-3-8b", "--gpus=a100_80g:2", job)  # the command line names a type
    assert over["argv"] == ["sbatch", "--gpus=a100_80g:2", job] and over["components"][0]["devices"] == 2
    bare = wrapper("--model", "llama-3-8b", script(tmp_path, "-J bare"))
    assert bare["components"][0]["devices"] == 1 and "gpumem:" in bare["argv"][1]
    code, _, err = run("sbatch", "--inventory", INVENTORY, "--model", "gpt2", script(tmp_path, "-N 2"))
    assert code == 1 and "1 per node on 2 node(s)" in err  # every type sits on one host here


def test_het_components_get_their_own_groups(tmp_path: Path) -> None:
    job = script(tmp_path, "-p a --gres=gpu:a100_80g:1", "hetjob", "-p b --gpus=1")
    data = wrapper("--model", "gpt2", "-t", "5", job)
    assert data["argv"][:2] == ["sbatch", "-t"] and ":" in data["argv"]
    second = data["argv"][data["argv"].index(":") + 1 :]
    assert second[:2] == ["-t", "5"] and second[2].startswith("--gres=gpumem:") and second[-1] == job


@pytest.mark.parametrize(
    "fit_args,devices,wrapper_args",
    [
        (["--mode", "infer", "--tp", "2"], 2, []),
        (["--mode", "train", "--zero", "3", "--dp", "4"], 4, ["--mode", "train", "--zero", "3"]),
        (
            ["--mode", "train", "--dp", "2", "--tp", "2", "--seq", "4096"],
            4,
            ["--mode", "train", "--tp", "2", "--seq", "4096"],
        ),
        (
            ["--mode", "train", "--recompute", "full", "--attention", "eager", "--dtype", "fp16"],
            1,
            ["--mode", "train", "--recompute", "full", "--attention", "eager", "--dtype", "fp16"],
        ),
    ],
)
def test_the_wrapper_figure_is_fits(
    fit_args: list[str], devices: int, wrapper_args: list[str], tmp_path: Path
) -> None:
    code, out, err = run("fit", "--model", "llama-3-8b", "--json", *fit_args)
    assert code == 0, err
    fitted = json.loads(out)["total_bytes"]
    job = script(tmp_path, f"--gpus={devices}")
    code, out, err = run(
        "sbatch", "--inventory", INVENTORY, "--json", "--model", "llama-3-8b", *wrapper_args, job
    )
    if code == 0:
        assert json.loads(out)["components"][0]["per_device_bytes"] == fitted
    else:  # refused: the message carries the same figure
        assert f"needs {fitted / 2**30:.1f} GiB per device on {devices} device(s)" in err


def test_requests_no_device_holds_are_refused_before_sbatch(tmp_path: Path) -> None:
    job = script(tmp_path, "--gres=gpumem:1098G")
    code, out, err = run("sbatch", "--inventory", INVENTORY, job)
    assert code == 1 and out == ""
    assert err.strip() == (
        "slurm-hetero: the job: gpumem:1098G x 1 device(s): no device has it "
        "(largest device: 80G on a100_80g)"
    )
    code, _, err = run(
        "sbatch", "--inventory", INVENTORY, "--model", "llama-3-70b", "--mode", "train", script(tmp_path)
    )
    assert (
        code == 1
        and "needs 1097.7 GiB per device on 1 device(s)" in err
        and "largest device: 80G on a100_80g" in err
    )
    code, _, err = run(
        "sbatch", "--inventory", INVENTORY, "--model", "llama-3-70b", "--dry-run", script(tmp_path)
    )
    assert code == 1 and "would fit: --gpus=a100_80g:2" in err
    code, _, err = run("sbatch", "--inventory", INVENTORY, "--gres=gpu:h100:1", job)
    assert code == 1 and "gpu type 'h100', which the cluster lacks" in err
    code, _, err = run("sbatch", "--inventory", INVENTORY, "--gpus-per-node=a100_80g:8", job)
    assert code == 1 and "at most 4 per host" in err


def test_dry_run_prints_the_final_command_and_bad_input_is_one_line(tmp_path: Path) -> None:
    job = script(tmp_path, "--gpus=2")
    code, out, _ = run(
        "sbatch",
        "--inventory",
        INVENTORY,
        "--model",
        "llama-3-8b",
        "--print",
        "-p",
        "gpu",
        job,
        "--port",
        "80",
    )
    assert (
        code == 0
        and out.startswith("sbatch -p gpu --gres=gpumem:")
        and out.rstrip().endswith(f"{job} --port 80")
    )
    code, _, err = run("sbatch", "--inventory", INVENTORY, "--model", "no-such-model", job)
    assert code == 1 and err.startswith("slurm-hetero: unknown model")
    code, _, err = run("sbatch", "--inventory", INVENTORY, "-p", "gpu")
    assert code == 1 and "give the job script as a file" in err
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/bash\n#SBATCH -p q r\n")
    code, _, err = run("sbatch", "--inventory", INVENTORY, str(bad))
    assert code == 1 and err.count("\n") == 1 and "invalid directive" in err


def test_without_an_inventory_slurms_own_view_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_hetero import proc
    from slurm_hetero.cli import sbatch as wrapper_cli

    calls: list[list[str]] = []

    def scontrol(argv: list[str], timeout: float = 30.0) -> str:
        calls.append(list(argv))
        return "NodeName=g1 Arch=x86_64 Gres=gpu:a100_80g:4(S:0-1) State=IDLE\nNodeName=c1 Gres=(null)\n"

    monkeypatch.setattr(wrapper_cli, "DEFAULT_INVENTORY", tmp_path / "absent.yaml")
    monkeypatch.setattr(proc, "run", scontrol)
    job = script(tmp_path, "--gres=gpumem:90G")
    code, _, err = run("sbatch", "--dry-run", job)
    assert calls == [["scontrol", "show", "node", "-d", "-o"]]
    assert code == 1 and "largest device: 80G on a100_80g" in err
    code, out, err = run(
        "sbatch", "--dry-run", "--model", "llama-3-8b", "--gpus=a100_80g:4", job.replace("job", "job")
    )
    assert code == 1 and "already asks for gpumem:90G" in err
