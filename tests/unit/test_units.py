"""Sizes (slurm_hetero.core.units) and the hook's reading of a request (its `gather`, through
`submit.hook.Hook.request`) on the shared case table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from slurm_hetero.core.errors import RequestError
from slurm_hetero.core.units import MAX_MIB, format_size, parse_size
from slurm_hetero.submit.hook import Hook, Request, cluster_hook

CASES_FILE = Path(__file__).resolve().parents[1] / "cases" / "requests.yaml"
FIELDS = ("tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket")


def load_cases() -> list[dict[str, Any]]:
    return list(yaml.safe_load(CASES_FILE.read_text())["cases"])


@pytest.mark.parametrize(
    "text, mib",
    [
        ("1", 1),
        ("20480", 20480),
        ("20M", 20),
        ("20G", 20480),
        ("20g", 20480),
        ("2T", 2 * 1024**2),
        ("0001G", 1024),
        ("1024T", MAX_MIB),
        ("1048576G", MAX_MIB),
    ],
)
def test_sizes(text: str, mib: int) -> None:
    assert parse_size(text) == mib


@pytest.mark.parametrize(
    "text, reason",
    [
        ("-5", "size must be positive"),
        ("-5G", "size must be positive"),
        ("0", "size must be positive"),
        ("0G", "size must be positive"),
        ("abc", "not a size"),
        ("1.5G", "not a size"),
        ("20 G", "not a size"),
        ("G", "not a size"),
        ("", "missing size"),
        ("9E", "unknown size suffix E;"),
        ("10K", "unknown size suffix K;"),
        ("1GB", "unknown size suffix GB;"),
        ("1025T", "size is too large"),
        ("9" * 16, "size is too large"),
        ("99999999999999999999999G", "size is too large"),
        ("٣G", "not a size"),  # only ASCII digits
    ],
)
def test_bad_sizes_name_the_item(text: str, reason: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_size(text, f"gpumem:{text}")
    assert str(err.value).startswith(f"gpumem:{text}: {reason}")


def test_format_size_round_trips_whole_gib() -> None:
    assert (format_size(81920), format_size(46068)) == ("80G", "46068M")


@given(st.integers(min_value=1, max_value=MAX_MIB))
def test_format_then_parse_is_identity(mib: int) -> None:
    assert parse_size(format_size(mib)) == mib


@pytest.fixture(scope="module")
def hook() -> Hook:
    """The hook for gres_conf/examples/mixed.yaml (its types: a100_80g, ascend910b3, l40s)."""
    from slurm_hetero.engine.score import ScoringOptions, compile_model
    from slurm_hetero.inventory import document as inventory
    from slurm_hetero.inventory.catalog import load_catalog
    from slurm_hetero.inventory.nodes import slurm_nodes
    from tests.conftest import REPO

    nodes = slurm_nodes(inventory.load(REPO / "gres_conf" / "examples" / "mixed.yaml"), load_catalog())
    return cluster_hook(compile_model(nodes, ScoringOptions()), (), "open")


def _request(hook: Hook, text: str) -> Request:
    return hook.request([("tres_per_node", text)])


@pytest.mark.parametrize(
    "body, expected",
    [
        ("gpu", (None, 1)),
        ("gpu:2", (None, 2)),
        ("gpu:l40s", ("l40s", 1)),
        ("gpu:l40s:2", ("l40s", 2)),
        ("gpu=2", (None, 2)),
        ("gpu:l40s=3", ("l40s", 3)),
    ],
)
def test_gpu_items(hook: Hook, body: str, expected: tuple[str | None, int]) -> None:
    request = _request(hook, body)
    assert (request.gpu_type, request.count) == expected


@pytest.mark.parametrize(
    "body, reason",
    [
        ("gpu:", "malformed"),
        ("gpu::2", "malformed"),
        ("gpu:a:1:2", "malformed"),
        ("gpu:a:1=2", "malformed"),
        ("gpu:a b", "malformed"),
        ("gpu=", "device count"),
        ("gpu:0", "device count"),
        ("gpu:a:10000", "device count"),
        ("gpu=x", "device count"),
        ("gpu:7x", "unknown device type 7x; known types: a100_80g, ascend910b3, l40s"),
    ],
)
def test_bad_gpu_items(hook: Hook, body: str, reason: str) -> None:
    with pytest.raises(RequestError, match=f"^{body}: {reason}"):
        _request(hook, body)


def test_the_request_reads_plain_and_tres_forms(hook: Hook) -> None:
    plain = _request(hook, "gpu:a100_80g:2,gpumem:20G,shard:1")
    assert (plain.gpumem_mib, plain.gpu_type, plain.gpu_count, plain.text) == (
        20480,
        "a100_80g",
        2,
        "gpu:a100_80g:2,gpumem:20G",
    )
    slash = _request(hook, "gres/gpucore=40,gres/gpu=3")
    assert (slash.gpucore, slash.gpu_count, slash.form, slash.count) == (40, 3, "slash", 3)
    assert _request(hook, "gres:gpumem:1G").count == 1 and _request(hook, "gres:gpumem:1G").asks
    assert not hook.asks_us("gres:gpu:a:b:c") and hook.asks_us("gres:gpumem:abc")


def test_fields_check_in_order(hook: Hook) -> None:
    fields = [("tres_per_node", "gres:gpumem:abc"), ("tres_per_job", "gres:gpucore:500")]
    with pytest.raises(RequestError, match="^gpumem:abc: not a size"):
        hook.request(fields)


@pytest.mark.parametrize("case", [c for c in load_cases() if "units" in c], ids=lambda c: c["name"])
def test_shared_cases(hook: Hook, case: dict[str, Any]) -> None:
    """The `units:` expectations of tests/cases/requests.yaml, read by the hook (`gather`)."""
    fields = [(name, case["job"].get(name)) for name in FIELDS]
    expected = dict(case["units"])
    if "error" in expected:
        with pytest.raises(RequestError) as err:
            hook.request(fields)
        assert expected["error"] in str(err.value)
        return
    request = hook.request(fields)
    for key, value in expected.items():
        assert getattr(request, key) == value, key


@given(st.text(max_size=40))
def test_garbage_never_escapes_as_another_exception(hook: Hook, text: str) -> None:
    try:
        request = _request(hook, text)
    except RequestError as e:
        assert str(e).startswith(e.text + ": ")
        return
    assert request.gpumem_mib is None or 1 <= request.gpumem_mib <= MAX_MIB


def test_a_size_past_its_own_limit_names_that_limit() -> None:
    """adv26b F11: a size bounded otherwise than a device's (RealMemory) says its own bound."""
    assert parse_size("4096T", "--real-memory", 1 << 32) == 1 << 32
    for text in ("4097T", "4294967297", "9" * 20):
        with pytest.raises(RequestError, match=r"^--real-memory: size is too large \(at most 4096T\)$"):
            parse_size(text, "--real-memory", 1 << 32)
    with pytest.raises(RequestError, match=r"at most 1024T per device"):
        parse_size("1025T")
