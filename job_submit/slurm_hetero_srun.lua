--[[
slurm_hetero_srun.lua: the srun half of slurm-hetero's client filter (cli_filter.lua, Lua 5.1), run
with `dofile` only in srun when a device option names something or -w names hosts; it returns the
function cli_filter.lua calls per het component.

For a new job it makes the job_submit hook's decision in the client, so that the step gets the device
too (the hook alone rewrites only the job). It runs job_submit.lua itself on a job_desc built from
the options as srun builds its own, so the hook stays the authority: what it refuses passes
unchanged, for slurmctld to refuse. Anything unexpected leaves the options alone.
--]]

-- Baked in by `slurm-hetero job-submit render` (the line ending in "@render"; keep it so).
local HOOK_PATH = nil  -- @render hook_path

local real = slurm
local debug_log = real.log_debug or function() end

-- The hook's slurmctld log lines are not for the user; its user message is printed once, here.
local said = {}
local function silent() end
local quiet = setmetatable({ log_info = silent, log_error = silent, log_debug = silent, log_verbose = silent,
  log_user = function(format, ...) said[#said + 1] = string.format(format, ...) end }, { __index = real })

-- The client's name and uid, from /proc/self/status (read once per command).
local function client()
  local file = io.open("/proc/self/status", "r")
  if not file then return nil, nil end
  local text = file:read("*a") or ""
  file:close()
  return string.match(text, "^Name:%s*(%S+)"), tonumber(string.match(text, "\nUid:%s*(%d+)"))
end

-- The client's command line (/proc/self/cmdline, read once per command), argv[0] first, or nil.
local argv = nil
local function arguments()
  if argv == nil then
    local file = io.open("/proc/self/cmdline", "r")
    if not file then return nil end
    local line = file:read("*a") or ""
    file:close()
    argv = {}
    local start = 1  -- NUL-separated; a plain find (Lua 5.1 patterns cannot hold "\0")
    while start <= #line do
      local stop = string.find(line, "\0", start, true) or (#line + 1)
      argv[#argv + 1] = string.sub(line, start, stop - 1)
      start = stop + 1
    end
  end
  return argv
end

-- Short options of Slurm's clients that take a value (slurm_opt.c, 22.05 and 24.11: required_argument).
local SHORT_VALUED = "ABCDFGJLMNSTWabcdeimnopqrtwx"

-- job_submit.lua's module (slurm_hetero_hook), loaded with the quiet slurm table once per command.
local hook = nil
local function load_hook()
  if hook then return hook, nil end
  slurm = quiet
  local beside = string.match(debug.getinfo(1, "S").source, "^@(.*/)") or "./"  -- this file's directory
  local ok, err = pcall(dofile, HOOK_PATH or (beside .. "job_submit.lua"))
  slurm = real
  if not ok then return nil, tostring(err) end
  if type(slurm_hetero_hook) ~= "table" then return nil, "job_submit.lua defines no slurm_hetero_hook" end
  hook = slurm_hetero_hook
  return hook, nil
end

-- A -w/-x host file, which srun reads and sends as hosts: read by the hook's own reader, at most
-- MAX_HOSTFILE bytes; nil where srun refuses the file itself.
local MAX_HOSTFILE = 1048576
local function read_hostfile(path)
  local file = io.open(path, "rb")
  if not file then return nil end
  local data = file:read(MAX_HOSTFILE + 1)
  file:close()
  if type(data) ~= "string" or #data > MAX_HOSTFILE then return nil end
  local module = load_hook()
  return module and (module.hostfile_hosts(data, path)) or nil
end

local function hostfile(value)
  if value == nil or not string.find(value, "/", 1, true) then return value end
  local ok, hosts = pcall(read_hostfile, value)
  return ok and hosts or nil
end

-- The hosts the het components after `offset` name with -w, from the command line (srun calls this
-- filter per component in order, and slurmctld keeps A off B's -w hosts in `srun A : B`). Options are
-- read up to the command; a long option without "=" before a word ends the reading (the word may be
-- its value or the command), so a -w after it is missed rather than read from the command's arguments.
local function later_hosts(offset)
  local args = arguments()
  if args == nil or offset == nil then return nil end
  local named, component, reading, i = {}, 0, true, 2
  local function add(value)  -- the last -w of a component counts; "/": a host file, its hosts (or none)
    if component > offset and value then named[component] = hostfile(value) or false end
  end
  while i <= #args do
    local arg, after = args[i], args[i + 1]
    if arg == ":" then
      component, reading = component + 1, true
    elseif reading and arg == "--" then
      reading = false
    elseif reading and string.sub(arg, 1, 2) == "--" then
      local name, value = string.match(arg, "^%-%-([%w-]+)=(.*)$")
      name = name or string.sub(arg, 3)
      if #name >= 5 and string.sub("nodelist", 1, #name) == name then  -- getopt takes a unique prefix
        if value == nil then value, i = after, i + 1 end
        add(value)
      elseif value == nil and after and after ~= ":" and string.sub(after, 1, 1) ~= "-" then
        reading = false  -- a flag before the command, or an option with its value: unknown here
      end
    elseif reading and string.sub(arg, 1, 1) == "-" and #arg > 1 then
      for at = 2, #arg do
        local letter = string.sub(arg, at, at)
        if string.find(SHORT_VALUED, letter, 1, true) then
          local value = string.sub(arg, at + 1)
          if value == "" then value, i = after, i + 1 end
          if letter == "w" then add(value) end
          break
        end
      end
    elseif reading then
      reading = false  -- the component's command
    end
    i = i + 1
  end
  local hosts = {}
  for later = offset + 1, component do
    if named[later] then hosts[#hosts + 1] = named[later] end
  end
  return #hosts > 0 and table.concat(hosts, ",") or nil
end

-- An option's value, nil where unset (srun reads some unset options "", a release "(null)").
local function text(options, name)
  local value = options[name] ~= nil and tostring(options[name]) or nil
  if value == "" or value == "(null)" then return nil end
  return value
end

-- A count option ("2", "2-4" for nodes): its first number, or nil.
local function number(options, name)
  local value = text(options, name)
  return value and tonumber(string.match(value, "^(%d+)")) or nil
end

-- A positive count option (srun reports unset -c, --cpus-per-gpu as "0"), or nil.
local function positive(options, name)
  local value = number(options, name)
  return (value and value > 0) and value or nil
end

-- A memory option as srun reports it (mbytes_to_str: "20G", "1000", "3T"): MiB, or nil when unset.
local UNITS = { [""] = 1, M = 1, G = 1024, T = 1024 * 1024, P = 1024 * 1024 * 1024 }
local function mebibytes(options, name)
  local digits, unit = string.match(text(options, name) or "", "^(%d+)([MGTP]?)$")
  local mib = digits and tonumber(digits) * UNITS[unit]
  return (mib and mib > 0) and mib or nil
end

-- Whether the user set an option, from slurm.json_cli_options (nil where missing): srun reports an
-- unset -n as "1" and -N as "1-0", so only this tells `-N2` from `-N2 -n1`.
local function set_in(json)
  if type(json) ~= "string" then return nil end
  return function(name) return string.find(json, '"' .. name .. '":', 1, true) ~= nil end
end

local function set_options(options)
  if type(real.json_cli_options) ~= "function" then return nil end
  local ok, json = pcall(real.json_cli_options, options)
  return ok and set_in(json) or nil
end

-- A --gpus* value ("2", "a100:2", or already "gres:gpu:2") as a TRES item.
local function gpu_item(value)
  if value == nil or string.find(value, "^gres[:/]") then return value end
  return "gpu:" .. value
end

local function joined(a, b)
  return (a and b) and (a .. "," .. b) or a or b
end

-- min_nodes, max_nodes, num_tasks, ntasks_per_node of the job srun will send, as its _opt_verify
-- settles them (-n below -N lowers the node count; an --ntasks-per-node not dividing -n is dropped).
-- Without `isset`, the options as they read.
local function counts(options, isset)
  local low, high = string.match(text(options, "nodes") or "", "^(%d+)%-?(%d*)$")
  low, high = tonumber(low), tonumber(high) or tonumber(low)
  if high == 0 then high = nil end
  local tasks, per_node = number(options, "ntasks"), number(options, "ntasks-per-node")
  if isset == nil then return low, high, tasks, per_node end
  if not isset("nodes") then low, high = nil, nil end
  if not isset("ntasks") then tasks = nil end
  if not isset("ntasks-per-node") then per_node = nil end
  if low and tasks then
    if high and tasks < high then high = tasks end
    if tasks < low then low = tasks end
    if per_node and per_node ~= math.floor(tasks / low) then per_node = nil end
  end
  if per_node and not tasks then tasks = (low or 1) * per_node end
  return low, high, tasks, per_node
end

-- The gpu item of srun 24.11's --tres-per-task ("cpu=2,gres/gpu=1" -> "gres/gpu=1"), or nil.
local function per_task_gpu(options)
  for _, item in ipairs(hook.items_of(text(options, "tres-per-task"))) do
    if item.prefix ~= "" and item.name == "gpu" then return item.text end
  end
  return nil
end

-- The job_desc the hook would see from these options.
local function job_of(options, isset)
  local low, high, tasks, per_node = counts(options, isset)
  local mem_per_gpu, cpus_per_gpu = mebibytes(options, "mem-per-gpu"), positive(options, "cpus-per-gpu")
  return {
    -- as srun's slurm_opt_create_job_desc: the --gpus-per-node item first, then --gres
    tres_per_node = joined(gpu_item(text(options, "gpus-per-node")), text(options, "gres")),
    tres_per_job = gpu_item(text(options, "gpus")),
    tres_per_task = gpu_item(text(options, "gpus-per-task")) or per_task_gpu(options),
    tres_per_socket = gpu_item(text(options, "gpus-per-socket")),
    features = text(options, "constraint"),
    partition = text(options, "partition"),
    min_nodes = low,
    max_nodes = high,
    num_tasks = tasks,
    ntasks_per_node = per_node,
    cpus_per_task = positive(options, "cpus-per-task"),
    pn_min_cpus = positive(options, "mincpus"),
    min_cpus = text(options, "overcommit") == "set" and math.max(low or 1, 1) or nil,  -- -O: the nodes
    cpus_per_tres = cpus_per_gpu and ("gres:gpu:" .. cpus_per_gpu) or nil,
    mem_per_tres = mem_per_gpu and ("gres:gpu:" .. mem_per_gpu) or nil,
    min_mem_per_node = mebibytes(options, "mem"),
    min_mem_per_cpu = mebibytes(options, "mem-per-cpu"),
    -- a host file: its hosts, as srun sends them; one it cannot read is left as given (srun refuses it)
    req_nodes = hostfile(text(options, "nodelist")) or text(options, "nodelist"),
    exc_nodes = hostfile(text(options, "exclude")) or text(options, "exclude"),
  }
end

-- "gres:gpu:l40s:1,gres/shard:5" -> "gpu:l40s:1,shard:5" (the client adds its own prefix).
local function gres_option(value)
  local out = {}
  for _, item in ipairs(hook.items_of(value)) do out[#out + 1] = item.body end
  return table.concat(out, ",")
end

-- "gres:gpu:a100:2" -> "a100:2" (each gpu item)
local function gpus_option(value)
  local out = {}
  for _, item in ipairs(hook.items_of(value)) do
    out[#out + 1] = item.name == "gpu" and string.gsub(item.body, "^gpu[:=]?", "") or item.text
  end
  return table.concat(out, ",")
end

local OPTIONS = {  -- field -> option, how its value is written
  { "tres_per_node", "gres", gres_option },
  { "tres_per_job", "gpus", gpus_option },
  { "tres_per_task", "gpus-per-task", gpus_option },
  { "tres_per_socket", "gpus-per-socket", gpus_option },
}

-- --gres "emptied": a gpu item of count 0 (`gpu:a100_80g:0`, `gpu:0` for any-fit), which Slurm's
-- GRES parser skips ("none" lost the step its device, or was refused).
local function cleared(after)
  for _, field in ipairs({ "tres_per_job", "tres_per_task", "tres_per_socket", "tres_per_node" }) do
    local item = hook.items_of(after[field])[1]
    if item and item.prefix ~= "" and string.find(item.body, "^gpu[:=]") then
      local gpu_type = string.match(item.body, "^gpu[:=]([^:=]+)[:=]%d+$")
      return gpu_type and ("gpu:" .. gpu_type .. ":0") or "gpu:0"
    end
  end
  return nil
end

-- tres_per_node as --gpus-per-node (its gpu item) and --gres (the rest, else cleared).
local function per_node(new, after, out)
  local gpu, rest = nil, {}
  for _, item in ipairs(hook.items_of(new)) do
    if item.name == "gpu" then
      if gpu then return false end
      gpu = item.text
    elseif item.text ~= "" then
      rest[#rest + 1] = item.text
    end
  end
  local gres = #rest > 0 and gres_option(table.concat(rest, ",")) or cleared(after)
  if gpu == nil or gres == nil then return false end
  out["gpus-per-node"], out["gres"] = gpus_option(gpu), gres
  return true
end

-- srun 24.11 keeps --gpus-per-task in --tres-per-task too, untyped, and refuses a typed one beside
-- it: its gpu item takes the written value (`a100_80g:1` -> gres/gpu:a100_80g=1). nil: no change.
local function tres_per_task(options, gpus)
  local current = text(options, "tres-per-task")
  if current == nil then return nil end
  local gpu_type, count = string.match(gpus, "^([^:=]+)[:=](%d+)$")
  local item = gpu_type and ("gres/gpu:" .. gpu_type .. "=" .. count) or ("gres/gpu=" .. gpus)
  local out, found = {}, false
  for _, old in ipairs(hook.items_of(current)) do
    found = found or old.name == "gpu"
    out[#out + 1] = old.name == "gpu" and item or old.text
  end
  return found and table.concat(out, ",") or nil
end

-- The option changes for a rewritten job, or nil when these options cannot carry it (the step would
-- keep the gpumem request, and fail).
local function changes(options, before, after)
  local out = {}
  for _, entry in ipairs(OPTIONS) do
    local field, option, write = entry[1], entry[2], entry[3]
    local old, new = before[field] or "", after[field] or ""
    if old ~= new then
      if field == "tres_per_node" and text(options, "gpus-per-node") then
        if not per_node(new, after, out) then return nil end
      elseif field == "tres_per_task" and not text(options, "gpus-per-task") then
        -- the count came from --tres-per-task: it goes back there (both would be refused by srun)
        local one = new ~= "" and not string.find(new, ",", 1, true)
        out["tres-per-task"] = one and tres_per_task(options, write(new)) or nil
        if out["tres-per-task"] == nil then return nil end
      elseif new == "" then
        if field ~= "tres_per_node" or cleared(after) == nil then return nil end
        out[option] = cleared(after)
      elseif field ~= "tres_per_node" and string.find(new, ",", 1, true) then
        return nil
      else
        out[option] = write(new)
      end
    end
  end
  local features = after.features or ""
  if features ~= (before.features or "") then
    if features == "" then return nil end
    out["constraint"] = features
  end
  -- the node count the hook pinned where the job left it open (-N unset): srun then sets it too
  if after.max_nodes ~= before.max_nodes then
    local low, high = after.min_nodes or 1, after.max_nodes or after.min_nodes or 1
    out["nodes"] = (low == high) and tostring(low) or (low .. "-" .. high)
  end
  if out["gpus-per-task"] then out["tres-per-task"] = tres_per_task(options, out["gpus-per-task"]) end
  return out
end

-- What to ask instead, when the options cannot carry the decision: the rewritten fields as options.
local function instead(before, after)
  local out = {}
  for _, entry in ipairs(OPTIONS) do
    local field, option, write = entry[1], entry[2], entry[3]
    local new = after[field] or ""
    if new ~= "" and new ~= (before[field] or "") then out[#out + 1] = "--" .. option .. "=" .. write(new) end
  end
  if after.features and after.features ~= before.features then out[#out + 1] = "-C " .. after.features end
  return table.concat(out, " ")
end

-- Whether the options show the job_desc's counts: without `set_in`, a -n below -N (which srun
-- reports as the node count) is left to the hook.
local function counts_known(job, isset)
  return isset ~= nil or not (job.min_nodes and job.num_tasks and job.num_tasks < job.min_nodes)
end

-- The job this srun makes a step of (--jobid, or SLURM_JOB_ID), its digits only; nil for a new job.
local function allocation(options)
  local id = text(options, "jobid") or os.getenv("SLURM_JOB_ID")
  return id and string.match(id, "^(%d+)") or nil
end

-- What the job (of a het allocation: component `offset`) holds, from `scontrol show job -d -o ID`:
-- its gpu items per group of nodes ("gpu:l40s:1 on l40sn1"; {} for none), nil where scontrol cannot
-- say, false for no such job; the job as named to the user (12, or 12+0); the fewest a node holds.
local function holdings(job_id, offset)
  local ok, pipe = pcall(io.popen, "scontrol show job -d -o " .. job_id .. " 2>&1")
  if not ok or not pipe then return nil, job_id end
  local shown = pipe:read("*a") or ""
  pipe:close()
  if string.find(shown, "Invalid job id specified", 1, true) then return false, job_id end
  if not string.find(shown, "^JobId=" .. job_id .. "%s") then return nil, job_id end
  local record, named = shown, job_id
  if string.find(shown, "%sHetJobOffset=%d") then
    named = job_id .. "+" .. offset
    record = string.match("\n" .. shown, "\n([^\n]*%sHetJobOffset=" .. offset .. "%s[^\n]*)")
    if record == nil then return nil, named end
  end
  local starts, held, fewest = {}, {}, nil
  for at in string.gmatch(record, "()%sNodes=") do starts[#starts + 1] = at end
  for i, start in ipairs(starts) do
    local slice = string.sub(record, start, (starts[i + 1] or 0) - 1)
    local items, count = {}, 0
    for item in string.gmatch(string.match(slice, "%sGRES=(%S+)") or "", "%f[%w](gpu:[^%(%s]+)%(") do
      items[#items + 1], count = item, count + (tonumber(string.match(item, "(%d+)$")) or 0)
    end
    if #items > 0 then
      held[#held + 1] = table.concat(items, ",") .. " on " .. string.match(slice, "^%sNodes=(%S*)")
      fewest = math.min(fewest or count, count)
    end
  end
  return held, named, fewest
end

-- A step's devices are its job's (Slurm gives a step without device options all of them), so
-- gpumem/gpucore in a step is refused, naming what the job holds and the count to ask; nil where
-- srun answers itself (no such job).
local function step_refusal(before, job_id, offset)
  local request = {}
  for _, entry in ipairs(OPTIONS) do
    for _, item in ipairs(hook.items_of(before[entry[1]])) do request[#request + 1] = item.body end
  end
  local held, named, fewest = holdings(job_id, offset or 0)
  if held == false then return nil end
  local head = string.format("%s: this srun is a step of job %s", table.concat(request, ","), named)
  if held == nil then
    return head .. " and slurm-hetero cannot read which devices it holds; ask for that job's devices instead "
      .. "(--gres=gpu:N)"
  end
  if #held == 0 then
    return head .. ", which holds no gpu devices; a step gets devices only from its job (ask for them with "
      .. "salloc or sbatch)"
  end
  return string.format("%s, which holds %s; gpumem/gpucore choose a new job's devices and a step gets its "
    .. "job's: ask --gres=gpu:N (N up to %d per node), or leave the device options out for all of them", head,
    table.concat(held, ", "), fewest)
end

-- The hook on a job_desc: its return code, the job as it would store it, what it said.
local function run_hook(before, uid)
  local after = {}
  for k, v in pairs(before) do after[k] = v end
  local job = setmetatable({}, {
    __index = function(_, key) return after[key] end,
    __newindex = function(_, key, value) after[key] = value ~= "" and value or nil end,
  })
  said = {}
  slurm = quiet
  local called, result = pcall(hook.submit, job, {}, uid)
  slurm = real
  if not called then error(result, 0) end
  return result, after, said
end

-- Whether an earlier component of this het srun was rewritten here: the hook never sees its gpumem,
-- so a later component the hook refuses for its nodes is refused here.
local het_rewrote = false

-- The earlier components left alone (`remember`) go through the hook now, in order, so that its het
-- bookkeeping counts their nodes as taken.
local function replay(earlier, uid)
  for _, seen in ipairs(earlier or {}) do
    local job = job_of(seen, set_in(seen.set))
    job.het_job_offset = seen.offset
    pcall(run_hook, job, uid)
  end
  for i = #(earlier or {}), 1, -1 do earlier[i] = nil end
end

-- The srun options with the hook's decision written in (changed in place); a Slurm code. offset:
-- the het component (cli_filter's pack_offset); earlier: the components before it left alone.
local function decide(options, offset, earlier)
  local name, uid = client()
  if name ~= "srun" then return real.SUCCESS end
  local loaded, why = load_hook()
  if loaded == nil then
    debug_log("slurm_hetero cli_filter: %s", why)
    return real.SUCCESS
  end
  local isset = set_options(options)
  local job_id = allocation(options)
  local before = job_of(options, isset)
  if job_id == nil and not counts_known(before, isset) then return real.SUCCESS end
  if job_id then
    -- exempt users are left alone, as by the hook (and a step without gpumem/gpucore)
    local rc, _, told = run_hook(before, uid)
    if rc == real.SUCCESS and #told == 0 then return real.SUCCESS end
    local refusal = step_refusal(before, job_id, tonumber(offset))
    if refusal then real.log_error("%s", refusal) end
    return refusal and real.ERROR or real.SUCCESS
  end
  offset = tonumber(offset)
  if offset == 0 then het_rewrote = false end
  if offset then before.het_job_offset = offset end
  -- the hosts later components name with -w, which slurmctld keeps this one off
  before.exc_nodes = joined(before.exc_nodes, later_hosts(offset))
  if offset and offset > 0 then replay(earlier, uid) end
  local ok, rc, after, lines = pcall(run_hook, before, uid)
  if not ok then
    debug_log("slurm_hetero cli_filter: %s", tostring(rc))
    return real.SUCCESS
  end
  if rc ~= real.SUCCESS and offset and offset > 0 and het_rewrote then
    real.log_error("%s", lines[1] or "refused")
    return real.ERROR
  end
  -- a refusal is left to the hook, with its specific Slurm error; no lines: untouched, exempt, failed
  if rc ~= real.SUCCESS or #lines == 0 then return real.SUCCESS end
  before.het_job_offset, after.het_job_offset = nil, nil
  local set = changes(options, before, after)
  if set == nil then
    real.log_error("%s; srun cannot give the job step these devices with these options: ask %s instead",
                   lines[1], instead(before, after))
    return real.ERROR
  end
  for option, value in pairs(set) do options[option] = value end
  if offset then het_rewrote = true end
  for _, line in ipairs(lines) do real.log_info("%s", line) end
  return real.SUCCESS
end

local DEVICE_OPTIONS = { "gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket" }

-- Whether a device option names gpumem or gpucore (the hook leaves every other request alone),
-- and whether one may name a gpu type (a value with a letter: gpu:l40s:1, l40s:2).
local function asks_us(options)
  local named = false
  for _, name in ipairs(DEVICE_OPTIONS) do
    local value = text(options, name)
    if value ~= nil then
      if string.find(value, "gpumem", 1, true) or string.find(value, "gpucore", 1, true) then return true end
      named = named or string.find(value, "%a") ~= nil
    end
  end
  return false, named
end

-- This srun's het components with a device but no gpumem/gpucore, or a -w, for `replay` (srun calls
-- the filter once per component, offset 0 first, and reuses neither options table).
local COUNTS = { "nodes", "ntasks", "ntasks-per-node", "nodelist", "exclude", "constraint", "cpus-per-task",
                 "cpus-per-gpu", "mem", "mem-per-cpu", "mem-per-gpu", "tres-per-task" }
local earlier = {}
local decided_before = false  -- a component of this command asked gpumem/gpucore

local function remember(options, offset)
  local seen = { offset = offset }
  for _, name in ipairs(DEVICE_OPTIONS) do seen[name] = options[name] end
  for _, name in ipairs(COUNTS) do seen[name] = options[name] end
  if real.json_cli_options then seen.set = real.json_cli_options(options) end
  earlier[#earlier + 1] = seen
end

-- cli_filter.lua's srun call, per component: gpumem/gpucore decided; a component after one decided
-- here checked as the hook would (het_typed); one that names a type or hosts remembered.
return function(options, offset)
  if offset == 0 then earlier, decided_before = {}, false end
  local asked, named = asks_us(options)
  if not asked then
    if decided_before and offset and offset > 0 then return decide(options, offset, earlier) end
    if offset and (named or text(options, "nodelist")) then remember(options, offset) end
    return real.SUCCESS
  end
  decided_before = true
  return decide(options, offset, earlier)
end
