"""Calibration on the CPU with tiny sizes, the stored file, and the loader plan and launch share."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.core.errors import ConfigError
from slurm_hetero.launch import calibrate as cal
from tests.conftest import REPO

pytest.importorskip("torch")

TINY = cal.Sizes(matmul=64, hidden=32, heads=2, seq=16, batch=2, warmup=1, repeats=3)


def test_cpu_calibration_measures_positive_throughput() -> None:
    result = cal.calibrate("cpu", "cpu", "fp32", TINY)
    assert result.type == "cpu" and result.device == "cpu" and result.dtype == "fp32"
    assert result.tflops > 0 and result.layer_tflops > 0 and result.tokens_per_s > 0
    assert result.measured_at.endswith("Z")


def test_store_merges_and_the_loader_reads_both_forms(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "measured.yaml"
    result = cal.Calibration("a100_80g", 200.0, 150.0, 1e5, "cuda:0", "bf16", "2025-01-01T00:00:00Z")
    cal.store(path, result)
    cal.store(path, cal.Calibration("l40s", 90.0, 60.0, 5e4, "cuda:0", "bf16", "2025-01-01T00:00:00Z"))
    data = yaml.safe_load(path.read_text())
    assert set(data) == {"a100_80g", "l40s"} and data["a100_80g"]["tflops"] == 200.0
    assert cal.load_profile(path).tflops == {"a100_80g": 150.0, "l40s": 60.0}  # layer figure preferred
    plain = tmp_path / "plain.yaml"
    plain.write_text("ascend910b3: 125\nmi300x: {tflops: 300}\n")
    assert cal.load_profile(plain).tflops == {"ascend910b3": 125.0, "mi300x": 300.0}


@pytest.mark.parametrize("text", ["a100: fast\n", "a100: -3\n", "a100: {device: cpu}\n", "- a100\n"])
def test_the_loader_rejects_what_is_not_a_positive_figure(tmp_path: Path, text: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"must be 1e-06 to 1e\+06|mapping|no tflops"):
        cal.load_profile(path)


@pytest.mark.parametrize(
    ("bad", "said", "good", "figure"),
    [  # adv35 K17: a misspelt key was dropped silently, so the plan ran without its figure
        (
            "{tflops: 100, gemm_half_element: 4000000}",
            r":a100: unknown keys gemm_half_element; an entry has ",
            "{tflops: 100, source: SAILOR, measured_at: x, device: cuda:0, dtype: bf16}",
            100.0,
        ),  # adv35 K6: `1.5e2` (YAML 1.1 text, 1.2 a number) was "must be a positive number"
        ("{tflops: 1.5e2}", r"line 1: tflops: 1.5e2 is ambiguous .*; write 150", "{tflops: 1.5e+2}", 150.0),
    ],
)
def test_an_entry_read_otherwise_than_written_is_refused_saying_why(
    tmp_path: Path, bad: str, said: str, good: str, figure: float
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(f"a100: {bad}\n")
    with pytest.raises(ConfigError, match=said):
        cal.load_profile(path)
    path.write_text(f"a100: {good}\n")
    assert cal.load_profile(path).tflops == {"a100": figure}


@pytest.mark.parametrize(
    "text",
    [
        "a100: 100\nl40s: 60\na100: 300\n",
        '{"a100": 100, "l40s": 60, "a100": 300}\n',
        "a100: {tflops: 100, tflops: 300}\n",
    ],
)
def test_a_device_type_given_twice_is_refused_naming_it_and_the_file(tmp_path: Path, text: str) -> None:
    """YAML (and JSON read as YAML) kept the last figure silently."""
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"given twice") as error:
        cal.load_profile(path)
    assert str(error.value).startswith(f"{path}: key ")
    runner = CliRunner()
    plan = runner.invoke(cli, ["plan", "--devices", "a100:2", "--model", "gpt2", "--measured", str(path)])
    assert plan.exit_code == 1
    twice = "'tflops'" if "{tflops" in text else "'a100'"
    line = text.count("\n", 0, text.rindex(twice.strip("'"))) + 1  # the second place (adv38 3.m04)
    assert f"{path}: key {twice} given twice in one mapping (line {line}); give each key once" in plan.output


def test_cli_calibrate_writes_the_file_plan_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cal, "CPU_SIZES", TINY)
    out = tmp_path / "measured.yaml"
    runner = CliRunner()
    result = runner.invoke(
        cli, ["calibrate", "--device", "cpu", "--type", "l40s", "--out", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["type"] == "l40s"
    plan = runner.invoke(cli, ["plan", "--devices", "l40s:2", "--model", "gpt2", "--measured", str(out)])
    assert plan.exit_code == 0, plan.output


def test_the_gemm_size_curve_is_fitted_from_the_shapes_plans_use() -> None:
    peak, half = 300.0, 2.0e6
    points = [(e, peak * e / (e + half)) for e in (2.5e5, 1e6, 4e6, 1.6e7, 6.4e7)]
    fitted_peak, fitted_half = cal.fit_gemm_half(points)
    assert fitted_peak == pytest.approx(peak) and fitted_half == pytest.approx(half)
    result = cal.calibrate("cpu", "cpu", "fp32", TINY)
    assert result.gemm_half_elements is not None and result.gemm_half_elements >= 0


def test_the_fitted_curve_reaches_plan_through_the_measured_file(tmp_path: Path) -> None:
    path = tmp_path / "measured.yaml"
    path.write_text("a100: {layer_tflops: 150, gemm_half_elements: 4000000}\nl40s: 90\n")
    assert cal.load_profile(path).gemm_half == {"a100": 4e6}
    result = CliRunner().invoke(
        cli, ["plan", "--devices", "a100:2", "--model", "gpt2", "--measured", str(path), "--json"]
    )
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--device", "cpu", "--type", "cpu_test"], "device type 'cpu_test': names no device type"),  # K01b
        (["--device", "cpu"], "device type 'cpu': names no device type"),  # the CPU: no catalog type
        (["--device", "cpu", "--type", "a\nb"], "device type 'a\\nb': names no device type"),  # K05
        (["--device", "cpu", "--type", "gpumem"], "is a GRES name"),
        (["--device", "cuda:99"], "--device cuda:99: no such device"),  # K02 (no torch_xmlir import)
        (["--device", "nosuchdev:0"], "torch has no device type 'nosuchdev'"),
        # adv40 C27: the advice was "pass --beyond-context", an option calibrate does not have
        (["--device", "cpu", "--type", "a100_80g", "--model", "gpt2", "--seq", "5000"], "1024 tokens"),
    ],
)
def test_calibrate_refuses_in_one_line_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], needle: str
) -> None:
    """What plan --measured would refuse is not stored (it refuses the whole file); a device torch
    does not have is one line, not a traceback (adv11 K01b, K02, K05)."""
    monkeypatch.setattr(cal, "CPU_SIZES", TINY)
    out = tmp_path / "measured.yaml"
    result = CliRunner().invoke(cli, ["calibrate", *args, "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurm-hetero: ") and needle in lines[0], lines
    assert "--beyond-context" not in lines[0]
    if "names no device type" in needle:
        assert "--type TYPE" in lines[0] and "l40s" in lines[0]  # how to name one, and the valid types
    assert not out.exists()


@pytest.mark.parametrize(
    ("option", "needle"),
    [
        (["--micro-batches", "1,2"], "give --model too"),
        (["--seq", "128"], "give --model too"),
        (["--model", "gpt2", "--micro-batches", "0,2"], "--micro-batches '0,2': expected sizes 1 to 1024"),
        (["--model", "gpt2", "--micro-batches", ""], "--micro-batches '': expected sizes"),  # adv41 73
    ],
)
def test_model_options_without_a_model_are_a_usage_error(
    tmp_path: Path, option: list[str], needle: str
) -> None:
    """adv40 C23: --micro-batches without --model was silently ignored; adv41 72: a malformed
    --micro-batches exited 1, not as a usage error."""
    out = tmp_path / "measured.yaml"
    result = CliRunner().invoke(
        cli, ["calibrate", "--device", "cpu", "--type", "a100_80g", *option, "--out", str(out)]
    )
    assert result.exit_code == 2 and needle in result.output and not out.exists()


def test_calibrate_stores_a_type_under_its_catalog_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cal, "CPU_SIZES", TINY)
    out = tmp_path / "measured.yaml"
    result = CliRunner().invoke(cli, ["calibrate", "--device", "cpu", "--type", "L40S", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert list(yaml.safe_load(out.read_text())) == ["l40s"]


def test_an_out_path_that_can_never_be_written_is_one_line_before_measuring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 5 (R-F18g): `--out` with a name over NAME_MAX was a traceback, after the measurement."""
    import slurm_hetero.cli.calibrate as command

    monkeypatch.setattr(command, "calibrate", lambda *a, **k: pytest.fail("measured before checking --out"))
    for out in (tmp_path / ("c" * 300 + ".yaml"), tmp_path / ("c" * 300) / "m.yaml"):
        result = CliRunner().invoke(
            cli, ["calibrate", "--device", "cpu", "--type", "l40s", "--out", str(out)]
        )
        assert result.exit_code == 1, result.output
        assert result.output.startswith("slurm-hetero: --out ") and "File name too long" in result.output
        assert result.output.count("\n") == 1


TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 100,
              "max_position_embeddings": 32}  # fmt: skip


def test_the_timed_layer_is_one_layer_of_the_model(tmp_path: Path) -> None:
    """The module calibrate times holds exactly the weights our costs count for one decoder layer
    (grouped K/V heads, gated MLP, no biases), so its seconds are those of the plan's layer."""
    import torch

    from slurm_hetero.engine.modelcost import CostSettings
    from slurm_hetero.inventory.modelconfigs import layer_costs_for, load_model

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_LLAMA))
    layer = cal.decoder_layer(torch, load_model(str(config)))
    weights = sum(p.numel() for n, p in layer.named_parameters() if "norms" not in n)
    costs = layer_costs_for(str(config), 32, CostSettings(dtype="fp32"))
    norms = 2 * 64  # two RMSNorm gains
    assert weights + norms == pytest.approx(float(costs.param_bytes[0]) / 4)


def test_calibrate_times_a_models_layer_that_plan_and_launch_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`calibrate --model` writes the per-shape profile (tp 1, one point per micro-batch size, the
    model it measured), and `plan --measured` prices its stages from it, not from the one number
    beside it (launch reads it alike: tests/unit/test_launch_plan.py)."""
    monkeypatch.setattr(cal, "CPU_SIZES", TINY)
    config, out = tmp_path / "config.json", tmp_path / "measured.yaml"
    config.write_text(json.dumps(TINY_LLAMA))
    args = ["calibrate", "--device", "cpu", "--type", "a100_80g", "--out", str(out), "--model", str(config)]
    result = CliRunner().invoke(cli, [*args, "--seq", "32", "--micro-batches", "2,1"])
    assert result.exit_code == 0, result.output
    entry = yaml.safe_load(out.read_text())["a100_80g"]
    assert {k: entry["model"][k] for k in ("name", "seq", "hidden")} == {
        "name": config.parent.name, "seq": 32, "hidden": 64,
    }  # fmt: skip
    assert [(s["tp"], s["micro_batch"]) for s in entry["shapes"]] == [(1, 1), (1, 2)]
    assert all(s["fwd_s"] > 0 and s["bwd_s"] > 0 for s in entry["shapes"])
    shapes = cal.load_profile(out).shapes
    assert [p[:2] for p in shapes["a100_80g"].points] == [(1, 1.0), (1, 2.0)]
    args = ["plan", "--devices", "a100_80g:2", "--model", str(config), "--seq", "32", "--global-batch", "8"]
    plan = CliRunner().invoke(cli, [*args, "--micro-batch", "1", "--measured", str(out), "--json"])
    assert plan.exit_code == 0, plan.output
    one_number = tmp_path / "one-number.yaml"
    one_number.write_text(yaml.safe_dump({"a100_80g": {k: v for k, v in entry.items() if k != "shapes"}}))
    plain = CliRunner().invoke(cli, [*args, "--micro-batch", "1", "--measured", str(one_number), "--json"])
    assert plain.exit_code == 0, plain.output
    assert json.loads(plan.stdout)["predicted_step_s"] != json.loads(plain.stdout)["predicted_step_s"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "mixtral-8x7b"], "calibrate times dense decoder layers only"),
    ],
)
def test_calibrate_refuses_a_model_it_cannot_time_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, extra: list[str], message: str
) -> None:
    monkeypatch.setattr(cal, "CPU_SIZES", TINY)
    out = tmp_path / "measured.yaml"
    args = ["calibrate", "--device", "cpu", "--type", "a100_80g", "--out", str(out), *extra]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and message in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


MALFORMED_DEVICES = [
    "cuda:-1",
    "cuda:1e30",
    "cuda:4294967296",
    "npu:0x1",
    "cuda:",
    "cuda:65536",
    "cuda\n0",
    "Cuda",
]


def test_a_malformed_device_is_refused_before_torch_is_imported(tmp_path: Path) -> None:
    """adv26b F10: `--device cuda:-1` (1e30, 0x1, ...) was refused only after torch loaded (3.5 s,
    226 MB); read in a fresh interpreter, so torch imported by other tests cannot hide it."""
    probe = (
        "import sys\nfrom click.testing import CliRunner\nfrom slurm_hetero.cli import cli\n"
        f"for device in {MALFORMED_DEVICES!r}:\n"
        "    r = CliRunner().invoke(cli, ['calibrate', '--device', device, '--out', sys.argv[1]])\n"
        "    print(r.exit_code, r.stderr.count(chr(10)), r.stderr.strip())\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "m.yaml")],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    *lines, torch_loaded = out.stdout.splitlines()
    assert torch_loaded == "False", out.stdout
    assert len(lines) == len(MALFORMED_DEVICES), out.stdout
    for line in lines:
        assert line.startswith("1 1 slurm-hetero: --device ") and "not a torch device" in line, line


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (  # PyYAML's own text named the file "<unicode string>" over three lines
            "a100: 1\n---\nl40s: 2\n",
            "line 2 column 1: expected a single document in the stream but found another",
        ),
        ("a100: [1\n", "line 2 column 1: while parsing a flow sequence did not find expected ',' or ']'"),
        (
            "[" * 100_000 + "]" * 100_000,
            "nested too deeply to be a measured-throughput file",
        ),  # libyaml crashed
        ("a100: {tflops: 140, network_gbs: " + "[" * 990 + "]" * 990 + "}", "network_gbs must be"),
        (
            "a100: {tflops: 140, network_gbs: 1e-9}",
            "write 1.0e-09, or '1e-9' for text",
        ),  # 1e-09 is text in 1.1
        ("a100: 140\x00\n", "malformed YAML at character 10: unacceptable character #x0000"),
        (
            "a100: {tflops: 1, network_gbs: 1, network_gbs: 2}",
            "given twice in one mapping (line 1); give each key once",
        ),
        ("a100: {network_gbs: 1}", "a100: no tflops: give the type's sustained TFLOPS"),
    ],
)
def test_a_malformed_measured_file_is_one_line_saying_where(tmp_path: Path, text: str, said: str) -> None:
    """PyYAML's marks; adv38 D1, D3, D7, D8, D13; an entry without TFLOPS."""
    path = tmp_path / "measured.yaml"
    path.write_text(text)
    plan = CliRunner().invoke(
        cli, ["plan", "--devices", "a100:2", "--model", "gpt2", "--measured", str(path)]
    )
    assert plan.exit_code == 1 and said in plan.output and "unicode" not in plan.output, plan.output[:300]
    assert len(plan.output.strip().splitlines()) == 1


def test_convert_profile_out_under_a_file_is_one_line(tmp_path: Path) -> None:
    """adv38 D4: mkdir of --out's parent raised FileExistsError."""
    src, blocker = tmp_path / "p.json", tmp_path / "afile"
    src.write_text(
        json.dumps({"OPT-350": {"A100-40": {"1": {"1": {str(i): [1e-3, 2e-3] for i in range(26)}}}}})
    )
    blocker.write_text("x")
    args = ["convert-profile", str(src), "--sailor-model", "OPT-350", "--model", "opt-350m", "--seq", "2048"]
    run = CliRunner().invoke(cli, [*args, "--types", "A100-40=a100_40g", "--out", str(blocker / "x.yaml")])
    assert (
        run.exit_code != 0
        and f"cannot make directory {blocker}: a file of that name is in the way" in run.output
    )
