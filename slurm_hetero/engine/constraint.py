"""Slurm's `--constraint` grammar, read well enough to filter device types. Pure.

`parse` turns a constraint into `Constraint`: a tuple of *alternatives* (more than one only for a
matching OR `[a|b]`, where every node of the job must pick the same one), each an OR of AND-sets
(disjunctive normal form). A node satisfies an alternative when its features hold every feature
of one AND-set. `job_submit.lua` has the same parser (`parse_constraint`); both reject the same
texts with the same message:

- `&` (AND), `|` (OR), parentheses, and one `[..|..]` matching OR joined by AND are read;
- node counts (`a*2`, `[a*2&b*4]`) are rejected: they spread a job over feature groups in ways a
  per-type check cannot mirror;
- parentheses nested more than `MAX_DEPTH` (1) deep are rejected with their own message, before
  parsing (the parser recurses once per level: 500 levels crashed it): slurmctld refuses a `(`
  inside parentheses on 22.05 and 24.11 ("Invalid feature specification"; job_scheduler.c,
  measured at 20 levels);
- anything else (empty names, unbalanced or nested brackets, a matching OR under `|`, more than
  `MAX_TERMS` AND-sets) is rejected as unreadable.
- more than `MAX_TERMS` AND-sets once written out (`ib|ib|...`, `(a|b)&(c|d)&...`) are rejected
  with their own message (`constraint_terms`), naming that limit.
"""

from __future__ import annotations

import re

from slurm_hetero.engine.reasons import render
from slurm_hetero.errors import RequestError

Dnf = tuple[frozenset[str], ...]  # an OR of AND-sets of feature names
Alternatives = tuple[Dnf, ...]  # matching-OR alternatives, each a Dnf

MAX_TERMS = 64
MAX_DEPTH = 1  # slurmctld's: one level of parentheses
NO_CONSTRAINT: Alternatives = ((frozenset(),),)
_TOKEN = re.compile(r"[A-Za-z0-9_.\-]+|[&|()\[\]]")
_COUNT = re.compile(r"\*[0-9]*")


class _Bad(Exception):
    """Unreadable: rejected with the `constraint_bad` message."""


class _TooMany(Exception):
    """More than `MAX_TERMS` AND-sets: rejected with the `constraint_terms` message."""


def _and(left: list[Dnf], right: list[Dnf]) -> list[Dnf]:
    out = [tuple(a | b for a in x for b in y) for x in left for y in right]
    if sum(len(d) for d in out) > MAX_TERMS:
        raise _TooMany
    return out


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.at, self.brackets = tokens, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise _Bad
        self.at += 1
        return token

    def either(self) -> list[Dnf]:
        value = self.both()
        while self.peek() == "|":
            self.take()
            other = self.both()
            if len(value) != 1 or len(other) != 1:
                raise _Bad
            if len(value[0]) + len(other[0]) > MAX_TERMS:
                raise _TooMany
            value = [value[0] + other[0]]
        return value

    def both(self) -> list[Dnf]:
        value = self.factor()
        while self.peek() == "&":
            self.take()
            value = _and(value, self.factor())
        return value

    def factor(self) -> list[Dnf]:
        token = self.take()
        if token == "(":
            value = self.either()
            if self.take() != ")":
                raise _Bad
            return value
        if token == "[":
            self.brackets += 1
            if self.brackets > 1:
                raise _Bad
            inner = self.either()
            if self.take() != "]" or len(inner) != 1:
                raise _Bad
            return [(term,) for term in inner[0]]
        if token in "&|)]":
            raise _Bad
        return [(frozenset({token}),)]


def _depth(tokens: list[str]) -> int:
    """How deep the parentheses nest (unbalanced ones are the parser's to refuse)."""
    depth = deepest = 0
    for token in tokens:
        depth += 1 if token == "(" else -1 if token == ")" else 0
        deepest = max(deepest, depth)
    return deepest


def parse(text: str) -> Alternatives:
    """The constraint's alternatives; RequestError with the hook's message when unreadable."""
    if _COUNT.search(text):
        raise RequestError(f"--constraint={text}", render("constraint_counts"))
    tokens = _TOKEN.findall(text)
    try:
        if "".join(tokens) != text:
            raise _Bad
        if _depth(tokens) > MAX_DEPTH:
            raise RequestError(f"--constraint={text}", render("constraint_deep", MAX_DEPTH))
        parser = _Parser(tokens)
        value = parser.either()
        if parser.peek() is not None:
            raise _Bad
    except _Bad:
        raise RequestError(f"--constraint={text}", render("constraint_bad")) from None
    except _TooMany:
        raise RequestError(f"--constraint={text}", render("constraint_terms", MAX_TERMS)) from None
    return tuple(value)


def satisfies(dnf: Dnf, features: frozenset[str]) -> bool:
    """Whether a node with `features` satisfies one alternative."""
    return any(term <= features for term in dnf)
