"""Slurm's --constraint grammar as the hook reads it (engine.constraint; Lua repeats it)."""

from __future__ import annotations

import pytest

from slurm_hetero.engine.constraint import parse, satisfies
from slurm_hetero.errors import RequestError


@pytest.mark.parametrize(
    ("text", "alternatives"),
    [
        ("a", [[{"a"}]]),
        ("a&b", [[{"a", "b"}]]),
        ("a|b", [[{"a"}, {"b"}]]),
        ("(a|b)&c", [[{"a", "c"}, {"b", "c"}]]),
        ("ib&[x|y]", [[{"ib", "x"}], [{"ib", "y"}]]),
        ("[a|b]", [[{"a"}], [{"b"}]]),
    ],
)
def test_grammar(text: str, alternatives: list[list[set[str]]]) -> None:
    assert [[set(t) for t in alt] for alt in parse(text)] == alternatives


@pytest.mark.parametrize("text", ["a||b", "[a|[b]]", "a|[b|c]", "(a", "a,b", "ib&", "", "a b", "[a]&[b]"])
def test_unreadable_is_rejected(text: str) -> None:
    with pytest.raises(RequestError, match="cannot read it"):
        parse(text)


@pytest.mark.parametrize("text", ["a*2", "[a*2&b*4]", "*"])
def test_counts_are_rejected(text: str) -> None:
    with pytest.raises(RequestError, match=r"node counts \(\*N\)"):
        parse(text)


def test_satisfies_any_term() -> None:
    (dnf,) = parse("(a|b)&c")
    assert satisfies(dnf, frozenset({"b", "c"})) and not satisfies(dnf, frozenset({"a"}))


def test_too_many_terms_names_the_limit() -> None:
    with pytest.raises(RequestError, match="more than 64 alternatives"):
        parse("&".join(f"({chr(97 + i)}|x{i})" for i in range(7)))
