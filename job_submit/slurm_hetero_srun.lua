--[[
slurm_hetero_srun.lua: the srun half of slurm-hetero's client filter (cli_filter.lua, Slurm's
cli_filter/lua plugin, Lua 5.1). cli_filter.lua runs this file with `dofile` only in srun, and only
when a device option names something (gpumem, gpucore, a gpu type) or -w names hosts; it returns
the function cli_filter.lua calls per het component (offset 0 alone without ":").

In srun it makes the job_submit hook's decision before the request leaves the client, so the
options themselves carry the device: `srun --gres=gpumem:20G hostname` without an allocation
becomes `--gres=gpu:l40s:1` for the job AND its step (the hook alone rewrites only the job; the
step would keep the gpumem request and see no GPU). The job_submit hook stays the authority: it
sees a request that no longer carries gpumem and leaves it alone (or, for shards, which keep
gpumem, decides it again to the same), and anything this filter passes unchanged it decides as
before. In sbatch and salloc, whose options create no step, the filter changes nothing: the hook
decides there and records why in the admin comment, which a client cannot write.

The decision is job_submit.lua's own code over the same generated table: this file runs
job_submit.lua (beside it, or the path baked in at render time) with `dofile`, once per command,
and calls its slurm_job_submit on a job_desc built from the options as srun builds its own
(slurm_opt_create_job_desc after _opt_verify: -N/-n/--ntasks-per-node as srun settles them, the
options the user set told by slurm.json_cli_options; -w, -x, -c, --cpus-per-gpu, --mem,
--mem-per-cpu, --mem-per-gpu), so a request the hook refuses is refused the same (left to the hook,
which says why), and the node count the hook would pin goes into --nodes. Once per command the client
also reads /proc/self/status for its name and uid (exempt users, default root, are left alone as
by the hook).

Options are written back where they hold the field: --gres (tres_per_node), --gpus (tres_per_job),
--gpus-per-task, --gpus-per-socket, --constraint; with --gpus-per-node, tres_per_node's gpu item
goes there and the rest to --gres. An option cannot be unset from here: an emptied --gres (the
count came from --gpus, --gpus-per-task or --gpus-per-node) is written as a gpu item of count 0,
which Slurm skips (see `cleared`). What the options still cannot carry (a field emptied other than
--gres, two items where one option holds one) srun refuses, with the hook's decision and the
options to ask instead, rather than allocate a job whose step then fails ("Step requested GRES
(gpumem:(null)) not found in the job"). Requests the hook would refuse pass unchanged too: slurmctld
refuses them with the message and the most specific Slurm error. Anything unexpected (no hook
file, an error: cli_filter.lua calls this under pcall) leaves the options alone.
--]]

-- Baked in by `slurm-hetero job-submit render` (the line ending in "@render"; keep it so).
local HOOK_PATH = nil  -- @render hook_path

local real = slurm
local debug_log = real.log_debug or function() end

-- The hook's slurmctld log lines are not for the user; its user message is printed once, here.
local said = {}
local quiet = setmetatable({
  log_info = function() end,
  log_error = function() end,
  log_debug = function() end,
  log_verbose = function() end,
  log_user = function(format, ...) said[#said + 1] = string.format(format, ...) end,
}, { __index = real })

local function script_dir()
  local info = debug and debug.getinfo and debug.getinfo(1, "S")
  local source = info and info.source or ""
  if string.sub(source, 1, 1) ~= "@" then return "." end
  return string.match(string.sub(source, 2), "^(.*)/[^/]*$") or "."
end

-- The client's name and uid, from /proc/self/status (read once per command).
local function client()
  local file = io.open("/proc/self/status", "r")
  if not file then return nil, nil end
  local text = file:read("*a") or ""
  file:close()
  return string.match(text, "^Name:%s*(%S+)"), tonumber(string.match(text, "\nUid:%s*(%d+)"))
end

-- The client's command line (/proc/self/cmdline, read once per command) as a list of arguments,
-- argv[0] first; nil when it cannot be read.
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

-- Whether an argument matches `pattern` (a Lua pattern anchored by the caller), or nil when the
-- command line cannot be read.
local function typed(pattern)
  local args = arguments()
  if args == nil then return nil end
  for _, arg in ipairs(args) do
    if string.find(arg, pattern) then return true end
  end
  return false
end

-- Short options of Slurm's clients that take a value (slurm_opt.c, 22.05 and 24.11: required_argument).
local SHORT_VALUED = "ABCDFGJLMNSTWabcdeimnopqrtwx"

-- A -w/-x value with a "/" names a host file, which srun reads itself and sends its hosts, so the
-- hook sees host names (proc_args.c verify_node_list -> slurm_read_hostfile, 22.05 and 24.11):
-- comma-separated names or hostlist expressions, one or more a line, "#" to the line's end a comment
-- ("\#" a literal "#"), blank lines skipped, `name*N` the host N times (once here: a set); blanks
-- split names as slurmctld's hostlist does (srun sends "a " for "a # comment"). Read the
-- same here (at most MAX_HOSTFILE bytes); the hosts comma-joined, or nil where the file cannot be
-- read or srun would refuse it (a line that starts with neither a letter nor a digit, no host):
-- srun says so itself. Any other value: as given.
local MAX_HOSTFILE = 1048576
local function read_hostfile(path)
  local file = io.open(path, "r")
  if not file then return nil end
  local data = file:read(MAX_HOSTFILE + 1)
  file:close()
  if type(data) ~= "string" or #data > MAX_HOSTFILE then return nil end
  local hosts = {}
  for raw in string.gmatch(data .. "\n", "([^\n]*)\n") do
    local line, at = {}, 1
    while at <= #raw do
      local char = string.sub(raw, at, at)
      if char == "#" then
        if line[#line] ~= "\\" then break end
        line[#line] = "#"
      else
        line[#line + 1] = char
      end
      at = at + 1
    end
    line = table.concat(line)
    if line ~= "" then
      if not string.find(line, "^[%w]") then return nil end
      for name in string.gmatch(line, "[^,%s]+") do  -- slurmctld's hostlist splits at blanks too
        local base, times = string.match(name, "^([^*]*)%*(%d+)")
        hosts[#hosts + 1] = (base and tonumber(times) > 0) and base or name
      end
    end
  end
  if #hosts == 0 then return nil end
  return table.concat(hosts, ",")
end

local function hostfile(value)
  if value == nil or not string.find(value, "/", 1, true) then return value end
  local ok, hosts = pcall(read_hostfile, value)
  if ok then return hosts end
  return nil
end

-- The hosts the het components after `offset` name with -w, read from the command line (srun A :
-- B: srun calls this filter per component in order, so B's options are not parsed yet when A is
-- decided, and slurmctld keeps A off B's -w hosts, _exclude_het_job_nodes). Each component's options
-- are read up to its command: short options (a value attached or next, SHORT_VALUED), --name=value;
-- a long option without "=" before a word ends the reading (the word may be its value or the
-- command), so a -w after it is missed rather than one read from the command's own arguments.
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
  if #hosts == 0 then return nil end
  return table.concat(hosts, ",")
end

-- Load job_submit.lua (and through it the table) with the quiet slurm table; once per command.
local loaded = nil
local function load_hook()
  if loaded then return loaded, nil end
  slurm = quiet
  local ok, err = pcall(dofile, HOOK_PATH or (script_dir() .. "/job_submit.lua"))
  slurm = real
  if not ok then return nil, tostring(err) end
  if type(slurm_job_submit) ~= "function" then return nil, "job_submit.lua defines no slurm_job_submit" end
  loaded = slurm_job_submit
  return loaded, nil
end

local function text(options, name)
  local value = options[name]
  if value == nil then return nil end
  value = tostring(value)
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

-- Whether the user set an option, from slurm.json_cli_options (the set options as one JSON
-- object, 22.05 and 24.11); nil where that call is missing. srun reports an unset -n as "1" and an
-- unset -N as "1-0", so only this tells `-N2` from `-N2 -n1`.
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
  if value == nil then return nil end
  if string.find(value, "^gres[:/]") then return value end
  return "gpu:" .. value
end

local function joined(a, b)
  if a and b then return a .. "," .. b end
  return a or b
end

-- min_nodes, max_nodes, num_tasks, ntasks_per_node of the job srun will send, from the options
-- as srun's _opt_verify (after this filter) settles them: without -n, one task per node and
-- num_tasks unset (or -N x --ntasks-per-node); -n below -N lowers the node count to it; an
-- --ntasks-per-node that does not divide -n is dropped. Without `isset`, the options as they read.
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

-- The gpu item of srun 24.11's --tres-per-task ("cpu=2,gres/gpu=1" -> "gres/gpu=1"), or nil (22.05
-- has no such option). An allocation exports its per-task count there only (SLURM_TRES_PER_TASK),
-- so a step that does not ask --gpus-per-task again carries it there.
local function per_task_gpu(options)
  for item in string.gmatch(text(options, "tres-per-task") or "", "[^,]+") do
    if string.find(item, "^gres[:/]gpu[:=]") then return item end
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
  for item in string.gmatch(value, "[^,]+") do out[#out + 1] = (string.gsub(item, "^gres[:/]", "")) end
  return table.concat(out, ",")
end

-- "gres:gpu:a100:2" -> "a100:2" (each item)
local function gpus_option(value)
  local out = {}
  for item in string.gmatch(value, "[^,]+") do out[#out + 1] = (string.gsub(item, "^gres[:/]gpu[:=]?", "")) end
  return table.concat(out, ",")
end

local OPTIONS = {  -- field -> option, how its value is written
  { "tres_per_node", "gres", gres_option },
  { "tres_per_job", "gpus", gpus_option },
  { "tres_per_task", "gpus-per-task", gpus_option },
  { "tres_per_socket", "gpus-per-socket", gpus_option },
}

-- --gres "emptied": a gpu item of count 0 in the decided type (`gpu:a100_80g:0`, or `gpu:0` for
-- any-fit), which sbatch, srun and slurmctld all skip (Slurm's GRES parser drops a zero count).
-- Measured on 22.05 and 24.11: `srun --gpus=l40s:2 --gres=gpu:l40s:0` and `--gpus-per-node=TYPE:2
-- --gres=gpu:TYPE:0` allocate the job and the step gets both devices; "none" is no good (22.05's
-- step then gets no device, or is refused with --gpus-per-node).
local function cleared(after)
  for _, field in ipairs({ "tres_per_job", "tres_per_task", "tres_per_socket", "tres_per_node" }) do
    local item = string.match(after[field] or "", "^gres[:/]gpu[:=]([^,]*)")
    if item then
      local gpu_type = string.match(item, "^([^:=]+)[:=]%d+$")
      return gpu_type and ("gpu:" .. gpu_type .. ":0") or "gpu:0"
    end
  end
  return nil
end

-- tres_per_node as --gpus-per-node (its gpu item) and --gres (the rest, else cleared).
local function per_node(new, after, out)
  local gpu, rest = nil, {}
  for item in string.gmatch(new, "[^,]+") do
    if string.find(item, "^gres[:/]gpu[:=]") or string.find(item, "^gpu[:=]") then
      if gpu then return false end
      gpu = item
    else
      rest[#rest + 1] = item
    end
  end
  local gres = #rest > 0 and gres_option(table.concat(rest, ",")) or cleared(after)
  if gpu == nil or gres == nil then return false end
  out["gpus-per-node"], out["gres"] = gpus_option(gpu), gres
  return true
end

-- srun 24.11 keeps --gpus-per-task in --tres-per-task too, and an allocation exports that untyped
-- (salloc -n2 --gpus-per-task=1: SLURM_TRES_PER_TASK=gres/gpu=1, no SLURM_GPUS_PER_TASK): a typed
-- --gpus-per-task, or a typed --gres, beside it is refused by srun ("Invalid GRES specification
-- (with and without type identification)"). Its gpu item takes the written value (`a100_80g:1` ->
-- gres/gpu:a100_80g=1, as srun writes it); the rest stays. nil: nothing to change (no such
-- option, as in 22.05, or no gpu item).
local function tres_per_task(options, gpus)
  local current = text(options, "tres-per-task")
  if current == nil then return nil end
  local gpu_type, count = string.match(gpus, "^([^:=]+)[:=](%d+)$")
  local item = gpu_type and ("gres/gpu:" .. gpu_type .. "=" .. count) or ("gres/gpu=" .. gpus)
  local out, found = {}, false
  for old in string.gmatch(current, "[^,]+") do
    if string.find(old, "^gres[:/]gpu[:=]") or string.find(old, "^gpu[:=]") then
      old, found = item, true
    end
    out[#out + 1] = old
  end
  return found and table.concat(out, ",") or nil
end

-- The option changes for a rewritten job, or nil when these options cannot carry it (srun then
-- refuses: the hook would rewrite the job while the step kept the gpumem request, and fail).
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
  if after.min_nodes ~= before.min_nodes or after.max_nodes ~= before.max_nodes then
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

-- Whether the options show the counts the job_desc will hold. Without slurm.json_cli_options the
-- client's unset -n reads "1", so with -N above it the filter cannot tell `-N2` (num_tasks unset,
-- min_nodes 2) from `-N2 -n1` (srun lowers min_nodes to 1): those are left to the hook.
local function counts_known(job, isset)
  return isset ~= nil or not (job.min_nodes and job.num_tasks and job.num_tasks < job.min_nodes)
end

-- The hosts a Slurm hostlist names ("a100n[1-2],l40sn1" -> a100n1, a100n2, l40sn1; ranges keep
-- their zero padding: n[01-02] -> n01, n02), in order.
local function hosts(list)
  local out, depth, start = {}, 0, 1
  local entries = {}
  for i = 1, #list do
    local c = string.sub(list, i, i)
    if c == "[" then depth = depth + 1 elseif c == "]" then depth = depth - 1
    elseif c == "," and depth == 0 then entries[#entries + 1], start = string.sub(list, start, i - 1), i + 1 end
  end
  entries[#entries + 1] = string.sub(list, start)
  for _, entry in ipairs(entries) do
    local names = { "" }
    local at = 1
    while entry ~= "" do
      local first, last, inside = string.find(entry, "%[([^%]]*)%]", at)
      local plain = string.sub(entry, at, (first or (#entry + 1)) - 1)
      for i, name in ipairs(names) do names[i] = name .. plain end
      if first == nil then break end
      local grown = {}
      for _, name in ipairs(names) do
        for part in string.gmatch(inside, "[^,]+") do
          local low, high = string.match(part, "^(%d+)%-(%d+)$")
          if low then
            for n = tonumber(low), tonumber(high) do grown[#grown + 1] = name .. string.format("%0" .. #low .. "d", n) end
          else
            grown[#grown + 1] = name .. part
          end
        end
      end
      names, at = grown, last + 1
    end
    if entry ~= "" then
      for _, name in ipairs(names) do out[#out + 1] = name end
    end
  end
  return out
end

local function hosts_in(list)
  return #hosts(list)
end

-- The node records of a job record in `scontrol show job -d -o` (`Nodes=HOSTLIST CPU_IDs=...
-- GRES=gpu:l40s:1(IDX:0)`, one per group of nodes alike, 22.05 and 24.11): each from its " Nodes="
-- to the next (the last to the end), and where the first begins (nil: none).
local function node_records(record)
  local starts, at = {}, 1
  while true do
    local found = string.find(record, "%sNodes=", at)
    if found == nil then break end
    starts[#starts + 1], at = found, found + 1
  end
  local slices = {}
  for i, start in ipairs(starts) do
    slices[i] = string.sub(record, start, (starts[i + 1] or (#record + 1)) - 1)
  end
  return slices, starts[1]
end

-- held[TYPE] = the devices of TYPE on each node holding it (a list, one entry per node), the job's
-- node count (NumNodes, or the records'), and per node record its hosts and devices by type.
local function per_node_held(record)
  local held, nodes, slices = {}, 0, {}
  for _, slice in ipairs((node_records(record))) do
    local hosts = hosts_in(string.match(slice, "^%sNodes=(%S*)") or "")
    nodes = nodes + hosts
    local on_node = {}
    for gpu_type, count in string.gmatch(string.match(slice, "%sGRES=(%S+)") or "", "%f[%w]gpu:([%w_%.%-]+):(%d+)%(IDX") do
      held[gpu_type] = held[gpu_type] or {}
      for _ = 1, hosts do table.insert(held[gpu_type], tonumber(count)) end
      on_node[gpu_type] = tonumber(count)
    end
    slices[#slices + 1] = { hosts = hosts, held = on_node }
  end
  return held, math.max(nodes, tonumber(string.match(record, "%sNumNodes=(%d+)") or "") or 0), slices
end

-- The job's record cut to the nodes a step's -w names and its -x leaves (the header, with its
-- node count and no JOB_GRES, and the node records of those nodes only), so that the step is decided
-- among their devices; the record itself without either; nil when no node of the job is left.
-- Before (issue 10 item 2, 24.11), `srun -N1 -w l40sn1 --gres=gpumem:20G` in an (a100n1, l40sn1)
-- job was decided as a100_80g, the first type the job holds.
local function on_nodes(record, wanted, unwanted)
  if wanted == nil and unwanted == nil then return record end
  local named, left = {}, {}
  for _, host in ipairs(hosts(wanted or "")) do named[host] = true end
  for _, host in ipairs(hosts(unwanted or "")) do left[host] = true end
  local slices, first = node_records(record)
  if first == nil then return nil end
  local kept, count = {}, 0
  for _, slice in ipairs(slices) do
    local list, rest = string.match(slice, "^%sNodes=(%S*)(.*)$")
    local on = {}
    for _, host in ipairs(hosts(list or "")) do
      if (wanted == nil or named[host]) and not left[host] then on[#on + 1] = host end
    end
    if #on > 0 then
      kept[#kept + 1], count = " Nodes=" .. table.concat(on, ",") .. rest, count + #on
    end
  end
  if count == 0 then return nil end
  local header = string.gsub(string.sub(record, 1, first - 1), "%sJOB_GRES=%S+", "")
  header = string.gsub(header, "(%sNumNodes=)%d+", "%1" .. count)
  local per_task = string.match(record, "%sTresPerTask=%S+") or ""
  return header .. table.concat(kept) .. per_task
end

-- A step's request as the hook decides it: -w/-x pick nodes among the job's, whose devices are
-- known, so the hook (which refuses them for a new job: it picks a type, not nodes) goes without.
local function as_step(job)
  local out = {}
  for k, v in pairs(job) do out[k] = v end
  out.req_nodes, out.exc_nodes = nil, nil
  return out
end

-- The request with the types its gpu items name taken out (gres/gpu:l40s:2 -> gres/gpu:2).
local function types_out(job)
  local out = {}
  for k, v in pairs(job) do out[k] = v end
  for _, field in ipairs({ "tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket" }) do
    if job[field] then
      local items = {}
      for item in string.gmatch(job[field], "[^,]+") do
        local head, count = string.match(item, "^(.-gpu):[^:=]+([:=]%d+)$")
        items[#items + 1] = head and (head .. count) or item
      end
      out[field] = table.concat(items, ",")
    end
  end
  return out
end

-- A refusal's reason: "REQUEST: REASON[; HINT]" -> REASON (the hint may name types a job lacks).
local function reason_of(line)
  return string.match(line or "", ": ([^;]*)")
end

-- Whether every reason is this one.
local function all_are(reasons, reason)
  for _, each in ipairs(reasons) do
    if each ~= reason then return false end
  end
  return reason ~= nil
end

-- The count of a step's gpu item ("gres/gpu:l40s:2", "gpu:2", "gres/gpu=1"), or nil.
local function gpu_count(item)
  local rest = string.match(item, "^g?r?e?s?[:/]?gpu[:=](.*)$")
  return rest and tonumber(string.match(rest, "^(%d+)$") or string.match(rest, "[:=](%d+)$")) or nil
end

local function gpu_counts(field)
  local out = {}
  for item in string.gmatch(field or "", "[^,]+") do out[#out + 1] = gpu_count(item) end
  return out
end

local function plural(count, word)
  return count .. " " .. word .. (count == 1 and "" or "s")
end

-- Why a step the hook accepts on gpu_type asks more devices than the job holds where the step runs,
-- or nil. counts: the devices of gpu_type on each node of the job holding it (per_node_held);
-- job: the job's node count and, recorded in 22.05's form, its per-task count (held_types); nodes,
-- tasks: the step's. Measured on 22.05 and 24.11, srun refuses a
-- step asking more per node than each of its nodes holds, more in all (--gpus) than its nodes hold
-- ("Invalid generic resource (gres) specification", 24.11 across nodes "Unspecified error"), and
-- more tasks than its nodes hold --gpus-per-task for ("More processors requested than permitted"),
-- and 22.05 more per task than a job asked per task ("Step requested gres_per_task=gpu:2 is more
-- than the job's gres_per_task=gpu:1"; 24.11 runs that step).
-- The step's nodes are the job's best-held ones, so a step that could fit is never refused.
local function beyond(after, gpu_type, counts, job, nodes, tasks)
  if counts == nil or #counts == 0 then return nil end
  local job_nodes = job.nodes
  local held = {}
  for i, count in ipairs(counts) do held[i] = count end
  table.sort(held, function(a, b) return a > b end)
  for i = #held + 1, math.max(job_nodes, nodes) do held[i] = 0 end
  local on = nodes < job_nodes and (" on the step's " .. plural(nodes, "node")) or ""
  for _, asked in ipairs(gpu_counts(after.tres_per_node)) do
    if asked > held[nodes] then
      if on == "" and #counts >= job_nodes then
        return string.format("the job holds %d %s per node, the step asks %d", held[nodes], gpu_type, asked)
      end
      local enough = 0
      for _, count in ipairs(held) do enough = enough + ((count >= asked) and 1 or 0) end
      return string.format("%d of the job's %s hold %d %s, the step asks %d per node on %s", enough,
        plural(job_nodes, "node"), asked, gpu_type, asked, plural(nodes, "node"))
    end
  end
  local total, biggest = 0, held[1]
  for i = 1, nodes do total = total + held[i] end
  for _, asked in ipairs(gpu_counts(after.tres_per_job)) do
    if asked > total then
      return string.format("the job holds %d %s%s, the step asks %d in all: at most --gpus=%d", total, gpu_type,
        on, asked, total)
    end
  end
  for _, each in ipairs(gpu_counts(after.tres_per_task)) do
    if job.per_task and each > job.per_task then
      return string.format("the job holds %d %s per task and Slurm 22.05 gives its steps no more, the step "
        .. "asks %d per task: at most --gpus-per-task=%d", job.per_task, gpu_type, each, job.per_task)
    end
    local room = 0
    for i = 1, nodes do room = room + math.floor(held[i] / math.max(each, 1)) end
    local wanted = tasks or nodes
    if wanted > room then
      local most = room > 0 and ("-n " .. room) or ("--gpus-per-task=" .. biggest)
      return string.format("the job holds %d %s%s, enough for %s of %d each, the step asks %s: at most %s",
        total, gpu_type, on, plural(room, "task"), each, plural(wanted, "task"), most)
    end
  end
  return nil
end

-- The step's node and task counts in a job of job_nodes nodes: -N as set (the job's nodes
-- without it), lowered to -n (srun: "can't run 1 processes on 2 nodes, setting nnodes to 1"); -n,
-- or --ntasks-per-node on each of those nodes, or nil (one task per node). Without `isset` (no
-- slurm.json_cli_options) the client's unset -N reads "1-0": the job's nodes, the tasks unknown.
local function step_counts(before, isset, job_nodes)
  if isset == nil then return job_nodes, nil end
  local nodes = math.min(before.max_nodes or before.min_nodes or job_nodes, job_nodes)
  local tasks = isset("ntasks") and before.num_tasks or nil
  if tasks and tasks < nodes then nodes = tasks end
  if tasks == nil and before.ntasks_per_node then tasks = nodes * before.ntasks_per_node end
  return math.max(nodes, 1), tasks
end

-- The job this srun makes a step of: srun inside salloc or sbatch (SLURM_JOB_ID, which srun
-- also reads as --jobid) or with --jobid; nil for a new job. Its digits only: the id goes into a
-- command line.
local function allocation(options)
  local id = text(options, "jobid") or os.getenv("SLURM_JOB_ID")
  return id and string.match(id, "^(%d+)") or nil
end

-- The record of a het allocation's component `offset` in `scontrol show job -d -o` (one line per
-- component, each with HetJobOffset=N and its own GRES); the whole text for a job that is not
-- heterogeneous; nil when no component has that offset.
local function component(shown, offset)
  if not string.find(shown, "%sHetJobOffset=%d") then return shown end
  for line in string.gmatch(shown, "[^\n]+") do
    if string.match(line, "%sHetJobOffset=(%d+)") == tostring(offset) then return line end
  end
  return nil
end

-- The gpu types the job (of a het allocation: component `offset`, the one srun's --het-group
-- names, default 0) holds, in the order scontrol shows them ({} when none), from its GRES in
-- `scontrol show job -d -o` (JOB_GRES=gpu:l40s:1 and each node's GRES=gpu:l40s:1(IDX:0), 22.05
-- and 24.11); nil when scontrol cannot say. Also the job as named to the user (10, or 10+0), and
-- what each node holds (per_node_held) and { nodes = the job's node count, per_task = its
-- per-task gpu count where the record is in 22.05's `gres:` form }.
local function held_types(job_id, offset, wanted, unwanted)
  local ok, pipe = pcall(io.popen, "scontrol show job -d -o " .. job_id .. " 2>&1")
  if not ok or not pipe then return nil, job_id end
  local shown = pipe:read("*a") or ""
  pipe:close()
  -- no such job (`srun --jobid=99999`): false, for srun to say so itself
  if string.find(shown, "Invalid job id specified", 1, true) then return false, job_id end
  if not string.find(shown, "^JobId=" .. job_id .. "%s") then return nil, job_id end
  local record = component(shown, offset or 0)
  local named = record == shown and job_id or (job_id .. "+" .. (offset or 0))
  if record == nil then return nil, named end
  record = on_nodes(record, wanted, unwanted)
  if record == nil then return {}, named, {}, { nodes = 0 }, true end
  local types, seen = {}, {}
  for value in string.gmatch(record, "[%s_]GRES=(%S+)") do
    for gpu_type in string.gmatch(value, "%f[%w]gpu:([%w_%.%-]+):%d") do
      if not seen[gpu_type] then seen[gpu_type], types[#types + 1] = true, gpu_type end
    end
  end
  local held, nodes, slices = per_node_held(record)
  local job = { nodes = nodes, slices = slices }
  for item in string.gmatch(string.match(record, "%sTresPerTask=(%S+)") or "", "[^,]+") do
    if string.find(item, "^gres:gpu:") then job.per_task = gpu_count(item) end  -- 22.05's form only
  end
  -- a job that asked its devices untyped, in 22.05's form (TresPerNode=gres:gpu:1): 22.05 refuses
  -- its typed steps ("Step requested GRES (gpu:a100_80g) not found in the job")
  for _, value in string.gmatch(record, "%sTresPer(%a+)=(%S+)") do
    for item in string.gmatch(value, "[^,]+") do
      if string.find(item, "^gres:gpu:%d+$") then job.untyped_22 = true end
    end
  end
  return types, named, held, job
end

-- The step's request with its device count given the type gpu_type (a gpu item with a count
-- gets the type; without one, one device per node, as the hook's default): a copy of `job`, or
-- nil and the type named when the request names one the job does not hold.
local function typed_as(job, gpu_type, holds)
  local out, counted, form = {}, false, nil
  for k, v in pairs(job) do out[k] = v end
  for _, field in ipairs({ "tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket" }) do
    if job[field] then
      local items = {}
      for item in string.gmatch(job[field], "[^,]+") do
        local prefix, rest = string.match(item, "^(g?r?e?s?[:/]?)gpu[:=](.*)$")
        if prefix and (prefix == "" or prefix == "gres:" or prefix == "gres/") then
          local named = string.match(rest, "^([^:=]+)[:=]%d+$")
          if named and not holds[named] then return nil, named end
          if named == nil and string.find(rest, "^%d+$") then item = prefix .. "gpu:" .. gpu_type .. ":" .. rest end
          counted = true
        end
        form = form or string.match(item, "^(gres[:/])")
        items[#items + 1] = item
      end
      out[field] = table.concat(items, ",")
    end
  end
  if not counted then out.tres_per_node = joined(out.tres_per_node, (form or "") .. "gpu:" .. gpu_type .. ":1") end
  return out, nil
end

-- The step's gpu items without their type, for a job that holds one type (its devices are all
-- that type): measured on 22.05, a typed step of a job that asked untyped (`salloc -w a100n1
-- --gpus=2`, then `srun --gpus=a100_80g:2`) is refused "Step requested GRES (gpu:a100_80g) not
-- found in the job"; untyped steps run on 22.05 and 24.11 whatever the job asked.
local function untyped(after, gpu_type)
  local name = string.gsub(gpu_type, "%W", "%%%0")
  for _, field in ipairs({ "tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket" }) do
    if after[field] then after[field] = (string.gsub(after[field], "(gpu[:=])" .. name .. "[:=](%d)", "%1%2")) end
  end
end

-- The hook on a job_desc: its return code, the job as it would store it, what it said.
local function run_hook(hook, before, uid)
  local after = {}
  for k, v in pairs(before) do after[k] = v end
  local job = setmetatable({}, {
    __index = function(_, key) return after[key] end,
    __newindex = function(_, key, value)
      if value == "" then value = nil end
      after[key] = value
    end,
  })
  said = {}
  slurm = quiet
  local called, result = pcall(hook, job, {}, uid)
  slurm = real
  if not called then error(result, 0) end
  return result, after, said
end

-- A step is not a new job: its devices come from the job it runs in (of a het allocation, the
-- component srun runs it on: offset). The hook decides the request on each gpu type that job holds (the count as the request gives it); the first the
-- hook accepts is the step's, else one line names the job's devices and why none fits.
local function decide_step(hook, before, uid, job_id, offset, isset)
  local request = string.gsub(table.concat({ before.tres_per_node or "", before.tres_per_job or "",
                                             before.tres_per_task or "", before.tres_per_socket or "" }, ","),
                              "gres[:/]", "")
  request = string.gsub(string.gsub(request, ",,+", ","), "^,*(.-),*$", "%1")
  local types, held, shape, none_left
  types, job_id, held, shape, none_left = held_types(job_id, offset, before.req_nodes, before.exc_nodes)
  if types == false then return before, {} end  -- left alone: srun refuses the job id in its own words
  if types == nil or #types == 0 then
    local what = types == nil and "slurm-hetero cannot read which devices it holds"
      or (none_left and "-w/-x leave none of its nodes")
      or ((before.req_nodes or before.exc_nodes) and "the step's nodes hold no gpu devices")
      or "it holds no gpu devices"
    return nil, string.format("%s: this srun is a step of job %s and %s; ask for that job's devices "
      .. "instead (--gres=gpu:N)", request, job_id, what)
  end
  local holds, reasons = {}, {}
  for _, gpu_type in ipairs(types) do holds[gpu_type] = true end
  -- the request on gpu_type: the step as the hook writes it and its lines, or nil and why not
  local function on_type(gpu_type)
    local job = typed_as(before, gpu_type, holds)
    local rc, after, lines = run_hook(hook, as_step(job), uid)
    local nodes, tasks = step_counts(before, isset, shape.nodes)
    local over = rc == real.SUCCESS and beyond(after, gpu_type, held[gpu_type], shape, nodes, tasks) or nil
    if rc == real.SUCCESS and #lines > 0 and over == nil then return after, lines end
    -- the hook's reason without its hint (which may name types this job does not hold)
    return nil, over or reason_of(lines[1]) or (gpu_type .. " refused")
  end
  -- whether the user named a gpu type (gpu:l40s:1, --gpus=l40s:1): the step keeps it
  local named_type = string.find("," .. request, ",gpu[:=][^:=,]+[:=]%d") ~= nil
  for _, gpu_type in ipairs(types) do
    local job, other = typed_as(before, gpu_type, holds)
    if job == nil then
      return nil, string.format("%s: this srun is a step of job %s, which holds %s devices, not %s",
        request, job_id, table.concat(types, ", "), other)
    end
    local after, lines = on_type(gpu_type)
    if after then
      after.min_nodes, after.max_nodes = before.min_nodes, before.max_nodes  -- the job's nodes, not pinned
      -- untyped where every type on the step's nodes takes the request (issue 10 item 3: 22.05
      -- refuses a typed step of a job asked untyped, and srun a typed count beside the untyped
      -- --gpus-per-node an allocation exports); else typed, which 22.05 refuses in such a job
      local every = not named_type
      for _, each in ipairs(types) do
        if every and each ~= gpu_type then every = on_type(each) ~= nil end
      end
      if every then
        untyped(after, gpu_type)
      elseif shape.untyped_22 and not named_type then
        return nil, string.format("%s: this srun is a step of job %s, which asked its devices without a "
          .. "gpu type, and Slurm 22.05 gives such a job's steps no typed device; of its %s devices only "
          .. "%s can hold it: name nodes of that type with -w", request, job_id, table.concat(types, ", "),
          gpu_type)
      end
      lines[1] = lines[1] .. " (a step of job " .. job_id .. ")"
      return after, lines
    end
    reasons[#reasons + 1] = lines
  end
  -- a step over nodes of several types that each hold it (`srun -N2 --gres=gpumem:20G` in an a100_80g +
  -- l40s job, adversarial r6 O04): a per-node request decided for one node of each type; untyped where
  -- every type takes the same count, then its nodes checked against the devices of all of them
  local per_node_only = not (before.tres_per_job or before.tres_per_task or before.tres_per_socket)
  local mixed, counted = not named_type and per_node_only and #types > 1 and #reasons == #types and {}, nil
  local nodes, tasks = step_counts(before, isset, shape.nodes)
  for _, gpu_type in ipairs(mixed and types or {}) do
    local job = as_step(typed_as(before, gpu_type, holds))
    job.min_nodes, job.max_nodes = 1, 1
    job.num_tasks = tasks and math.ceil(tasks / math.max(nodes, 1)) or nil
    local rc, after, lines = run_hook(hook, job, uid)
    if rc ~= real.SUCCESS or #lines == 0 then mixed = nil break end
    untyped(after, gpu_type)
    local request_as = table.concat({ after.tres_per_node or "", after.tres_per_job or "", after.tres_per_task or "",
                                      after.tres_per_socket or "" }, ";")
    if counted and counted ~= request_as then mixed = nil break end  -- gpumem:60G: 1 a100, 2 l40s
    counted, mixed[gpu_type] = request_as, { after = after, lines = lines }
  end
  if mixed then
    local counts = {}  -- per node, the most devices of a type that holds the step
    for _, slice in ipairs(shape.slices) do
      local most = 0
      for gpu_type, count in pairs(slice.held) do
        if mixed[gpu_type] and count > most then most = count end
      end
      for _ = 1, slice.hosts do counts[#counts + 1] = most end
    end
    local first = mixed[types[1]]
    if beyond(first.after, "gpu", counts, shape, nodes, tasks) == nil then
      local after, lines = first.after, first.lines
      after.min_nodes, after.max_nodes, after.num_tasks = before.min_nodes, before.max_nodes, before.num_tasks
      local rest = string.match(lines[1], "^.- %-> %S+(.*)$") or ""
      lines[1] = string.format("%s -> %s%s (a step of job %s, on its %s nodes)", request, after.tres_per_node or "",
                               rest, job_id, table.concat(types, ", "))
      return after, lines
    end
  end
  -- a cause in the request itself (a malformed size, --gpus-per-socket) is refused alike on every
  -- type, and on none (its types taken out): the hook's own line for it, which blames no device
  local rc, _, own = run_hook(hook, as_step(before), uid)
  local bare_rc, _, bare = run_hook(hook, as_step(types_out(before)), uid)
  if rc ~= real.SUCCESS and bare_rc ~= real.SUCCESS and reason_of(bare[1]) == reason_of(own[1])
      and all_are(reasons, reason_of(own[1])) then
    return nil, own[1]
  end
  return nil, string.format("%s: this srun is a step of job %s, whose %s devices cannot hold it (%s)",
    request, job_id, table.concat(types, ", "), table.concat(reasons, "; "))
end

-- Whether an earlier component of this heterogeneous srun was rewritten here: the hook then
-- never sees its gpumem, so a later component the hook refuses for its nodes is refused here.
local het_rewrote = false

-- The earlier components of this het srun that cli_filter.lua left alone (a device without
-- gpumem/gpucore, `--gres=gpu:l40s:1`; their options as it saw them) go through the hook now, in
-- order, so that its het bookkeeping counts their nodes as taken, as slurmctld's hook does.
local function replay(hook, earlier, uid)
  for _, seen in ipairs(earlier or {}) do
    local job = job_of(seen, set_in(seen.set))
    job.het_job_offset = seen.offset
    pcall(run_hook, hook, job, uid)
  end
  for i = #(earlier or {}), 1, -1 do earlier[i] = nil end
end

-- The options of a step with the --gpus-per-node srun inherited from its allocation
-- (SLURM_GPUS_PER_NODE, exported by `salloc --gpus-per-node=1`) left out where the command line
-- gives the step's count in another option (--gpus, --gpus-per-task, a gpu count in --gres): an
-- option on the command line wins over the environment, as srun 24.11 itself drops the inherited
-- --gpus-per-node beside --gpus (_opt_verify: "Specifying --gpus should override
-- SLURM_GPUS_PER_NODE env"). Before, the two counts reached the hook as one request and the step
-- was refused "gpu:1: device count given more than once". The view reads through to the options;
-- nil where nothing is left out. The inherited value is left on the options (an option cannot be
-- unset from here), as srun sends it.
local function without_inherited(options)
  local inherited = os.getenv("SLURM_GPUS_PER_NODE")
  if inherited == nil or text(options, "gpus-per-node") ~= inherited then return nil end
  if typed("^%-%-gpus%-per%-n") ~= false then return nil end  -- typed again, or argv unknown
  local counted = text(options, "gpus") or text(options, "gpus-per-task")
  for item in string.gmatch(text(options, "gres") or "", "[^,]+") do
    counted = counted or string.find(item, "^g?r?e?s?[:/]?gpu[:=]") ~= nil
  end
  if not counted then return nil end
  return setmetatable({}, { __index = function(_, name)
    if name == "gpus-per-node" then return nil end
    return options[name]
  end })
end

-- The srun options with the hook's decision written in (changed in place); a Slurm code.
-- offset: the het component (cli_filter's pack_offset: 0, 1, ... in srun A : B; in an allocation
-- the component --het-group names); earlier: the components before it left alone (`remember`).
local function decide(options, offset, earlier)
  local name, uid = client()
  if name ~= "srun" then return real.SUCCESS end
  local isset = set_options(options)
  local job_id = allocation(options)
  local written = options  -- where the decision is written; read through `options` below
  if job_id then options = without_inherited(options) or options end
  local before = job_of(options, isset)
  if job_id == nil and not counts_known(before, isset) then return real.SUCCESS end
  local hook, why = load_hook()
  if hook == nil then
    debug_log("slurm_hetero cli_filter: %s", why)
    return real.SUCCESS
  end
  local after, lines
  if job_id then
    -- exempt users are left alone, as by the hook
    local rc, _, exempt = run_hook(hook, before, uid)
    if rc == real.SUCCESS and #exempt == 0 then return real.SUCCESS end
    after, lines = decide_step(hook, before, uid, job_id, tonumber(offset), isset)
    if after == nil then
      real.log_error("%s", lines)
      return real.ERROR
    end
    -- a typed --gres or --gpus-per-task beside the untyped --gpus-per-node srun inherited and still
    -- sends: srun refuses it "Invalid GRES specification (with and without type identification)"
    -- (measured on 22.05 and 24.11; a typed --gpus runs on 24.11, which drops the inherited count)
    local inherited = written["gpus-per-node"]
    if options ~= written and not string.find(tostring(inherited), "%a") then
      for _, field in ipairs({ "tres_per_node", "tres_per_task" }) do
        local gpu_type = string.match(after[field] or "", "gpu[:=]([^:=,]+)[:=]%d")
        if gpu_type then
          real.log_error("%s; srun refuses this typed count beside the untyped --gpus-per-node=%s the "
            .. "allocation exported (SLURM_GPUS_PER_NODE): name nodes of %s with -w (a step on one gpu type "
            .. "is written untyped)", lines[1], tostring(inherited), gpu_type)
          return real.ERROR
        end
      end
    end
  else
    offset = tonumber(offset)
    if offset == 0 then het_rewrote = false end
    if offset then before.het_job_offset = offset end
    -- the hosts later components name with -w, which slurmctld keeps this one off
    before.exc_nodes = joined(before.exc_nodes, later_hosts(offset))
    if offset and offset > 0 then replay(hook, earlier, uid) end
    local ok, rc, decided, told = pcall(run_hook, hook, before, uid)
    if not ok then
      debug_log("slurm_hetero cli_filter: %s", tostring(rc))
      return real.SUCCESS
    end
    if rc ~= real.SUCCESS and offset and offset > 0 and het_rewrote then
      real.log_error("%s", told[1] or "refused")
      return real.ERROR
    end
    -- a refusal is the hook's: it returns the specific Slurm error the client prints (here
    -- the client could only say "cli_filter plugin terminated with error")
    if rc ~= real.SUCCESS then return real.SUCCESS end
    if #told == 0 then return real.SUCCESS end  -- untouched, exempt or failed open
    after, lines = decided, told
    before.het_job_offset = nil
    after.het_job_offset = nil
  end
  local set = changes(options, before, after)
  if set == nil then
    real.log_error("%s; srun cannot give the job step these devices with these options: ask %s instead",
                   lines[1], instead(before, after))
    return real.ERROR
  end
  for option, value in pairs(set) do written[option] = value end
  if offset and job_id == nil then het_rewrote = true end
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

-- This srun's het components with a device but no gpumem/gpucore (`srun --gres=gpu:l40s:1 A :
-- --gres=gpumem:20G B`) or a -w (slurmctld excludes its hosts from the other components), for
-- `replay` to count their nodes as taken, as the hook does: srun calls the filter once per
-- component, offset 0 first, and reuses neither options table.
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
