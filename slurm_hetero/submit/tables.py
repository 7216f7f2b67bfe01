"""The Lua data table that `job_submit.lua` reads: a compiled `ClusterModel` plus the hook's
settings and wording. Pure: text in, text out.

Its keys (format 1) and their meaning: docs/submit-protocol.md, "The data table". Everything is
sorted and every string an escaped Lua literal, so the same inputs give the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from slurm_hetero import __version__
from slurm_hetero.core import hostlist, units
from slurm_hetero.engine.reasons import CODE_ORDER, LABELS, MESSAGES, SHOWN_CHARS, ReasonCode
from slurm_hetero.engine.score import POLICIES, ClusterModel, Rule, TypeFacts
from slurm_hetero.slurm.syntax import MAX_HOSTLIST, comment

# The Slurm error a rejection returns, by what was wrong (the furthest check the best type failed for
# a reason code). The hook returns `slurm[NAME]` where the release exports NAME (22.05 exports only a
# few), else the number (slurm/slurm_errno.h, the same in every release since 2.x).
SLURM_ERRNO = {
    "ESLURM_INVALID_PARTITION_NAME": 2000,
    "ESLURM_INVALID_NODE_COUNT": 2006,
    "ESLURM_INVALID_NODE_NAME": 2018,
    "ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE": 2014,
    "ESLURM_INVALID_FEATURE": 2029,
    "ESLURM_INVALID_GRES": 2072,
}
REJECT_CODES = {
    "request": "ESLURM_INVALID_GRES",
    "constraint": "ESLURM_INVALID_FEATURE",
    "partition": "ESLURM_INVALID_PARTITION_NAME",  # slurmctld's own error for such a job
    "node_name": "ESLURM_INVALID_NODE_NAME",  # slurmctld's own error for an -x it cannot read
    ReasonCode.TYPE_EXCLUDED: "ESLURM_INVALID_GRES",
    ReasonCode.MISSING_FEATURE: "ESLURM_INVALID_FEATURE",
    ReasonCode.INSUFFICIENT_MEMORY: "ESLURM_INVALID_GRES",
    ReasonCode.TOO_FEW_DEVICES: "ESLURM_INVALID_GRES",
    ReasonCode.NODE_TOO_SMALL: "ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE",
    ReasonCode.TOO_FEW_NODES: "ESLURM_INVALID_NODE_COUNT",
}
NOTE_PREFIX = "slurm_hetero: "  # of the admin comment and log lines
MAX_EXCLUDED = 4_096  # hosts one -x may name: the hook expands it under slurmctld's job lock
ITEM_FORMS = {  # kind -> form -> the item that replaces the request (22.05 `gres:`, 24.11 `gres/`)
    "gpu": {"22.05": "gres:gpu:%s:%s", "24.11": "gres/gpu:%s:%s", "slash": "gres/gpu:%s=%s"},
    "any": {"22.05": "gres:gpu:%s", "24.11": "gres/gpu:%s", "slash": "gres/gpu=%s"},
    "shard": {"22.05": "gres:shard:%s", "24.11": "gres/shard:%s", "slash": "gres/shard=%s"},
}

FORMAT = 1
TABLE_NAME = "slurm_hetero_tables.lua"
SCRIPT_NAME = "job_submit.lua"
CLI_FILTER_NAME = "cli_filter.lua"
CLI_SRUN_NAME = "slurm_hetero_srun.lua"  # cli_filter.lua's srun half, loaded only when srun needs it
CHAIN_TEMPLATE = "job_submit_chain.lua"  # job_submit.lua that runs a site's hook and ours (--chain)
CHAINED_NAME = "slurm_hetero_job_submit.lua"  # our hook's name beside that job_submit.lua
DECLARATION_END = "]==]"  # closes the long comment of the table's declaration (`render_table`)

# ------------------------------------------------------------------------------ Lua literals


_LUA_ESCAPES = {**{byte: f"\\{byte:03d}" for byte in (*range(32), 127)}, ord("\\"): "\\\\", ord('"'): '\\"'}


def lua_string(text: str) -> str:
    """A double-quoted Lua 5.1 literal: backslash and quote escaped, control bytes as \\ddd."""
    return '"' + text.translate(_LUA_ESCAPES) + '"'


def _key(key: Any) -> str:
    return f"[{key}]" if isinstance(key, int) else f"[{lua_string(str(key))}]"


def lua_value(value: Any, indent: int = 0) -> str:
    """A Lua literal for None/bool/int/float/str, lists (arrays) and dicts (sorted keys)."""
    pad, inner = "  " * indent, "  " * (indent + 1)
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):  # an inventory may give a whole number as 1e3 (cpus: 1000.0)
        if not math.isfinite(value):
            raise ValueError(f"cannot write {value!r} into the Lua table")
        return repr(value)
    if isinstance(value, str):
        return lua_string(value)
    if isinstance(value, (list, tuple)):
        if all(not isinstance(v, (dict, list, tuple)) for v in value):
            return "{ " + ", ".join(lua_value(v) for v in value) + " }" if value else "{}"
        return "{\n" + "".join(f"{inner}{lua_value(v, indent + 1)},\n" for v in value) + pad + "}"
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        keys = sorted(value, key=lambda k: (not isinstance(k, int), str(k) if not isinstance(k, int) else k))
        rows = "".join(f"{inner}{_key(k)} = {lua_value(value[k], indent + 1)},\n" for k in keys)
        return "{\n" + rows + pad + "}"
    raise TypeError(f"cannot write {type(value).__name__} into the Lua table")


def _set(names: Iterable[str]) -> dict[str, bool]:
    return dict.fromkeys(sorted(names), True)


# ------------------------------------------------------------------------------- the table


def _type_entry(facts: TypeFacts, rank: int) -> dict[str, Any]:
    shapes = [
        {
            "count": s.count,
            "nodes": s.nodes,
            "features": _set(s.features),
            "cpus": s.cpus,
            "mem": s.memory_mib,
            "hosts": hostlist.fold(h for record in s.hosts for h in hostlist.expand(record)),
        }
        for s in facts.shapes
    ]
    return {
        "name": facts.name,
        "rank": rank,
        "vendor": facts.vendor,
        "mem": facts.memory_mib,
        "size": facts.size,
        "feature": facts.feature,
        "links": facts.fast_link,
        "shares": facts.shares,
        "shard_mib": facts.shard_mib,
        "shapes": shapes,
    }


def _rule_entry(rule: Rule) -> dict[str, Any]:
    return {
        "policy": rule.policy,
        "mode": rule.mode,
        "allowed": _set(rule.allowed),
        "vendors": _set(rule.vendors),
    }


def table_data(model: ClusterModel, exempt_uids: Iterable[int], fail_policy: str) -> dict[str, Any]:
    """The table's content as plain data (without `id`)."""
    names = sorted(model.types)
    return {
        "format": FORMAT,
        "fail_policy": fail_policy,
        "exempt_uids": dict.fromkeys(sorted(set(exempt_uids)), True),
        "limits": {
            "max_digits": units.MAX_DIGITS,
            "max_mib": units.MAX_MIB,
            "max_count": units.MAX_COUNT,
            "max_excluded": MAX_EXCLUDED,
            "max_hostlist": MAX_HOSTLIST,
            "shown": SHOWN_CHARS,
        },
        "units": dict(units.UNITS),
        "types": {n: _type_entry(model.types[n], i) for i, n in enumerate(names)},
        "type_list": ", ".join(names),
        "partition_list": ", ".join(model.known_partitions()),
        "features": _set(model.features),
        "vendor_features": _set(model.vendor_features),
        "orders": {
            p: {"single": list(model.orders[p][0]), "multi": list(model.orders[p][1])} for p in POLICIES
        },
        "default": _rule_entry(model.default),
        "partitions": {name: _rule_entry(rule) for name, rule in model.partitions.items()},
        "default_partition": model.default_partition,
        "codes": [str(c) for c in CODE_ORDER],
        "labels": {str(c): LABELS[c] for c in CODE_ORDER},
        "messages": dict(MESSAGES),
        "request_messages": dict(units.REQUEST_MESSAGES),
        "item_forms": ITEM_FORMS,
        "note_prefix": NOTE_PREFIX,
        "error_numbers": dict(SLURM_ERRNO),
        "reject_codes": {str(k): v for k, v in REJECT_CODES.items()},
    }


def table_id(data: Mapping[str, Any]) -> str:
    """A digest of the table content: the rendered script and its table must carry the same."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def render_table(
    model: ClusterModel,
    exempt_uids: Iterable[int],
    fail_policy: str,
    source: str,
    declaration: Sequence[str],
) -> tuple[str, str]:
    """(Lua text, id) of `slurm_hetero_tables.lua`; `declaration`: its gres.conf lines (not in the id)."""
    data = table_data(model, exempt_uids, fail_policy)
    ident = table_id(data)
    header = (
        f"-- {TABLE_NAME}: generated by slurm-hetero {__version__} `job-submit render` from "
        f"{comment(source)}.\n-- Do not edit: change the inventory or config and render again. "
        f"Read once by {SCRIPT_NAME} when slurmctld loads it;\n-- format {FORMAT}, keys "
        "documented in slurm_hetero/submit/tables.py.\n"
    )
    return header + _declaration_comment(declaration) + "return " + lua_value(
        {**data, "id": ident}
    ) + "\n", ident


def _declaration_comment(lines: Sequence[str]) -> str:
    """A Lua long comment of gres.conf lines (their values never hold `]==]`, which would end it)."""
    if any(DECLARATION_END in line or "\n" in line for line in lines):
        raise ValueError(f"a declaration line holds {DECLARATION_END!r} or a line break: {lines}")
    intro = (
        "The hosts and device files this table was compiled from, in gres.conf's syntax: the next\n"
        "`job-submit render` refuses to drop any of them unless --allow-removal.\n"
    )
    return f"--[==[ {intro}" + "".join(f"{line}\n" for line in lines) + DECLARATION_END + "\n"
