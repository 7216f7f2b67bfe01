"""Sizes as Slurm writes them (`20G`, a bare number is MiB), and the limits and wording of the
request grammar, which `submit.tables` copies into the hook's table (the hook alone reads
requests). Pure.
"""

from __future__ import annotations

import re

from slurm_hetero.core.errors import RequestError

UNITS = {"": 1, "M": 1, "G": 1024, "T": 1024 * 1024}  # size suffix -> MiB
MAX_DIGITS = 15  # longer numbers are "too large" before any arithmetic (exact in Lua doubles)
MAX_MIB = 1024**3  # 1024T per device
MAX_COUNT = 9999  # devices per request

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

_SIZE = re.compile(r"([0-9]+)([MGTmgt]?)")
_NEGATIVE = re.compile(r"-[0-9]+[A-Za-z]*")
_SUFFIXED = re.compile(r"[0-9]+([A-Za-z]+)")


def _fail(item: str, key: str, *args: object) -> RequestError:
    return RequestError(item, REQUEST_MESSAGES[key] % args)


def _too_large(item: str, limit: int) -> RequestError:
    if limit == MAX_MIB:
        return _fail(item, "size_too_large")  # the hook's words for a device's memory
    suffix = next(s for s, unit in sorted(UNITS.items(), key=lambda x: -x[1]) if limit % unit == 0)
    return RequestError(item, f"size is too large (at most {limit // UNITS[suffix]}{suffix or ' MiB'})")


def parse_size(value: str, item: str = "gpumem", limit: int = MAX_MIB) -> int:
    """`20G` -> 20480 (MiB); `item` names the request in errors, `limit` the most MiB it may be."""
    if m := _SIZE.fullmatch(value):
        digits, suffix = m.groups()
        if len(digits) > MAX_DIGITS:
            raise _too_large(item, limit)
        mib = int(digits) * UNITS[suffix.upper()]
        if mib == 0:
            raise _fail(item, "size_not_positive")
        if mib > limit:
            raise _too_large(item, limit)
        return mib
    if value == "":
        raise _fail(item, "size_missing")
    if _NEGATIVE.fullmatch(value):
        raise _fail(item, "size_not_positive")
    if suffixed := _SUFFIXED.fullmatch(value):
        raise _fail(item, "size_suffix", suffixed.group(1))
    raise _fail(item, "size_not_number")


def format_size(mib: int) -> str:
    """A size as Slurm writes it: `80G` when whole GiB, else `46068M`."""
    return f"{mib // 1024}G" if mib % 1024 == 0 else f"{mib}M"
