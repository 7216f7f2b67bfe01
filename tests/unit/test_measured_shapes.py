"""Measured per-shape speeds (`--measured` profile): reading (`launch.calibrate.load_profile`),
interpolation (`engine.stagecost.measured_shape`, `device_rate`), the model check
(`engine.devicegroups.shape_speeds`), SAILOR's profiles (`convert-profile`) and `plan`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_hetero.cli import cli
from slurm_hetero.core.errors import ConfigError, RequestError
from slurm_hetero.engine.devicegroups import MeasuredShapes, shape_speeds
from slurm_hetero.engine.stagecost import DeviceGroup, device_rate, measured_shape
from slurm_hetero.inventory.modelconfigs import layer_costs_for
from slurm_hetero.launch.calibrate import load_profile

OPT = layer_costs_for("opt-350m", 2048)
LAYER_GFLOPS = float(OPT.flops.mean()) / 1e9
MODEL = {"name": "opt-350m", "seq": 2048, "hidden": 1024, "layer_gflops": LAYER_GFLOPS}
PLAN = ["plan", "--devices", "a100_40g:8,v100_16g:8", "--model", "opt-350m", "--seq", "2048"]
PLAN += ["--global-batch", "64", "--per-node", "4", "--json"]


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "measured.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_interpolation_is_linear_in_seconds_and_says_when_it_extrapolates() -> None:
    speeds = ((1, 1.0, 50.0), (1, 4.0, 100.0), (2, 2.0, 60.0))
    assert measured_shape(speeds, 1, 4.0) == (100.0, "measured")
    rate, how = measured_shape(speeds, 1, 2.0)  # type: ignore[misc]
    t1, t4 = 1 / 50, 4 / 100
    assert how == "interpolated" and rate == pytest.approx(2 / (t1 + (t4 - t1) / 3))
    assert measured_shape(speeds, 1, 16.0) == (100.0, "extrapolated")
    assert measured_shape(speeds, 1, 0.5) == (50.0, "extrapolated")
    assert measured_shape(speeds, 4, 1.0) is None


def test_a_measured_tp_degree_includes_its_all_reduces_an_unmeasured_one_is_priced_apart() -> None:
    group = DeviceGroup("a100_40g", (4,), 100.0, 40e9, 150.0, 2**20, speeds=((1, 1.0, 80.0), (2, 1.0, 55.0)))
    assert device_rate(group, 2, 1.0, OPT.elements_per_sample) == (55.0, True)
    rate, measured = device_rate(group, 4, 1.0, OPT.elements_per_sample)
    assert not measured and rate < 55.0  # tp 2's speed on smaller GEMMs: never free
    plain = DeviceGroup("a100_40g", (4,), 100.0, 40e9, 150.0, 0.0)
    assert device_rate(plain, 4, 1.0, OPT.elements_per_sample) == (100.0, False)


def test_seconds_become_tflops_of_this_models_layers_and_another_models_are_refused() -> None:
    shapes = MeasuredShapes(
        "a100_40g", ((2, 4.0, 0.05, None), (1, 1.0, None, 70.0)), ("opt-350m", 2048, 1024, LAYER_GFLOPS)
    )
    (tp, mb, rate), tflops = shape_speeds(shapes, OPT)
    assert (tp, mb) == (2, 4.0) and rate == pytest.approx(4 * 3 * LAYER_GFLOPS / (2 * 0.05) / 1e3)
    assert tflops == (1, 1.0, 70.0)
    neo = MeasuredShapes("a100_40g", ((1, 1.0, 0.05, None),), ("gpt-neo-2.7b", 2048, 2560, 365.0))
    with pytest.raises(RequestError, match=r"a100_40g\.model: measured on gpt-neo-2.7b"):
        shape_speeds(neo, OPT)


POINT = {"tp": 1, "micro_batch": 1}


@pytest.mark.parametrize(
    ("entry", "where", "what"),
    [
        ({"tflops": 90, "shapes": [{"tp": 3, "micro_batch": 1, "tflops": 50}]}, "shapes[0]", "tp 3 is no"),
        ({"tflops": 90, "shapes": [{**POINT, "fwd_s": -1, "bwd_s": 1}], "model": MODEL}, "[0]", "fwd_s"),
        ({"tflops": 90, "shapes": [{**POINT, "tflops": math.nan}]}, "shapes[0]", "tflops"),
        ({"tflops": 90, "shapes": [{**POINT, "fwd_s": 0.1, "bwd_s": 0.2}]}, ".model", "model must be"),
        ({"tflops": 90, "shapes": [{**POINT, "tflops": 5, "x": 1}]}, "shapes[0]", "unknown keys x"),
        ({"tflops": 90, "shapes": [{**POINT, "tflops": 5}] * 2}, "shapes[1]", "given twice"),
    ],
)  # fmt: skip
def test_a_bad_point_is_one_error_naming_the_entry(
    tmp_path: Path, entry: dict, where: str, what: str
) -> None:
    path = write(tmp_path, {"a100_40g": entry})
    with pytest.raises(ConfigError, match=what) as e:
        load_profile(path)
    assert where in str(e.value) and str(path) in str(e.value)


def test_plan_reads_a_profile_and_refuses_an_unknown_type_or_another_model_in_one_line(
    tmp_path: Path,
) -> None:
    shapes = [
        {"tp": t, "micro_batch": m, "fwd_s": 0.003 * m * t**-0.7, "bwd_s": 0.006 * m * t**-0.7}
        for t in (1, 2)
        for m in (1, 4)
    ]
    good = {"a100_40g": {"tflops": 70, "model": MODEL, "shapes": shapes}, "v100_16g": 40}
    run = CliRunner().invoke(cli, [*PLAN, "--measured", str(write(tmp_path, good))])
    assert run.exit_code == 0, run.output
    doc = json.loads(run.output)
    assert doc["predicted_step_s"] > 0
    for bad, needle in (
        (
            {**good, "a100_99g": {"tflops": 1, "shapes": [{"tp": 1, "micro_batch": 1, "tflops": 1}]}},
            "a100_99g",
        ),
        ({**good, "a100_40g": {**good["a100_40g"], "model": {**MODEL, "seq": 1024}}}, "a100_40g.model"),
    ):
        run = CliRunner().invoke(cli, [*PLAN, "--measured", str(write(tmp_path, bad))])
        assert run.exit_code == 1 and needle in run.output and len(run.output.strip().splitlines()) == 1, (
            run.output
        )


def test_the_plan_says_when_a_stage_is_beyond_the_measured_points(tmp_path: Path) -> None:
    one = {"tflops": 70, "shapes": [{"tp": 1, "micro_batch": 64, "tflops": 70}]}
    run = CliRunner().invoke(
        cli, [*PLAN, "--measured", str(write(tmp_path, {"a100_40g": one, "v100_16g": one}))]
    )
    assert run.exit_code == 0, run.output
    assert any("outside the measured sizes" in n or "has no tp" in n for n in json.loads(run.output)["notes"])


def test_sailor_profiles_convert_to_shapes_plan_reads(tmp_path: Path) -> None:
    def layers(f: float) -> dict[str, list[float]]:
        return {str(i): [f, 2 * f, 0.001] for i in range(26)}

    profiles = {
        "OPT-350": {"A100-40": {"1": {"1": layers(0.003), "2": layers(0.002)}, "4": {"1": layers(0.01)}}}
    }
    src = tmp_path / "profiles_tmp.json"
    src.write_text(json.dumps(profiles))
    out = tmp_path / "m.yaml"
    args = ["convert-profile", str(src), "--sailor-model", "OPT-350", "--model", "opt-350m", "--seq", "2048"]
    run = CliRunner().invoke(cli, [*args, "--types", "A100-40=a100_40g", "--out", str(out)])
    assert run.exit_code == 0, run.output
    entry = load_profile(out).shapes["a100_40g"]
    got = [(tp, mb, round(seconds or 0, 9)) for tp, mb, seconds, _ in sorted(entry.points)]
    assert got == [(1, 1.0, 0.009), (1, 4.0, 0.03), (2, 1.0, 0.006)]
    assert yaml.safe_load(out.read_text())["a100_40g"]["tflops"] == pytest.approx(
        4 * 3 * LAYER_GFLOPS / 1e3 / 0.03, rel=1e-3
    )
    run = CliRunner().invoke(cli, [*args, "--types", "H100=h100_sxm", "--out", str(out)])
    assert run.exit_code == 1 and "no profile of 'H100'" in run.output


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"OPT-350": {"A100-40": []}}', "OPT-350.A100-40: expected a mapping of micro-batch sizes"),
        ('"x"', "no profiles of 'OPT-350'; it has no model names"),
        ("{}", "no profiles of 'OPT-350'; it has no model names"),  # adv35 K29: "it has " and nothing
        ('{"OPT-350": {"A100-40": {"1": "x"}}}', "OPT-350.A100-40.1: expected a mapping of tensor-parallel"),
        (
            '{"OPT-350": {"A100-40": {"1": {"3": {}}}}}',
            "OPT-350.A100-40.1: '3' is not one of the tensor-para",
        ),
        ('{"OPT-350": {"A100-40": {"x": {}}}}', "OPT-350.A100-40: 'x' is not one of the micro-batch sizes"),
        (
            '{"OPT-350": {"A100-40": {"1": {"1": {}}}}}',
            "OPT-350.A100-40.1.1.1: expected [forward s, backward",
        ),
        ('{"OPT-350": {"A100-40": {"1": {"1": {"1": [0.1, NaN]}}}}}', "OPT-350.A100-40.1.1.1: expected"),
        ('{"OPT-350": {"A100-40": {"1": {"1": {"1": [0.1, -2]}}}}}', "OPT-350.A100-40.1.1.1: expected"),
        ("garbage{", "not JSON (Expecting value: line 1 column 1 (char 0)); give SAILOR's profiles_tmp.json"),
    ],
)
def test_malformed_sailor_profiles_are_one_line_naming_the_entry(
    tmp_path: Path, text: str, said: str
) -> None:
    """adv33 F14: a list or string where SAILOR has a mapping was a traceback."""
    src, out = tmp_path / "bad.json", tmp_path / "m.yaml"
    src.write_text(text)
    args = ["convert-profile", str(src), "--sailor-model", "OPT-350", "--model", "opt-350m", "--seq", "2048"]
    run = CliRunner().invoke(cli, [*args, "--types", "A100-40=a100_40g", "--out", str(out)])
    assert run.exit_code == 1 and run.output.startswith(f"slurm-hetero: {src}: {said}"), run.output
    assert len(run.output.splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize(
    ("types", "said"),
    [
        ("A100-40=a100_40g,V100-16=nosuch", "--types type 'nosuch': names no device type"),
        ("A100-40=a100_40g,A100-40=l40s", "SAILOR GPU A100-40 is given twice"),
        ("A100-40=a100_40g,V100-16=a100_40g", "two GPUs are converted to type a100_40g"),
        ("A100-40=a100_40g,V100-16=A100_40G", "'a100_40g' and 'A100_40G': both name device type a100_40g"),
    ],
)
def test_types_are_refused_where_plan_would_refuse_or_one_would_be_lost(
    tmp_path: Path, types: str, said: str
) -> None:
    """adv35 K31-K33: an unknown type was stored (plan refused the file later); a GPU given twice or two
    GPUs for one type kept one of them silently."""
    src, out = tmp_path / "p.json", tmp_path / "m.yaml"
    src.write_text('{"OPT-350": {}}')
    args = ["convert-profile", str(src), "--sailor-model", "OPT-350", "--model", "opt-350m", "--seq", "2048"]
    run = CliRunner().invoke(cli, [*args, "--types", types, "--out", str(out)])
    assert run.exit_code == 1 and said in run.output and len(run.output.splitlines()) == 1, run.output
    assert not out.exists()


def test_a_profile_without_tp_1_converts_to_a_figure_plan_reads(tmp_path: Path) -> None:
    """adv36 N32: only a tp 2 shape gave `tflops: 0.0`, which plan and launch then refused."""
    layers = {str(i): [0.002, 0.004, 0.001] for i in range(26)}
    src, out = tmp_path / "p.json", tmp_path / "m.yaml"
    src.write_text(json.dumps({"OPT-350": {"A100-40": {"1": {"2": layers}}}}))
    args = ["convert-profile", str(src), "--sailor-model", "OPT-350", "--model", "opt-350m", "--seq", "2048"]
    run = CliRunner().invoke(cli, [*args, "--types", "A100-40=a100_40g", "--out", str(out)])
    assert run.exit_code == 0, run.output
    tflops = load_profile(out).tflops["a100_40g"]
    assert tflops == pytest.approx(3 * LAYER_GFLOPS / 1e3 / (2 * 0.006), rel=1e-3)  # one of the 2 devices
    plan = ["plan", "--devices", "a100_40g:2", "--model", "opt-350m", "--global-batch", "8"]
    assert CliRunner().invoke(cli, [*plan, "--measured", str(out)]).exit_code == 0


def test_a_degree_without_points_is_noted_naming_the_degree_it_took(tmp_path: Path) -> None:
    """adv37 R09: a tp 1 stage without tp-1 points was said to take "its next lower measured degree"
    (there is none: it takes tp 2's); R11: `launch --dry-run` dropped the measured notes plan prints."""
    two = {"tflops": 70, "shapes": [{"tp": 2, "micro_batch": 1, "tflops": 60}]}
    path = str(write(tmp_path, {"a100_40g": two, "v100_16g": two}))
    simulate = ["--simulate", "a[1-2]:a100_40g:4,v[1-2]:v100_16g:4", "--model", "opt-350m", "--seq", "2048"]
    launch = ["launch", "--dry-run", "--json", *simulate, "--global-batch", "64", "--tp-sizes", "1"]
    run = CliRunner().invoke(cli, [*launch, "--measured", path, "--", "true"])
    assert run.exit_code == 0, run.output
    note = "measured: a100_40g has no tp 1 point: the speed measured at tp 2 on the GEMM-size curve"
    assert f'{note}"' in run.output  # and no all-reduces at tp 1


def test_a_profiles_network_figure_prices_its_type_unless_network_gbs_is_given(tmp_path: Path) -> None:
    """Issue 24: a profile may carry each type's network figure (`network_gbs`), as SAILOR's
    bandwidth fits give it; `--network-gbs` still sets every type's."""
    entry = {"tflops": 100, "shapes": [{"tp": 1, "micro_batch": 1, "tflops": 100}], "model": MODEL}

    def step(data: dict[str, object], *more: str) -> float:
        run = CliRunner().invoke(
            cli, [*PLAN, "--kind", "data", "--measured", str(write(tmp_path, data)), *more]
        )
        assert run.exit_code == 0, run.output
        return float(json.loads(run.output)["predicted_step_s"])

    plain = {"a100_40g": entry, "v100_16g": entry}
    slow = {"a100_40g": {**entry, "network_gbs": 0.5}, "v100_16g": {**entry, "network_gbs": 0.5}}
    assert step(slow) > step(plain)  # the gradient ring between nodes at 0.5 GB/s, not 25
    assert step(slow, "--network-gbs", "25") == pytest.approx(step(plain))
    assert step(plain, "--network-gbs", "0.5") == pytest.approx(step(slow))


@pytest.mark.parametrize("bad", [0, -1, "fast", float("nan"), 2e6, True])
def test_a_bad_network_figure_is_one_line_naming_the_entry(tmp_path: Path, bad: object) -> None:
    entry = {"tflops": 100, "network_gbs": bad}
    run = CliRunner().invoke(cli, [*PLAN, "--measured", str(write(tmp_path, {"a100_40g": entry}))])
    assert run.exit_code == 1 and "a100_40g: network_gbs must be 0.001 to 1e+06" in run.output, run.output
    assert len(run.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ({"tflops": -1, "layer_tflops": 5}, "a100_40g: tflops must be 1e-06 to 1e+06, got -1"),
        ({"tflops": 0, "layer_tflops": 5}, "a100_40g: tflops must be 1e-06 to 1e+06, got 0"),
        ({"tflops": 5, "layer_tflops": float("nan")}, "layer_tflops must be 1e-06 to 1e+06, got nan"),
        # adv41 48, 60-61: the figure as written, not rounded onto the bound; no OverflowError
        ({"tflops": 5, "layer_tflops": 1000001}, "layer_tflops must be 1e-06 to 1e+06, got 1000001"),
        ({"tflops": 10**400}, "a100_40g: tflops must be 1e-06 to 1e+06, got 100000"),
        ({"tflops": 5, "gemm_half_elements": 10**400}, "gemm_half_elements must be 0 to 1e+15"),
        ({"tflops": 5, "network_gbs": 10**400}, "network_gbs must be 0.001 to 1e+06"),
        # adv42 27: YAML reads 1.0e+400 as inf, so the line says what to write
        ({"tflops": float("inf")}, "tflops must be 1e-06 to 1e+06, got inf; write a number a float holds"),
    ],
)
def test_every_tflops_figure_of_an_entry_is_checked(
    tmp_path: Path, entry: dict[str, float], needle: str
) -> None:
    """adv40 C12/C18: beside a layer_tflops (what plan prices), a tflops of 0 or -1 was accepted."""
    run = CliRunner().invoke(cli, [*PLAN, "--measured", str(write(tmp_path, {"a100_40g": entry}))])
    assert run.exit_code == 1 and needle in run.output, run.output
    assert len(run.output.strip().splitlines()) == 1


def test_sailor_network_fits_convert_to_network_figures(tmp_path: Path) -> None:
    """convert-profile --network: SAILOR's fit of one GPU to one of its type (GB/s as a polynomial
    in log2 MB), at one sample's fp32 hidden state (2048 x 1024 x 4 bytes: log2 8.39 = 3.07)."""
    profiles = {"OPT-350": {"A100-40": {"1": {"1": {str(i): [0.003, 0.006, 0.001] for i in range(26)}}}}}
    fits = {"z1": {"A100-40": {"1": {"z1": {"A100-40": {"1": [[-0.0024, 0.1409, 1.1168], 2.4e9]}}}}}}
    src, net, out = tmp_path / "profiles_tmp.json", tmp_path / "bw.json", tmp_path / "m.yaml"
    src.write_text(json.dumps(profiles))
    net.write_text(json.dumps(fits))
    args = ["convert-profile", str(src), "--sailor-model", "OPT-350", "--model", "opt-350m", "--seq", "2048"]
    args += ["--types", "A100-40=a100_40g", "--out", str(out)]
    run = CliRunner().invoke(cli, [*args, "--network", str(net)])
    assert run.exit_code == 0, run.output
    x = math.log2(2048 * 1024 * 4 / 1e6)
    assert load_profile(out).network == {
        "a100_40g": pytest.approx(-0.0024 * x * x + 0.1409 * x + 1.1168, rel=1e-3)
    }
    for broken, said in (
        ({"z1": {"V100-16": {}}}, "no network figures of 'A100-40'"),
        (
            {"z1": {"A100-40": {"2": {}}}},
            "z1.A100-40: no key '1' (one A100-40 to one in its zone)",
        ),  # adv38 D12
        (
            {"z1": {"A100-40": {"1": {"z1": {"A100-40": {"1": ["x"]}}}}}},
            "z1.A100-40.1.z1.A100-40.1: expected",
        ),
        ({"z1": {"A100-40": {"1": {"z1": {"A100-40": {"1": [[-1.0]]}}}}}}, "the fit gives -1 GB/s"),
    ):
        net.write_text(json.dumps(broken))
        run = CliRunner().invoke(cli, [*args, "--network", str(net)])
        assert run.exit_code == 1 and f"{net}:" in run.output and said in run.output, run.output
        assert len(run.output.strip().splitlines()) == 1
