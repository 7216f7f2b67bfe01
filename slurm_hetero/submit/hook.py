"""job_submit.lua run from Python, through lupa, as slurmctld runs it: the one request decision.

Every Python caller of the decision hands the job_desc to the very hook slurmctld loads, through
`SHIM`, a small stand-in for Slurm's Lua API: the `slurm` table with its loggers and the release's
`ESLURM_*` names, and a job_desc that behaves as slurmctld's (an unset field reads nil, "" unsets
a string field, nil is refused, the node counts take numbers). A `Hook` is one Lua state, as
slurmctld keeps one: its memo and het bookkeeping live in it.
"""

from __future__ import annotations

import functools
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from slurm_hetero.core.errors import ConfigError, HeteroError, RequestError
from slurm_hetero.core.readfile import read_bytes
from slurm_hetero.data import bundled
from slurm_hetero.engine.score import ClusterModel
from slurm_hetero.submit import Job
from slurm_hetero.submit.tables import (
    SCRIPT_NAME,
    SLURM_ERRNO,
    TABLE_NAME,
    lua_value,
    render_table,
)

WRITTEN = (
    "tres_per_node",
    "tres_per_job",
    "tres_per_task",
    "tres_per_socket",
    "features",
    "admin_comment",
    "min_nodes",
    "max_nodes",
)
EDIT_WRITTEN = WRITTEN[:6]  # an edit never pins the node count
# not in slurm_job_modify's job_rec (slurm_lua.c, 22.05 and 24.11)
RECORD_HIDDEN = ("num_tasks", "ntasks_per_node", "req_nodes", "exc_nodes", "cpus_per_task")
# the ESLURM_* names job_submit/lua exports (22.05: slurm_lua.c's short list; 24.11: every one)
EXPORTED_22_05 = {"ESLURM_ACCESS_DENIED": 2002, "ESLURM_INVALID_NODE_COUNT": 2006}
_CODE_NAMES = {number: name for name, number in SLURM_ERRNO.items()}

SHIM = r"""
LOG = {}
READ = {}   -- every job_desc field the hook read
READS = {}  -- how many times it read each
local function logger(kind)
  return function(fmt, ...) LOG[#LOG + 1] = { kind, string.format(fmt, ...) } end
end
slurm = { SUCCESS = 0, ERROR = -1,
          log_info = logger("info"), log_user = logger("user"), log_error = logger("error"),
          log_debug = logger("debug"), log_verbose = logger("verbose"), error = logger("error") }

local NUMBER_FIELDS = { min_nodes = true, max_nodes = true }
function make_job(fields)
  local store = {}
  for k, v in pairs(fields) do store[k] = v end
  local job = setmetatable({}, {
    __index = function(_, key) READ[key] = true; READS[key] = (READS[key] or 0) + 1; return store[key] end,
    __newindex = function(_, key, value)
      if NUMBER_FIELDS[key] then
        if type(value) ~= "number" then error("bad argument #3 to '__newindex' (number expected)") end
        store[key] = value
        return
      end
      if type(value) ~= "string" then
        error("bad argument #3 to '__newindex' (string expected, got " .. type(value) .. ")")
      end
      if value == "" then value = nil end
      store[key] = value
    end,
  })
  return job, store
end

function submit(fields, uid)
  LOG = {}
  local job, store = make_job(fields)
  local rc = slurm_job_submit(job, {}, uid)
  return rc, store, LOG
end

-- gather's reading of a job's TRES fields: true and the request, or false and "ITEM: REASON".
function request(fields)
  local ok, req = pcall(slurm_hetero_hook.gather, fields)
  if ok then return true, req end
  if type(req) == "table" and req.reject then return false, req.reject end
  error(req, 0)
end

function item_names(text)
  local names = {}
  for i, item in ipairs(slurm_hetero_hook.items_of(text)) do names[i] = item.name end
  return names
end

function modify(fields, record, uid)
  LOG = {}
  local job, store = make_job(fields)
  local rec = make_job(record)
  local rc = slurm_job_modify(job, rec, {}, uid)
  return rc, store, LOG
end
"""


def script_template(name: str = SCRIPT_NAME) -> str:
    """A hand-written script of job_submit/ (packaged as slurm_hetero/data/NAME)."""
    try:
        return bundled(name, f"job_submit/{name}")
    except OSError as e:
        raise ConfigError(f"cannot read the hook template: {e.strerror}", f"job_submit/{name}") from e


_RENDER_LINE = re.compile(r"^local (\w+) = .*?(\s+-- @render (\w+))$", re.MULTILINE)


def render_script(name: str, template: str | None = None, **values: Any) -> str:
    """The script NAME (from `template`, default NAME) with each `-- @render KEY` line set to values[KEY]."""
    found: list[str] = []

    def bake(m: re.Match[str]) -> str:
        found.append(m.group(3))
        return f"local {m.group(1)} = {lua_value(values[m.group(3)])}{m.group(2)}"

    text = _RENDER_LINE.sub(bake, script_template(template or name))
    if sorted(found) != sorted(values):
        raise ValueError(
            f"{name} template: expected one '@render' line each for {sorted(values)}, found {found}"
        )
    return text


@dataclass(frozen=True)
class Request:
    """The device request the hook reads from a job's TRES fields (its `gather`)."""

    text: str  # our items as written, for messages (`gpu:2,gpumem:20G`)
    gpu_field: str | None  # the field of the gpu item (its scope), None: no gpu item
    gpu_type: str | None
    count: int  # devices (1 without a gpu item)
    gpumem_mib: int | None
    gpucore: int | None
    form: str  # how the hook writes back: "22.05" (gres:), "24.11" (gres/ with :), "slash" (=)

    @property
    def asks(self) -> bool:
        """Whether it names gpumem or gpucore (the hook's to decide)."""
        return self.gpumem_mib is not None or self.gpucore is not None

    @property
    def gpu_count(self) -> int | None:
        return self.count if self.gpu_field is not None else None


@dataclass(frozen=True)
class Outcome:
    """What the hook did with one job (component) or edit; `job`: the job as Slurm then holds it."""

    ok: bool
    action: str  # untouched | rewrite | reject
    message: str
    job: Job
    code: str | None = None  # a rejection's Slurm error name (ESLURM_...), None: slurm.ERROR
    rc: int = 0
    log: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        # a rejected job is not written: no new field values to show
        written = {name: getattr(self.job, name) if self.ok else None for name in WRITTEN}
        return {"ok": self.ok, "action": self.action, "message": self.message, "code": self.code, **written}


def _lua_runtime(**options: Any) -> Any:
    """A fresh Lua 5.1 state (what Debian's slurmctld links), or ConfigError without lupa."""
    try:
        import lupa.lua51 as lua51
    except ImportError as e:  # pragma: no cover - a runtime dependency
        raise ConfigError(f"the job_submit hook needs lupa (pip install lupa): {e}") from e
    return lua51.LuaRuntime(**options)


def lua_compile_error(script: Path) -> str | None:
    """Lua 5.1's message when `script` does not compile, as slurmctld's loadfile says it; else None."""
    lua = _lua_runtime(encoding=None)  # bytes: the message may quote the file's own bytes
    loaded = lua.globals().loadfile(bytes(script))
    if not isinstance(loaded, tuple) or loaded[0] is not None:
        return None
    return "".join(c if c.isprintable() else "?" for c in bytes(loaded[1]).decode(errors="replace"))


@functools.lru_cache(maxsize=1)
def _hostfile_reader() -> Any:
    """job_submit.lua's host-file reader, in a Lua state of its own that passes bytes both ways."""
    lua = _lua_runtime(encoding=None, unpack_returned_tuples=True)
    lua.execute(SHIM.encode())
    lua.execute(script_template().encode())
    return lua.globals().slurm_hetero_hook[b"hostfile_hosts"]


def hostfile_hosts(data: bytes, path: str) -> str:
    """A -w/-x host file's hosts as sbatch sends them, by the hook's own reader; else sbatch's words."""
    hosts, said = _hostfile_reader()(data, path.encode())  # the hosts, or nil and sbatch's words
    if hosts is None:
        raise HeteroError(bytes(said).decode("utf-8", "replace"))
    return bytes(hosts).decode("utf-8", "replace")


MAX_HOSTFILE_BYTES = 1 << 20  # Slurm reads any size; the hook reads far fewer host names


def read_hosts(option: str, value: str | None) -> str | None:
    """`value` of -w/-x (`option`): a value with a "/" names a host file, read as sbatch, salloc and
    srun read it (proc_args.c `verify_node_list`)."""
    if value is None or "/" not in value:
        return value
    try:
        return hostfile_hosts(read_bytes(value, MAX_HOSTFILE_BYTES, "host file"), value)
    except HeteroError as e:
        raise HeteroError(f"{option}: {e} (sbatch, salloc and srun read the file and end there)") from None


class Hook:
    """job_submit.lua with the shim in a fresh Lua 5.1 state (`runtime`: a lupa LuaRuntime of another)."""

    def __init__(self, script: Path, release: str = "24.11", runtime: Any = None) -> None:
        if release not in ("22.05", "24.11"):
            raise ValueError(f"release {release!r}: one of 22.05, 24.11")
        self.release = release
        self.lua = _lua_runtime(unpack_returned_tuples=True) if runtime is None else runtime
        self.lua.execute(SHIM)
        exported = EXPORTED_22_05 if release == "22.05" else {**EXPORTED_22_05, **SLURM_ERRNO}
        slurm = self.lua.globals().slurm
        for name, number in exported.items():
            slurm[name] = number
        self.lua.globals().dofile(str(script))

    def _table(self, job: Job, drop: Iterable[str] = (), **extra: Any) -> Any:
        values = {f.name: getattr(job, f.name) for f in fields(Job) if f.name not in ("submit_uid", *drop)}
        values.update(extra)
        return self.lua.table_from({k: v for k, v in values.items() if v is not None})

    def submit(self, job: Job, offset: int | None = None) -> Outcome:
        """slurm_job_submit on `job` by `job.submit_uid`; `offset`: its het_job_offset (components
        in order: the hook keeps what earlier ones take until the next offset 0)."""
        rc, store, log = self.lua.globals().submit(self._table(job, het_job_offset=offset), job.submit_uid)
        return _outcome(rc, log, replace(job, **{name: store[name] for name in WRITTEN}))

    def modify(self, edit: Job, record: Job) -> Outcome:
        """slurm_job_modify on an edit of `record`; its job: the record with the written fields over it."""
        rc, store, log = self.lua.globals().modify(
            self._table(edit), self._table(record, RECORD_HIDDEN), edit.submit_uid
        )
        stored = {n: store[n] if store[n] is not None else getattr(record, n) for n in EDIT_WRITTEN}
        return _outcome(rc, log, replace(record, **stored), edit=True)

    def request(self, fields: Iterable[tuple[str, str | None]]) -> Request:
        """The hook's reading of TRES fields (several texts for one field joined), or its RequestError."""
        joined: dict[str, str] = {}
        for name, text in fields:
            if text:
                joined[name] = f"{joined[name]},{text}" if name in joined else text
        ok, req = self.lua.globals().request(self.lua.table_from(joined))
        if not ok:
            text, _, reason = str(req).partition(": ")
            raise RequestError(text, reason)
        return Request(
            ",".join(req.shown.values()),
            req.gpu_field,
            req.gpu_type,
            int(req.count),
            None if req.gpumem is None else int(req.gpumem),
            None if req.gpucore is None else int(req.gpucore),
            str(req.form),
        )

    def asks_us(self, text: str | None) -> bool:
        """Whether a TRES text names gpumem or gpucore (as an item, however malformed)."""
        names = self.lua.globals().item_names(text or "")
        return any(name in ("gpumem", "gpucore") for name in names.values())


def _outcome(rc: Any, log: Any, job: Job, edit: bool = False) -> Outcome:
    lines = tuple((str(entry[1]), str(entry[2])) for entry in log.values())
    message = "\n".join(text for kind, text in lines if kind == "user")
    if rc != 0:
        return Outcome(False, "reject", message, job, _CODE_NAMES.get(int(rc)), int(rc), lines)
    # a successful edit is told to slurmctld's log only (24.11's scontrol prints log_user as "error:")
    rewritten = any(" edit of job " in t for _, t in lines) if edit else bool(message)
    return Outcome(True, "rewrite" if rewritten else "untouched", message, job, None, 0, lines)


def render_hook(
    directory: Path,
    model: ClusterModel,
    exempt_uids: Iterable[int],
    fail_policy: str,
    source: str = "slurm-hetero",
    declared: Iterable[str] = (),
) -> Path:
    """Write the table and job_submit.lua for `model` into `directory`; the script's path."""
    table, ident = render_table(model, exempt_uids, fail_policy, source, list(declared))
    (directory / TABLE_NAME).write_text(table, encoding="utf-8")
    script = directory / SCRIPT_NAME
    baked = render_script(SCRIPT_NAME, table_id=ident, fail_policy=fail_policy, table_path=None)
    script.write_text(baked, encoding="utf-8")
    return script


def cluster_hook(
    model: ClusterModel, exempt_uids: Iterable[int], fail_policy: str, release: str = "24.11"
) -> Hook:
    """The hook slurmctld would run for this cluster and settings (the table is read once, at load)."""
    with tempfile.TemporaryDirectory(prefix="slurm-hetero-hook-") as scratch:
        return Hook(render_hook(Path(scratch), model, exempt_uids, fail_policy), release)
