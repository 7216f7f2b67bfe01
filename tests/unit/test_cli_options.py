"""cli/options.py, the values given to fit, plan, sbatch and launch: nan, infinities, negatives,
zero counts, sequences beyond the model's context, unknown --simulate nodes, a MASTER_ADDR carrying
a newline or shell syntax, a NaN gradient weight. Each is one clear line; none is a traceback."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_hetero import training
from slurm_hetero.cli import cli
from slurm_hetero.core.errors import ConfigError
from slurm_hetero.inventory.catalog import merge_site_text, parse_catalog_text
from slurm_hetero.launch.plan import LaunchOptions, LaunchPlanError
from slurm_hetero.layout import LayoutError, RankLayout
from slurm_hetero.slurm import syntax
from tests.conftest import REPO

EXAMPLE = REPO / "gres_conf" / "examples" / "mixed.yaml"
PLAN = ["plan", "--devices", "a100:2,l40s:2", "--model", "gpt2", "--seq", "64", "--global-batch", "8"]
FIT = ["fit", "--model", "gpt2", "--mode", "train"]
LAUNCH = [
    *("launch", "--model", "gpt2", "--seq", "64", "--global-batch", "8", "--dry-run", "--json"),
    *("--inventory", str(EXAMPLE), "--simulate", "a100n1:a100_80g:2,l40sn1:l40s:1"),
]
SBATCH = ["sbatch", "--model", "gpt2", "--dry-run"]  # never without --dry-run: sbatch execs


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def assert_clean(result: Result) -> None:
    """Success, or one `slurm-hetero:` line (exit 1), or click's usage error (exit 2); no traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code in (0, 1, 2), result.output
    assert "Traceback" not in result.output
    if result.exit_code == 1:
        assert result.stderr.startswith("slurm-hetero: ") and result.stderr.count("\n") == 1, result.stderr
    if result.exit_code == 2:
        assert result.stderr.strip().splitlines()[-1].startswith("Error: Invalid value for"), result.stderr


FLOAT_OPTIONS = [
    (PLAN, "--overhead-gib"),
    (PLAN, "--network-gbs"),
    (PLAN, "--mfu"),
    (FIT, "--overhead-gib"),
    (LAUNCH, "--overhead-gib"),
    (LAUNCH, "--network-gbs"),
    (SBATCH, "--overhead-gib"),
]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "-1", "1e400", "5e-324"])
@pytest.mark.parametrize(("command", "option"), FLOAT_OPTIONS)
def test_nan_infinite_and_negative_floats_are_usage_errors(
    command: list[str], option: str, value: str
) -> None:
    result = invoke(*command, option, value, *(["job.sh"] if command is SBATCH else []))
    assert_clean(result)
    if value != "5e-324" or option in ("--network-gbs", "--mfu"):  # a tiny overhead is fine
        assert result.exit_code == 2, result.output
    if value.lower().lstrip("-") in ("nan", "inf", "1e400"):  # 1e400 reads as inf
        assert "is not a finite number" in result.stderr


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    option=st.sampled_from(FLOAT_OPTIONS[:6]),
    value=st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 1e300]),
)
def test_no_float_option_value_gives_a_traceback(option: tuple[list[str], str], value: float) -> None:
    command, flag = option
    assert_clean(invoke(*command, flag, repr(value)))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([*FIT, "--dp", "0"], "Invalid value for '--dp': 0 is not in the range 1<=x<=65536"),
        ([*FIT, "--pp", "-2"], "Invalid value for '--pp'"),
        (["fit", "--model", "gpt2", "--batch", "0"], "Invalid value for '--batch'"),
        ([*FIT, "--zero", "7"], "Invalid value for '--zero'"),
        ([*PLAN, "--global-batch", "0"], "Invalid value for '--global-batch'"),
        ([*PLAN, "--micro-batch", "0"], "Invalid value for '--micro-batch'"),
        ([*SBATCH, "--micro-batch", "0", "job.sh"], "Invalid value for '--micro-batch'"),
    ],
)
def test_zero_and_negative_counts_are_usage_errors(args: list[str], expected: str) -> None:
    result = invoke(*args)
    assert_clean(result)
    assert result.exit_code == 2 and expected in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([*FIT, "--dp", "10" * 15], "'--dp': " + "10" * 15 + " is not in the range 1<=x<=65536"),
        ([*FIT, "--mode", "train", "--dp", "65537"], "'--dp': 65537 is not in the range 1<=x<=65536"),
        ([*FIT, "--pp", "1000000000000"], "'--pp': 1000000000000 is not in the range 1<=x<=65536"),
        ([*FIT, "--tp", "65537"], "'--tp': 65537 is not in the range"),
        ([*FIT, "--batch", "100000000"], "'--batch': 100000000 is not in the range 1<=x<=16777216"),
        ([*FIT, "--seq", "1000000000000", "--beyond-context"], "'--seq': 1000000000000 is not in the range"),
        ([*FIT, "--micro-batch-size", "16777217"], "'--micro-batch-size': 16777217 is not in the range"),
        ([*PLAN, "--per-node", "70000"], "'--per-node': 70000 is not in the range 1<=x<=65536"),
        ([*PLAN, "--per-node", "1" + "0" * 30], "'--per-node': 1" + "0" * 30 + " is not in the range"),
        ([*PLAN, "--seq", "16777217"], "'--seq': 16777217 is not in the range 1<=x<=16777216"),
        (
            [
                "request",
                "explain",
                "--inventory",
                str(EXAMPLE),
                "--uid",
                "1" + "0" * 20,
                "--gres",
                "gpumem:20G",
            ],
            "'--uid': 1" + "0" * 20 + " is not in the range 0<=x<=4294967294",
        ),
    ],
)
def test_counts_past_their_documented_maximum_are_usage_errors(args: list[str], expected: str) -> None:
    """adv26 fitbig, fitpp, fitbatch, fitseq, fitdp65537, pnbig, pnm, rquid: accepted (and ignored)
    before."""
    result = invoke(*args)
    assert_clean(result)
    assert result.exit_code == 2 and expected in result.stderr, result.output


def test_a_fit_layout_past_the_planners_devices_is_refused() -> None:
    result = invoke(*FIT, "--mode", "train", "--dp", "256", "--tp", "16", "--pp", "32")
    assert_clean(result)
    assert result.exit_code == 1 and result.stderr == (
        "slurm-hetero: --dp 256 --tp 16 --pp 32: a layout of 131,072 devices; at most 65,536, as plan takes\n"
    )


def test_a_sequence_beyond_the_context_is_refused_unless_asked_for() -> None:
    for args in (
        [*FIT, "--seq", "1025"],
        [*SBATCH, "--inventory", str(EXAMPLE), "--seq", "4096", "--wrap=true"],
    ):
        result = invoke(*args)
        assert_clean(result)
        assert result.exit_code == 1
        assert (
            "--seq" in result.stderr and "gpt2 takes 1 to 1024 tokens; pass --beyond-context" in result.stderr
        )
    assert invoke(*FIT, "--seq", "4096", "--beyond-context").exit_code == 0
    plan = invoke(*PLAN[:-4], "--seq", "1025")
    assert plan.exit_code == 1 and "gpt2 takes 1 to 1024 tokens" in plan.stderr
    fitted = json.loads(invoke(*FIT, "--json").stdout)  # default: 2048, or the context if shorter
    assert fitted["settings"]["seq"] == 1024


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a100_80g: .nan\n", "TFLOPS must be 1e-06 to 1e+06, got nan"),
        ("a100_80g: .inf\n", "TFLOPS must be 1e-06 to 1e+06, got inf; write a number a float holds"),
        ("a100_80g: -3\n", "TFLOPS must be 1e-06 to 1e+06, got -3"),
        (
            "a100_80g: {tflops: 100, gemm_half_elements: .nan}\n",
            "gemm_half_elements must be 0 to 1e+15, got nan",
        ),
    ],
)
def test_measured_values_must_be_finite_and_positive(tmp_path: Path, text: str, expected: str) -> None:
    measured = tmp_path / "measured.yaml"
    measured.write_text(text)
    for args in ([*PLAN, "--measured", str(measured)], [*LAUNCH, "--measured", str(measured)]):
        result = invoke(*args)
        assert_clean(result)
        assert result.exit_code == 1 and expected in result.stderr


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("price_per_hour_usd", ".nan"),
        ("price_per_hour_usd", "-1.5"),
        ("bf16_tflops", ".inf"),
        ("memory_gib", "0"),
    ],
)
def test_catalog_numbers_are_finite_and_not_negative(key: str, value: str) -> None:
    bundled = (REPO / "slurm_hetero" / "data" / "models.yaml").read_text()
    base = {s.type: dict(vars(s)) for s in parse_catalog_text(bundled, "models.yaml")}
    raw = {t: {k: v for k, v in d.items() if k != "patterns"} for t, d in base.items()}
    with pytest.raises(ConfigError, match=f"{key} must be a finite number"):
        merge_site_text(raw, f"models:\n- type: a100_80g\n  {key}: {value}\n", "site.yaml")


def test_simulated_nodes_must_be_in_a_named_inventory() -> None:
    result = invoke(*LAUNCH[:-1], "a100n1:a100_80g:2,ghost:l40s:1")
    assert_clean(result)
    assert result.exit_code == 1
    assert result.stderr == (
        f"slurm-hetero: --simulate: node ghost is not in the inventory {EXAMPLE} (its nodes: a100n1, "
        "ascendn1, l40sn1); simulate its nodes, or leave out --inventory to simulate catalog devices\n"
    )
    absent = invoke(*LAUNCH[:-4], "--inventory", "/nonexistent/inv.yaml", "--simulate", "a:l40s:1")
    assert absent.exit_code == 1 and "no such inventory file" in absent.stderr
    bad_name = invoke(*LAUNCH[:-1], "a;reboot:l40s:1")
    assert bad_name.exit_code == 1 and "node 'a;reboot' is not a host name" in bad_name.stderr


HOSTILE_ADDRESSES = [
    "a\nb",
    "a\0b",
    "a;reboot",
    "$(reboot)",
    "a b",
    "`x`",
    "a'b",
    "-x",
    "",
    "a" * 300,
    "host\r",
    "a" * 64,  # adv26b F13: a name between dots the resolver's IDNA codec refuses
    "a..b",
    ".",
]


@pytest.mark.parametrize("addr", HOSTILE_ADDRESSES)
def test_master_addr_is_a_host_name_or_ip_address(addr: str) -> None:
    with pytest.raises(LaunchPlanError, match="^--master-addr: .* is not a host name or IP address"):
        LaunchOptions(model=None, master_addr=addr)
    result = invoke(*LAUNCH, "--master-addr", addr) if "\0" not in addr else None
    if result is not None:
        assert_clean(result)
        assert result.exit_code == 1 and result.stderr.startswith("slurm-hetero: --master-addr: ")


@pytest.mark.parametrize("addr", ["node-1.cluster.local", "10.0.0.1", "fe80::1", "a100n1", "a" * 63, "n1."])
def test_master_addr_takes_names_and_addresses(addr: str) -> None:
    result = invoke(*LAUNCH, "--master-addr", addr)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ranks"][0]["env"]["MASTER_ADDR"] == syntax.address(addr)


@pytest.mark.parametrize(
    "options",
    [
        {"global_batch": 0},
        {"seq": -1},
        {"micro_batch": 0},
        {"network_gbs": math.nan},
        {"measured": {"a100": math.inf}},
        {"tp_sizes": (0,)},
        {"tp_sizes": ()},
        {"master_port": 70000},
    ],
)
def test_launch_options_check_their_values_for_library_callers_too(options: dict[str, object]) -> None:
    with pytest.raises(LaunchPlanError, match="must be"):
        LaunchOptions(model="gpt2", **options)  # type: ignore[arg-type]


def _layout_document() -> dict[str, object]:
    """Rank 0's layout document as its file holds it (the dry run names groups by place)."""
    result = invoke(*LAUNCH)
    assert result.exit_code == 0, result.output
    dry_run = json.loads(result.stdout)
    layout = dict(dry_run["ranks"][0]["layout"])
    return {**layout, "groups": [dry_run["groups"][i] for i in layout["groups"]]}


@pytest.mark.parametrize("weight", ["NaN", "Infinity", "-0.5", "1.5", "0.25"])
def test_a_layout_with_a_bad_grad_weight_is_refused(weight: str) -> None:
    document = _layout_document()
    text = json.dumps({**document, "grad_weight": "W"}).replace('"W"', weight)
    with pytest.raises(LayoutError, match="grad_weight|NaN|Infinity"):
        RankLayout.from_json(text, "rank-0.json")
    assert RankLayout.from_json(json.dumps(document), "rank-0.json").grad_weight == document["grad_weight"]


@pytest.mark.parametrize("weight", [math.nan, math.inf, -0.1, 1.5, None, True])
def test_training_refuses_a_nan_gradient_weight(weight: object) -> None:
    with pytest.raises(LayoutError, match=r"grad_weight must be a number in \[0, 1\]"):
        training.grad_weight({"grad_weight": weight})
    assert training.grad_weight({"grad_weight": 0.25}) == 0.25


def _commands(
    group: click.Group, prefix: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], click.Command]]:
    """Every command, as click finds them (the group imports a command's module when asked)."""
    out = []
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        assert command is not None, name
        out.append(((*prefix, name), command))
        if isinstance(command, click.Group):
            out.extend(_commands(command, (*prefix, name)))
    return out


NUMERIC_PARAMS = [
    ("/".join(path), param.name)
    for path, command in _commands(cli)
    for param in command.params
    if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType))
]


def test_the_walk_finds_the_numeric_options() -> None:
    assert ("plan", "global_batch") in NUMERIC_PARAMS and ("launch", "master_port") in NUMERIC_PARAMS
    assert ("plan", "network_gbs") in NUMERIC_PARAMS and ("fit", "tp") in NUMERIC_PARAMS


@pytest.mark.parametrize(("path", "name"), NUMERIC_PARAMS)
def test_every_numeric_option_takes_ascii_digits_only(path: str, name: str) -> None:
    """N05/N09: click's int() and float() read '٢' and '２' as 2; every numeric option is a Count
    or a FiniteFloat, which refuse them."""
    command = dict(_commands(cli))[tuple(path.split("/"))]
    [param] = [p for p in command.params if p.name == name]
    for digit in ("٢", "２", "1_0"):
        with pytest.raises(click.BadParameter, match="ASCII digits"):
            param.type.convert(digit, param, None)
    assert param.type.convert("1", param, None) == 1


@pytest.mark.parametrize(
    "args",
    [
        ["launch", "--dry-run", "--simulate", "x1:a100_80g:٢"],
        ["launch", "--dry-run", "--simulate", "x1:a100_80g:２"],
        ["launch", "--dry-run", "--model", "gpt2", "--tp-sizes", "２", "--simulate", "x1:a100_80g:2"],
        ["launch", "--dry-run", "--model", "gpt2", "--tp-sizes", "1,٤", "--simulate", "x1:a100_80g:2"],
        ["plan", "--devices", "h100:4", "--global-batch", "８"],
        ["discover", "--from-file", "x", "--real-memory", "٢"],
    ],
)
def test_non_ascii_digits_are_refused_in_specs(args: list[str]) -> None:
    result = invoke(*args)
    assert_clean(result)
    assert result.exit_code in (1, 2), result.output


@pytest.mark.parametrize("text", ["٢", "２", "1_0", " 1", "+1", "-1", "", "1" * 19, "¹"])
def test_whole_number_takes_ascii_digits_only(text: str) -> None:
    assert syntax.whole_number(text) is None
    assert syntax.whole_number("0012") == 12 and syntax.whole_number("9" * 18) == 10**18 - 1


@pytest.mark.parametrize(
    "args",
    [
        ["discover", "--from-file", "", "--node", "x"],
        ["gres", "render", "--inventory", "", "--out", "out"],
        ["health", "--inventory", str(EXAMPLE), "--node", "a100n1", "--from-file", ""],
        ["install", "--prefix", ""],
        # adv49 rows 155-186: the other path options, then names
        ["discover", "--host-root", "", "--vendor", "nvidia", "--node", "x"],
        ["gres", "render", "--inventory", str(EXAMPLE), "--out", ""],
        ["gres", "render", "--inventory", str(EXAMPLE), "--out", "out", "--template-dir", ""],
        ["job-submit", "render", "--inventory", str(EXAMPLE), "--out", ""],
        ["plan", "--devices", "a100:2", "--model", "gpt2", "--measured", ""],
        ["launch", "--dry-run", "--log-dir", "", "--", "true"],
        ["plan", "--devices", "a100:2", "--model", ""],
        ["launch", "--model", "", "--dry-run", "--", "true"],
        ["calibrate", "--model", "", "--device", "cpu"],
        ["fit", "--model", ""],
        ["report", "--log", ""],
        ["metrics", "--log", ""],
        ["discover", "--nodes", ""],
        ["install", "--config", ""],
    ],
)
def test_an_empty_path_or_name_is_a_usage_error(args: list[str]) -> None:
    """adv48 row 207: `--from-file ''` read as the current directory ('.: capture file is a
    directory'); adv49: `gres render --out ''` wrote into it, `plan --model ''` read its config.json,
    `report --log ''` took the default."""
    result = invoke(*args)
    assert_clean(result)
    assert result.exit_code == 2 and (
        "'' names no file or directory (. is the current one)." in result.stderr
        or "'' names nothing." in result.stderr
    )
