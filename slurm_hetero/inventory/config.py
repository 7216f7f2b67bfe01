"""Site settings: layered YAML files -> one frozen `Settings`. The layers and every key with its
default: docs/admin-guide.md ("Settings come in layers")."""

from __future__ import annotations

import copy
import logging
import os
import pwd
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_hetero.core.errors import ConfigError, RequestError
from slurm_hetero.core.model import SlurmNode
from slurm_hetero.core.readfile import MAX_CONFIG_BYTES, read_text
from slurm_hetero.core.units import parse_size
from slurm_hetero.engine.score import (
    DEFAULT_PARTITION,
    DTYPES,
    MODES,
    POLICIES,
    PartitionOptions,
    ScoringOptions,
)
from slurm_hetero.inventory.document import config_yaml
from slurm_hetero.inventory.nodes import check_shares
from slurm_hetero.slurm.syntax import host_name

logger = logging.getLogger(__name__)

ETC_DIR = Path("/etc/slurm-hetero")
FAIL_POLICIES = ("open", "closed")
DEFAULTS: dict[str, Any] = {
    "scoring": {"policy": "best-fit", "dtype": "bf16", "allow_types": [], "deny_types": []},
    "partitions": {},
    "job_submit": {
        "mode": "exact",
        "fail_policy": "open",
        "exempt_users": ["root"],
        "default_vendors": ["nvidia"],
        "default_partition": DEFAULT_PARTITION,
    },
    "sharing": {"shard_size": {}},
}


@dataclass(frozen=True)
class Settings:
    """Resolved settings; the engine receives `scoring`, never raw mappings."""

    scoring: ScoringOptions = field(default_factory=ScoringOptions)
    fail_policy: str = "open"
    exempt_users: tuple[str | int, ...] = ("root",)
    sources: tuple[str, ...] = ()  # files read, in order


Check = Callable[[Any, str, str], None]  # (value, file, key path): ConfigError when it is wrong


def _choice(choices: Sequence[str]) -> Check:
    def check(value: Any, path: str, key: str) -> None:
        if value not in choices:
            raise ConfigError(f"{value!r} is not one of: {', '.join(choices)}", path, key)

    return check


def _names(value: Any, path: str, key: str) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError("expected a list of names", path, key)


def _partition_name(value: Any, path: str, key: str) -> None:
    """A Slurm partition name has a host name's syntax."""
    if not isinstance(value, str):
        raise ConfigError(f"expected a partition name (text), got {value!r}", path, key)
    try:
        host_name(value)
    except ValueError as e:
        raise ConfigError(f"expected a partition name: {e}", path, key) from e


def _vendors(value: Any, path: str, key: str) -> None:
    from slurm_hetero.vendors import vendor_traits  # the registry loads every vendor module

    if value == "all":
        return
    known = sorted(vendor_traits())
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"expected a list of vendor names or 'all'; vendors: {', '.join(known)}", path, key)
    for name in value:
        if name == "all":
            raise ConfigError("'all' is not a vendor: write `default_vendors: all`, not in a list", path, key)
        if name not in known:
            raise ConfigError(f"unknown vendor {name!r}; vendors: {', '.join(known)}, or 'all'", path, key)


def _scope(value: Any) -> tuple[str, ...]:
    """The engine's vendor scope: () for all."""
    return () if value == "all" else tuple(value)


MAX_UID = 4_294_967_294  # uid_t, less (uid_t)-1 (Slurm's and POSIX's "no uid")
_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?\Z")  # useradd's NAME_REGEX, 32 at most


def _users(value: Any, path: str, key: str) -> None:
    if not isinstance(value, list):
        raise ConfigError("expected a list of user names or uids", path, key)
    for i, user in enumerate(value):
        uid = isinstance(user, int) and not isinstance(user, bool) and 0 <= user <= MAX_UID
        if not uid and not (isinstance(user, str) and _USER_NAME.match(user)):
            raise ConfigError(f"{user!r} is not a user name or a uid (0 to {MAX_UID:,})", path, f"{key}[{i}]")


def _shard_sizes(value: Any, path: str, key: str) -> None:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigError("expected a mapping of gres type to the memory of one shard", path, key)
    for gres_type, size in value.items():
        if isinstance(size, bool) or not isinstance(size, (int, str)):
            raise ConfigError(f"{size!r} is not a size (4G, or MiB)", path, f"{key}.{gres_type}")
        try:
            parse_size(str(size), str(size))
        except RequestError as e:
            raise ConfigError(str(e), path, f"{key}.{gres_type}") from e


_PARTITION: dict[str, Check] = {
    "policy": _choice(POLICIES),
    "mode": _choice(MODES),
    "allow_types": _names,
    "deny_types": _names,
    "default_vendors": _vendors,
}
SCHEMA: dict[str, Any] = {
    "scoring": {
        "policy": _choice(POLICIES),
        "dtype": _choice(tuple(DTYPES)),
        "allow_types": _names,
        "deny_types": _names,
    },
    "partitions": (_partition_name, _PARTITION),  # any partition name, each with these keys
    "job_submit": {
        "mode": _choice(MODES),
        "fail_policy": _choice(FAIL_POLICIES),
        "exempt_users": _users,
        "default_vendors": _vendors,
        "default_partition": _partition_name,
    },
    "sharing": {"shard_size": _shard_sizes},
}


def _validate(data: Any, schema: Any, path: str, key: str = "") -> None:
    """ConfigError naming the key path where one layer breaks `SCHEMA`."""
    if callable(schema):
        schema(data, path, key or "<top>")
        return
    if not isinstance(data, Mapping):
        raise ConfigError("expected a mapping", path, key or None)
    if isinstance(schema, tuple):  # (check of each key, schema of each value)
        for name, value in data.items():
            schema[0](name, path, f"{key}.{name}")
            _validate(value, schema[1], path, f"{key}.{name}")
        return
    for name, value in data.items():
        if name not in schema:
            raise ConfigError(
                f"unknown key {name!r}; valid keys: {', '.join(schema)}",
                path,
                f"{key}.{name}" if key else str(name),
            )
        _validate(value, schema[name], path, f"{key}.{name}" if key else name)


def config_paths(
    environ: Mapping[str, str] | None = None, etc_dir: Path = ETC_DIR, user_layers: bool = True
) -> list[tuple[Path, bool]]:
    """(path, required) of every layer file, lowest first; without `user_layers` only /etc's (for
    the TaskProlog, which runs in a job's environment)."""
    if not user_layers:
        return _system_paths(etc_dir)
    env = os.environ if environ is None else environ
    if env.get("SLURM_HETERO_CONFIG"):
        return [(Path(env["SLURM_HETERO_CONFIG"]), True)]
    xdg = Path(env.get("XDG_CONFIG_HOME") or Path(env.get("HOME", "~")).expanduser() / ".config")
    return [*_system_paths(etc_dir), (xdg / "slurm-hetero" / "config.yaml", False)]


def _system_paths(etc_dir: Path) -> list[tuple[Path, bool]]:
    drop_ins = sorted((etc_dir / "config.d").glob("*.yaml")) if (etc_dir / "config.d").is_dir() else []
    return [(etc_dir / "config.yaml", False), *((p, True) for p in drop_ins)]


def _read(path: Path, required: bool) -> dict[str, Any] | None:
    if not path.exists():
        if required:
            raise ConfigError("config file not found", str(path))
        return None
    text = read_text(path, MAX_CONFIG_BYTES, "config file", ConfigError)
    data = config_yaml(text, str(path), "config file")
    data = {} if data is None else data
    _validate(data, SCHEMA, str(path))
    return data


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`: mappings merge recursively, other values are replaced."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        nested = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = merge(out[key], value) if nested else copy.deepcopy(value)
    return out


def settings_from_dict(data: Mapping[str, Any], sources: Sequence[str] = ()) -> Settings:
    rules, hook, sharing = data["scoring"], data["job_submit"], data["sharing"]
    partitions = {
        name: PartitionOptions(
            p.get("policy"),
            p.get("mode"),
            tuple(p.get("allow_types", ())),
            tuple(p.get("deny_types", ())),
            _scope(p["default_vendors"]) if "default_vendors" in p else None,
        )
        for name, p in data["partitions"].items()
    }
    scoring = ScoringOptions(
        rules["policy"],
        hook["mode"],
        rules["dtype"],
        tuple(rules["allow_types"]),
        tuple(rules["deny_types"]),
        partitions,
        {gres_type: parse_size(str(size)) for gres_type, size in sharing["shard_size"].items()},
        _scope(hook["default_vendors"]),
        hook["default_partition"],
    )
    return Settings(scoring, hook["fail_policy"], tuple(hook["exempt_users"]), tuple(sources))


def check_for_cluster(settings: Settings, nodes: Sequence[SlurmNode], partitions: Iterable[str]) -> None:
    """Settings that name a device type, partition or shard size, against the hook's cluster: a
    name it lacks is a typo that would render a hook refusing every job."""
    types = sorted({d.type for n in nodes for d in n.devices})
    where = ", ".join(settings.sources) or None
    scoring = settings.scoring
    named = [("scoring.allow_types", scoring.allow_types), ("scoring.deny_types", scoring.deny_types)]
    for name, part in sorted(scoring.partitions.items()):
        named += [(f"partitions.{name}.allow_types", part.allow_types)]
        named += [(f"partitions.{name}.deny_types", part.deny_types)]
    for key, listed in named:
        for gres_type in listed:
            if gres_type not in types:
                raise ConfigError(
                    f"no device type {gres_type!r} in this cluster; types: {', '.join(types)}", where, key
                )
    known = sorted({*partitions, DEFAULT_PARTITION})
    if scoring.default_partition not in known:
        raise ConfigError(
            f"{scoring.default_partition!r} is not a partition the hook knows ({', '.join(known)}); name "
            "one, or add it under partitions: (even as {})",
            where,
            "job_submit.default_partition",
        )
    check_shares(scoring.shares, nodes)


def load_settings(
    extra: Path | None = None,
    environ: Mapping[str, str] | None = None,
    etc_dir: Path = ETC_DIR,
    user_layers: bool = True,
) -> Settings:
    """Defaults, then every layer file that exists, then `extra` (the `--config` flag)."""
    data, sources = DEFAULTS, []
    layers = config_paths(environ, etc_dir, user_layers) + ([(extra, True)] if extra else [])
    for path, required in layers:
        if (layer := _read(path, required)) is not None:
            data = merge(data, layer)
            sources.append(str(path))
    logger.debug("settings from %s", ", ".join(sources) or "built-in defaults")
    return settings_from_dict(data, sources)


def exempt_uids(users: Sequence[str | int], lookup: Callable[[str], int] | None = None) -> tuple[int, ...]:
    """Sorted uids (the hook sees only uids); unknown names are skipped."""
    find = lookup or (lambda name: pwd.getpwnam(name).pw_uid)
    uids = set()
    for user in users:
        if isinstance(user, int) or (user.isascii() and user.isdigit()):
            uids.add(int(user))
            continue
        try:
            uids.add(find(user))
        except KeyError:
            if user == "root":
                uids.add(0)
            else:
                logger.warning("exempt user %r has no passwd entry here; skipped", user)
    return tuple(sorted(uids))
