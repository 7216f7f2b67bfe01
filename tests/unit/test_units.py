"""The request grammar (slurm_hetero.units): sizes, items, fields, and the shared case table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from slurm_hetero.errors import RequestError
from slurm_hetero.units import (
    MAX_MIB,
    SLASH,
    SLASH_COLON,
    format_size,
    has_ours,
    parse_fields,
    parse_gpu,
    parse_request,
    parse_size,
    split_items,
)

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


def test_items_keep_prefix_form_and_verbatim_text() -> None:
    items = split_items("gres:gpumem:20G,gres/gpu:a100=2,shard:1,,gres:x=y,gres/gpumem:20G")
    assert [(i.prefix, i.body, i.name) for i in items] == [
        ("gres:", "gpumem:20G", "gpumem"),
        ("gres/", "gpu:a100=2", "gpu"),
        ("", "shard:1", "shard"),
        ("", "", ""),
        ("gres:", "x=y", "x"),
        ("gres/", "gpumem:20G", "gpumem"),
    ]
    assert [i.form for i in items] == ["22.05", SLASH, "22.05", "22.05", "22.05", SLASH_COLON]
    assert split_items(None) == [] and split_items("") == []


@pytest.mark.parametrize(
    "body, expected",
    [
        ("gpu", (None, 1)),
        ("gpu:2", (None, 2)),
        ("gpu:a100", ("a100", 1)),
        ("gpu:a100:2", ("a100", 2)),
        ("gpu=2", (None, 2)),
        ("gpu:a100=3", ("a100", 3)),
        ("gpu:7x", ("7x", 1)),
    ],
)
def test_gpu_items(body: str, expected: tuple[str | None, int]) -> None:
    assert parse_gpu(split_items(body)[0]) == expected


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
    ],
)
def test_bad_gpu_items(body: str, reason: str) -> None:
    with pytest.raises(RequestError, match=f"^{body}: {reason}"):
        parse_gpu(split_items(body)[0])


def test_parse_request_plain_and_tres_forms() -> None:
    plain = parse_request("gpu:a100_80g:2,gpumem:20G,shard:1")
    assert (plain.gpumem_mib, plain.gpu_type, plain.gpu_count, plain.other) == (
        20480,
        "a100_80g",
        2,
        ("shard:1",),
    )
    assert plain.text == "gpu:a100_80g:2,gpumem:20G" and plain.memory_items == ("gpumem:20G",)
    slash = parse_request("gres/gpucore=40,gres/gpu=3")
    assert (slash.gpucore, slash.gpu_count, slash.form, slash.count) == (40, 3, SLASH, 3)
    assert parse_request("gres:gpumem:1G").count == 1 and parse_request("gres:gpumem:1G").asks


def test_fields_check_in_order_and_types_when_known() -> None:
    fields = [("tres_per_node", "gres:gpumem:abc"), ("tres_per_job", "gres:gpucore:500")]
    with pytest.raises(RequestError, match="^gpumem:abc: not a size"):
        parse_fields(fields)
    with pytest.raises(RequestError, match="^gpu:h100:1: unknown device type h100; known types: a, b$"):
        parse_fields([("tres_per_node", "gres:gpu:h100:1,gres:gpumem:1G")], {"b", "a"})
    assert not has_ours([("tres_per_node", "gres:gpu:a:b:c"), ("tres_per_job", None)])


@pytest.mark.parametrize("case", [c for c in load_cases() if "units" in c], ids=lambda c: c["name"])
def test_shared_cases(case: dict[str, Any]) -> None:
    """The `units:` expectations of tests/cases/requests.yaml."""
    fields = [(name, case["job"].get(name)) for name in FIELDS]
    expected = dict(case["units"])
    if "error" in expected:
        with pytest.raises(RequestError) as err:
            parse_fields(fields)
        assert expected["error"] in str(err.value)
        return
    request = parse_fields(fields)
    for key, value in expected.items():
        got = getattr(request, key)
        assert (list(got) if isinstance(got, tuple) else got) == value, key


@given(st.text(max_size=40))
def test_garbage_never_escapes_as_another_exception(text: str) -> None:
    try:
        request = parse_request(text)
    except RequestError as e:
        assert str(e).startswith(e.text + ": ")
        return
    assert request.gpumem_mib is None or 1 <= request.gpumem_mib <= MAX_MIB
