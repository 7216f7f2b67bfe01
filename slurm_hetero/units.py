"""Strict parsers for request sizes and Slurm TRES strings. Pure.

This is the request grammar that `job_submit/job_submit.lua` implements line for line; the two
are tested against each other on `tests/cases/requests.yaml` and on generated requests.

A TRES string is comma-separated items. Each item is `gres:BODY` (Slurm 22.05), `gres/BODY`
(later releases; 24.11 hands `--gres=gpumem:20G` over as `gres/gpumem:20G` and `--gpus=a100:1` as
`gres/gpu:a100:1`) or a plain `BODY` (what `--gres=` takes). Only three names are ours:

- `gpumem:SIZE` (or `gpumem=SIZE`): memory per device. SIZE is digits with an optional `M`,
  `G` or `T` suffix (binary, either case); a bare number is MiB. Negative, zero, non-numeric,
  fractional, oversized values and other suffixes (`9E`, `10K`, `1GB`) are rejected.
- `gpucore:P` (or `gpucore=P`): percent of one device's compute, a whole number 1..100.
- `gpu`, `gpu:N`, `gpu:TYPE`, `gpu:TYPE:N`, `gpu=N`, `gpu:TYPE=N`: the device count (default 1).

Every other item is kept verbatim. Only ASCII digits count as digits (Lua's `%d`).

The form of the first gpumem/gpucore item decides how the hook writes its answer, so each release
gets back what it handed over: `gres:gpu:a100:2` (form "22.05"), `gres/gpu:a100:2` ("24.11": the
`gres/` prefix with `:` before the value) or `gres/gpu:a100=2` ("slash": `gres/` with `=`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from slurm_hetero.engine.reasons import render
from slurm_hetero.errors import RequestError

# TRES string forms: `gres:gpu:a100:2`, `gres/gpu:a100:2` and `gres/gpu:a100=2`
COLON, SLASH_COLON, SLASH = "22.05", "24.11", "slash"
FORMS = (COLON, SLASH_COLON, SLASH)
PREFIXES = ("gres:", "gres/")
UNITS = {"": 1, "M": 1, "G": 1024, "T": 1024 * 1024}  # size suffix -> MiB
MAX_DIGITS = 15  # longer numbers are "too large" before any arithmetic (exact in Lua doubles)
MAX_MIB = 1024**3  # 1024T per device
MAX_COUNT = 9999  # devices per request
OURS = ("gpu", "gpumem", "gpucore")

#: Reasons for malformed items (`ITEM: REASON`); copied into the Lua table.
REQUEST_MESSAGES = {
    "size_missing": "missing size, e.g. gpumem:20G",
    "size_not_number": "not a size; use a whole number with an optional M, G or T suffix "
    "(a bare number is MiB), e.g. gpumem:20G",
    "size_not_positive": "size must be positive",
    "size_suffix": "unknown size suffix %s; use M, G or T (a bare number is MiB)",
    "size_too_large": "size is too large (at most 1024T per device)",
    "mem_malformed": "malformed; use gpumem:SIZE",
    "core_bad": "gpucore must be a whole percent from 1 to 100, e.g. gpucore:30",
    "gpu_malformed": "malformed; use gpu:N or gpu:TYPE:N",
    "count_bad": "device count must be a whole number from 1 to 9999",
    "duplicate": "given more than once",
    "count_twice": "device count given more than once",
}

_DIGITS = re.compile(r"[0-9]+")
_SIZE = re.compile(r"([0-9]+)([MGTmgt]?)")
_NEGATIVE = re.compile(r"-[0-9]+[A-Za-z]*")
_SUFFIXED = re.compile(r"[0-9]+([A-Za-z]+)")
_TYPE = re.compile(r"[A-Za-z0-9_.\-]+")


def _fail(item: str, key: str, *args: object) -> RequestError:
    return RequestError(item, REQUEST_MESSAGES[key] % args)


@dataclass(frozen=True)
class Item:
    """One comma-separated entry of a TRES string, split but not yet validated."""

    text: str  # verbatim, as Slurm stored it
    prefix: str  # "gres:", "gres/" or ""
    body: str  # text without the prefix: what users type after --gres=
    name: str  # body up to the first ':' or '='

    @property
    def form(self) -> str:
        if self.prefix != "gres/":
            return COLON
        return SLASH if "=" in self.body else SLASH_COLON

    @property
    def ours(self) -> bool:
        return self.name in OURS


def split_items(text: str | None) -> list[Item]:
    """The items of a TRES string (like `str.split(',')`); never raises. None/'' has none."""
    if not text:
        return []
    items = []
    for raw in text.split(","):
        prefix = next((p for p in PREFIXES if raw.startswith(p)), "")
        body = raw[len(prefix) :]
        items.append(Item(raw, prefix, body, re.match(r"[^:=]*", body).group()))  # type: ignore[union-attr]
    return items


def _value(item: Item) -> tuple[list[str], str | None]:
    """The ':'-separated tokens before '=' and the text after the first '=' (None without one)."""
    left, eq, right = item.body.partition("=")
    return left.split(":"), (right if eq else None)


def parse_size(value: str, item: str = "gpumem") -> int:
    """`20G` -> 20480 (MiB). `item` names the request in the error message."""
    m = _SIZE.fullmatch(value)
    if m:
        digits, suffix = m.groups()
        if len(digits) > MAX_DIGITS:
            raise _fail(item, "size_too_large")
        mib = int(digits) * UNITS[suffix.upper()]
        if mib == 0:
            raise _fail(item, "size_not_positive")
        if mib > MAX_MIB:
            raise _fail(item, "size_too_large")
        return mib
    if value == "":
        raise _fail(item, "size_missing")
    if _NEGATIVE.fullmatch(value):
        raise _fail(item, "size_not_positive")
    suffixed = _SUFFIXED.fullmatch(value)
    if suffixed:
        raise _fail(item, "size_suffix", suffixed.group(1))
    raise _fail(item, "size_not_number")


def format_size(mib: int) -> str:
    """A size as Slurm writes it: `80G` when whole GiB, else `46068M`."""
    return f"{mib // 1024}G" if mib % 1024 == 0 else f"{mib}M"


def parse_gpumem(item: Item) -> int:
    """The MiB of a `gpumem:SIZE` / `gpumem=SIZE` item."""
    tokens, value = _value(item)
    if value is None:
        if len(tokens) == 1:
            raise _fail(item.body, "size_missing")
        if len(tokens) > 2:
            raise _fail(item.body, "mem_malformed")
        value = tokens[1]
    elif len(tokens) > 1:
        raise _fail(item.body, "mem_malformed")
    return parse_size(value, item.body)


def parse_gpucore(item: Item) -> int:
    """The percent of a `gpucore:P` / `gpucore=P` item (1..100)."""
    tokens, value = _value(item)
    if value is None:
        value = tokens[1] if len(tokens) == 2 else ""
    elif len(tokens) > 1:
        value = ""
    if not _DIGITS.fullmatch(value) or len(value) > 3 or not 1 <= int(value) <= 100:
        raise _fail(item.body, "core_bad")
    return int(value)


def _count(text: str, item: Item) -> int:
    if not _DIGITS.fullmatch(text) or len(text) > 4 or int(text) == 0:
        raise _fail(item.body, "count_bad")
    return int(text)


def parse_gpu(item: Item) -> tuple[str | None, int]:
    """(type or None, count) of a gpu item; a missing count is 1."""
    tokens, value = _value(item)
    if len(tokens) > (2 if value is not None else 3) or any(t == "" for t in tokens[1:]):
        raise _fail(item.body, "gpu_malformed")
    gpu_type = tokens[1] if len(tokens) >= 2 else None
    count = value if value is not None else (tokens[2] if len(tokens) == 3 else None)
    if value is None and len(tokens) == 2 and _DIGITS.fullmatch(tokens[1]):
        gpu_type, count = None, tokens[1]
    if gpu_type is not None and not _TYPE.fullmatch(gpu_type):
        raise _fail(item.body, "gpu_malformed")
    return gpu_type, (1 if count is None else _count(count, item))


@dataclass(frozen=True)
class Request:
    """What a job asks of our GRES, gathered from all its TRES fields."""

    gpumem_mib: int | None = None
    gpucore: int | None = None
    gpu_count: int | None = None  # None: no gpu item (count defaults to 1)
    gpu_type: str | None = None
    gpu_field: str | None = None  # the field the gpu item came from
    form: str = COLON  # form of the first gpumem/gpucore item: how to write back
    shown: tuple[str, ...] = ()  # our items as written (without prefix), in order
    memory_items: tuple[str, ...] = ()  # the gpumem/gpucore items among them
    other: tuple[str, ...] = ()  # every other item, verbatim

    @property
    def count(self) -> int:
        return self.gpu_count or 1

    @property
    def asks(self) -> bool:
        """True when gpumem or gpucore is requested (the hook leaves other jobs alone)."""
        return self.gpumem_mib is not None or self.gpucore is not None

    @property
    def text(self) -> str:
        return ",".join(self.shown)


@dataclass
class _Gather:
    """A request being gathered item by item (the order matters: the first bad item rejects)."""

    known_types: Collection[str] | None
    gpumem: int | None = None
    gpucore: int | None = None
    gpu: tuple[str | None, int, str] | None = None  # type, count, field
    form: str | None = None
    shown: list[str] = field(default_factory=list)
    memory_items: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)

    def add(self, field_name: str, item: Item) -> None:
        if not item.ours:
            self.other.append(item.text)
            return
        self.shown.append(item.body)
        if item.name == "gpu":
            self._gpu(field_name, item)
            return
        if getattr(self, item.name) is not None:
            raise _fail(item.body, "duplicate")
        self.memory_items.append(item.body)
        if item.name == "gpumem":
            self.gpumem = parse_gpumem(item)
        else:
            self.gpucore = parse_gpucore(item)
        self.form = self.form or item.form

    def _gpu(self, field_name: str, item: Item) -> None:
        if self.gpu is not None:
            raise _fail(item.body, "count_twice")
        gpu_type, count = parse_gpu(item)
        if gpu_type is not None and self.known_types is not None and gpu_type not in self.known_types:
            known = ", ".join(sorted(self.known_types))
            raise RequestError(item.body, render("unknown_type", gpu_type, known))
        self.gpu = (gpu_type, count, field_name)

    def request(self) -> Request:
        gpu_type, count, gpu_field = self.gpu or (None, None, None)
        return Request(
            self.gpumem,
            self.gpucore,
            count,
            gpu_type,
            gpu_field,
            self.form or COLON,
            tuple(self.shown),
            tuple(self.memory_items),
            tuple(self.other),
        )


def has_ours(fields: Sequence[tuple[str, str | None]]) -> bool:
    """Whether any field has a gpumem or gpucore item (cheap: names only)."""
    return any(i.name in ("gpumem", "gpucore") for _, text in fields for i in split_items(text))


def parse_fields(
    fields: Sequence[tuple[str, str | None]], known_types: Collection[str] | None = None
) -> Request:
    """Gather a request from (field name, TRES string) pairs, checking items in order; the first
    bad item raises RequestError. With `known_types`, a gpu TYPE must be one of them."""
    gather = _Gather(known_types)
    for name, text in fields:
        for item in split_items(text):
            gather.add(name, item)
    return gather.request()


def parse_request(text: str) -> Request:
    """One TRES or --gres string, e.g. `gres:gpumem:20G,gres:gpu:a100:2` or `gpumem:20G`."""
    return parse_fields([("tres_per_node", text)])
