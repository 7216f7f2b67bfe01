--[[
job_submit.lua: slurm-hetero's job_submit hook (Slurm job_submit/lua plugin, Lua 5.1).

Turns memory-sized accelerator requests (gpumem, gpucore) into concrete GRES requests, written
back in the form the request came in (22.05 "gres:gpu:TYPE:N", 24.11 "gres/gpu:TYPE:N" or
"gres/gpu:TYPE=N"); docs/submit-protocol.md has examples. Jobs without gpumem/gpucore are left alone.

Every decision comes from slurm_hetero_tables.lua, read once at load: per job the hook only parses
strings and scans short lists. Python runs this very file through lupa (slurm_hetero/submit/hook.py).
Request errors are rejected with slurm.log_user; anything else (a bad table, a bug) follows the fail
policy.
--]]

-- Baked in by `slurm-hetero job-submit render` (the lines ending in "@render"; keep them so).
local TABLE_ID = nil        -- @render table_id
local FAIL_POLICY = "open"  -- @render fail_policy
local TABLE_PATH = nil      -- @render table_path

local FORMAT = 1            -- the table format this script reads
local FIELDS = { "tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket" }
local IN_PLACE = { tres_per_job = true, tres_per_task = true, tres_per_socket = true }  -- counts keep their scope
-- Slurm's sentinels (slurm.h), as slurmctld reads a job_desc number: NO_VAL16 in a 16-bit field and
-- NO_VAL in a 32-bit one mean unset (INFINITE16 is a count); a memory figure (MiB) is unset only as
-- NO_VAL64 or INFINITE64 without the per-CPU bit, 2^63 as a Lua number (--mem=5000000000 is a request).
local NO_VAL16, NO_VAL = 65534, 4294967294
local MEM_UNSET = 9223372036854775806  -- NO_VAL64 & ~MEM_PER_CPU
local FIELDS16 = { ntasks_per_node = true, cpus_per_task = true, pn_min_cpus = true }  -- uint16_t in job_desc_msg_t
local INTERNAL = "internal error in the slurm_hetero job_submit hook; job rejected, tell your admin"

------------------------------------------------------------------------ logging

-- User text as one line: control characters and backslashes written as \ddd.
local unpack_args = unpack or table.unpack
local function escape_char(c) return string.format("\\%03d", string.byte(c)) end
local function escaped(value)
  local text = tostring(value)
  if not string.find(text, "[%c\\]") then return text end
  return (string.gsub(text, "[%c\\]", escape_char))
end

-- slurmctld's log gets one line per call, escaped, at most 400 bytes of each argument.
local function loggable(value)
  local text = escaped(value)
  if #text > 400 then text = string.sub(text, 1, 400) .. "..." end
  return text
end

local function log(writer, format, ...)
  local args = { ... }
  for i = 1, select("#", ...) do args[i] = loggable(args[i]) end
  writer(format, unpack_args(args, 1, select("#", ...)))
end

-- An outcome's message as told (escaped) and logged (loggable), once per (remembered) outcome.
local function texts(outcome)
  local said = outcome.said
  if said == nil then
    said = escaped(outcome.message)
    outcome.said = said
    outcome.logged = #said > 400 and (string.sub(said, 1, 400) .. "...") or said
  end
  return said, outcome.logged
end

------------------------------------------------------------------------ the table, loaded once

-- Returns the table, or nil and why not.
local function load_table()
  local path = TABLE_PATH
  if path == nil then  -- beside this script (slurmctld loads it from the directory of slurm.conf)
    local info = debug and debug.getinfo and debug.getinfo(1, "S")
    local source = info and info.source or ""
    local dir = string.sub(source, 1, 1) == "@" and string.match(string.sub(source, 2), "^(.*)/[^/]*$")
    path = (dir or ".") .. "/slurm_hetero_tables.lua"
  end
  local ok, data = pcall(dofile, path)
  if not ok then return nil, "cannot load " .. path .. ": " .. tostring(data) end
  if type(data) ~= "table" or data.format ~= FORMAT then
    return nil, path .. " is not a format " .. FORMAT .. " table; render it again"
  end
  if TABLE_ID ~= nil and data.id ~= TABLE_ID then
    return nil, path .. " has id " .. tostring(data.id) .. ", this script expects " .. TABLE_ID
      .. "; render both again"
  end
  return data, nil
end

local T, LOAD_ERROR = load_table()
if T then
  log(slurm.log_info, "slurm_hetero: loaded decision table %s", tostring(T.id))
else
  log(slurm.log_error, "slurm_hetero: %s (fail policy %s)", LOAD_ERROR, FAIL_POLICY)
end

-------------------------------------------------------------------------------- small helpers

-- Like Python's str.split(sep) for a one-character separator: "a,,b" -> {"a", "", "b"}.
local function split(text, sep)
  local out, start = {}, 1
  while true do
    local at = string.find(text, sep, start, true)
    if not at then
      out[#out + 1] = string.sub(text, start)
      return out
    end
    out[#out + 1] = string.sub(text, start, at - 1)
    start = at + 1
  end
end

local function is_digits(text)
  return text ~= nil and string.find(text, "^[0-9]+$") ~= nil
end

-- ceil(a / b) for whole numbers, exact for doubles below 2^53.
local function ceil_div(a, b)
  local rest = math.fmod(a, b)
  return (a - rest) / b + (rest > 0 and 1 or 0)
end

local function fmt(key, ...)
  return string.format(T.messages[key], ...)
end

-- A size as Slurm writes it: "80G" when whole GiB, else "46068M".
local function size_text(mib)
  if math.fmod(mib, 1024) == 0 then return string.format("%.0fG", mib / 1024) end
  return string.format("%.0fM", mib)
end

-- mib rounded up to whole GiB when that still fits in limit, else exact in MiB.
local function size_up(mib, limit)
  local gib = ceil_div(mib, 1024)
  if gib * 1024 <= limit then return gib .. "G" end
  return mib .. "M"
end

-- A rejection travels as error({reject = message, code = KEY}) up to evaluate(); other errors are
-- bugs. KEY names the Slurm error in T.reject_codes: "request" (grammar) unless given.
local function reject(message, code)
  error({ reject = message, code = code or "request" }, 0)
end

-- A rejection as an outcome (code: the key of its Slurm error, error_code).
local function refusal(message, code)
  return { action = "reject", message = message, code = code }
end

-- The outcome of a rejection caught by pcall; any other error goes on up.
local function rejected(err)
  if type(err) == "table" and err.reject then return refusal(err.reject, err.code) end
  error(err, 0)
end

---------------------------------------------------------------------------- -x host lists

-- One item of a hostlist ("n[1-3,05]x"): its segments (text, or ranges { low, high, format }), how
-- many names it stands for and its shortest name's length; nil where ClusterShell refuses it (1 to 9
-- digits, low <= high, a leading 0 only beside a bound as long, no bracket right after one).
local function hostlist_item(item)
  local segments, names, at, shortest = {}, 1, 1, 0
  while true do
    local open, close, body = string.find(item, "%[([^%[%]]*)%]", at)
    if open == nil then break end
    if open == at and type(segments[#segments]) == "table" then return nil end  -- "][": ClusterShell refuses it
    if open > at then segments[#segments + 1] = string.sub(item, at, open - 1) end
    local ranges, total, narrowest = {}, 0, math.huge
    for _, part in ipairs(split(body, ",")) do
      local low, high = string.match(part, "^([0-9]+)%-([0-9]+)$")
      if low == nil then
        low = string.match(part, "^([0-9]+)$")
        high = low
      end
      if low == nil or #low > 9 or #high > 9 then return nil end
      local a, b = tonumber(low), tonumber(high)
      -- as ClusterShell's RangeSet: a low bound pads with a leading 0 (also "00"), a high one unless 0
      local padded = #low > 1 and string.byte(low) == 48
      if (padded or (b ~= 0 and string.byte(high) == 48)) and #low ~= #high then return nil end
      if a > b then return nil end
      ranges[#ranges + 1] = { a, b, padded and ("%0" .. #low .. "d") or "%d" }
      total = total + b - a + 1
      narrowest = math.min(narrowest, padded and #low or #tostring(a))
    end
    segments[#segments + 1] = ranges
    names = names * total
    shortest = shortest + narrowest + open - at
    at = close + 1
  end
  if at <= #item then segments[#segments + 1] = string.sub(item, at) end
  return segments, names, shortest + #item - at + 1
end

-- Slurm's separators between hostlist items (22.05: `-x ',a100n1, l40sn1'`; empty items skipped)
local HOST_SEPARATORS = { [","] = true, [" "] = true, ["\t"] = true, ["\n"] = true }

-- The host names of a hostlist expression ("a1,b[1-3,5]"), or nil when it is malformed or names more
-- than limit hosts (counted before expanding, so the work is bounded). Items whose names are all
-- longer than longest are not expanded: they name no known host, and could build megabytes of text.
local function hostlist_names(spec, limit, longest)
  if #spec > T.limits.max_hostlist or not string.find(spec, "^[A-Za-z0-9_.%-%[%], \t\n]*$") then return nil end
  local items, depth, start = {}, 0, 1
  for i = 1, #spec do
    local c = string.sub(spec, i, i)
    if c == "[" then
      depth = depth + 1
      if depth > 1 then return nil end
    elseif c == "]" then
      depth = depth - 1
      if depth < 0 then return nil end
    elseif HOST_SEPARATORS[c] then
      if depth == 0 then
        items[#items + 1] = string.sub(spec, start, i - 1)
        start = i + 1
      elseif c ~= "," then
        return nil
      end
    end
  end
  if depth ~= 0 then return nil end
  items[#items + 1] = string.sub(spec, start)
  local parsed, total = {}, 0
  for _, item in ipairs(items) do
    if item ~= "" then
      local segments, names, shortest = hostlist_item(item)
      if segments == nil then return nil end
      total = total + names
      if total > limit then return nil end
      if shortest <= longest then parsed[#parsed + 1] = segments end
    end
  end
  local out = {}
  for _, segments in ipairs(parsed) do
    local names = { "" }
    for _, segment in ipairs(segments) do
      local longer = {}
      for _, name in ipairs(names) do
        if type(segment) == "string" then
          longer[#longer + 1] = name .. segment
        else
          for _, range in ipairs(segment) do
            for n = range[1], range[2] do longer[#longer + 1] = name .. string.format(range[3], n) end
          end
        end
      end
      names = longer
    end
    for _, name in ipairs(names) do out[#out + 1] = name end
  end
  return out
end

-- Host name -> { {type, shape index}, ... } of the table's shapes, built on the first job with -x.
local HOST_SHAPES, LONGEST_HOST = nil, 0
local function host_shapes()
  if HOST_SHAPES then return HOST_SHAPES end
  local map, longest = {}, 0
  for name, facts in pairs(T.types) do
    for index, shape in ipairs(facts.shapes) do
      local hosts = (shape.hosts or "") == "" and {} or hostlist_names(shape.hosts, math.huge, math.huge)
      if hosts == nil then error("bad hostlist in the table: " .. tostring(shape.hosts), 0) end
      for _, host in ipairs(hosts) do
        local at = map[host] or {}
        map[host] = at
        at[#at + 1] = { name, index }
        longest = math.max(longest, #host)
      end
    end
  end
  HOST_SHAPES, LONGEST_HOST = map, longest
  return map
end

-- Per type, the nodes of each shape ({ [type] = { [index] = n } }) that the -x spec and the set
-- `also` name, each once, and whether any; nil for an -x the hook cannot read (unknown: slurmctld's).
local function excluded(spec, also)
  local by_host = host_shapes()
  local hosts = {}
  if (spec or "") ~= "" then
    hosts = hostlist_names(spec, T.limits.max_excluded, LONGEST_HOST)
    if hosts == nil then return nil end
  end
  local seen, out, any = {}, {}, false
  local function count(host)
    if seen[host] then return end
    seen[host] = true
    for _, at in ipairs(by_host[host] or {}) do
      local counts = out[at[1]] or {}
      out[at[1]] = counts
      counts[at[2]] = (counts[at[2]] or 0) + 1
      any = true
    end
  end
  for _, host in ipairs(hosts) do count(host) end
  for host in pairs(also or {}) do count(host) end
  return out, any
end

-- Why the hook cannot read this -x, shown shortened before any byte of a multi-byte character.
local function exclude_refusal(spec)
  local shown = spec
  if #spec > T.limits.shown then
    shown = (string.gsub(string.sub(spec, 1, T.limits.shown), "[\128-\255]+$", "")) .. "..."
  end
  if #spec > T.limits.max_hostlist then
    return fmt("exclude_long", shown, #spec, T.limits.max_hostlist)
  end
  return fmt("exclude_bad", shown, T.limits.max_excluded)
end

-- The hosts a -w hostlist names that the table knows (of type name, when given), as a set, and
-- how many; none for a list the hook cannot read (slurmctld's to refuse).
local function named_hosts(spec, name)
  local set, count = {}, 0
  if (spec or "") == "" then return set, count end
  local by_host = host_shapes()
  for _, host in ipairs(hostlist_names(spec, T.limits.max_excluded, LONGEST_HOST) or {}) do
    local known = false
    for _, at in ipairs(by_host[host] or {}) do
      if name == nil or at[1] == name then known = true end
    end
    if known and not set[host] then
      set[host] = true
      count = count + 1
    end
  end
  return set, count
end

------------------------------------------------------------------------- the request grammar

-- The TRES items of a field: "gres:gpumem:20G" -> prefix "gres:" (22.05; "gres/" later, "" for
-- --gres text), body "gpumem:20G", name "gpumem".
local function items_of(text)
  local items = {}
  if text == nil or text == "" then return items end
  for _, piece in ipairs(split(text, ",")) do
    local head = string.sub(piece, 1, 5)
    local prefix = (head == "gres:" or head == "gres/") and head or ""
    local body = string.sub(piece, #prefix + 1)
    items[#items + 1] = { text = piece, prefix = prefix, body = body, name = string.match(body, "^[^:=]*") }
  end
  return items
end

local function is_ours(name)
  return name == "gpu" or name == "gpumem" or name == "gpucore"
end

-- The ':'-separated tokens before the first '=' and the text after it (nil without '=').
local function tokens_of(item)
  local at = string.find(item.body, "=", 1, true)
  if not at then return split(item.body, ":"), nil end
  return split(string.sub(item.body, 1, at - 1), ":"), string.sub(item.body, at + 1)
end

-- Reject an item: "ITEM: REASON".
local function bad(item, key, ...)
  reject(item.body .. ": " .. string.format(T.request_messages[key], ...))
end

-- "20G" -> 20480 MiB; digits with an optional M/G/T (either case); a bare number is MiB.
local function parse_size(value, item)
  local digits, suffix = string.match(value, "^([0-9]+)([MGTmgt]?)$")
  if digits then
    if #digits > T.limits.max_digits then bad(item, "size_too_large") end
    local mib = tonumber(digits) * T.units[string.upper(suffix)]
    if mib == 0 then bad(item, "size_not_positive") end
    if mib > T.limits.max_mib then bad(item, "size_too_large") end
    return mib
  end
  if value == "" then bad(item, "size_missing") end
  if string.find(value, "^%-[0-9]+[A-Za-z]*$") then bad(item, "size_not_positive") end
  local letters = string.match(value, "^[0-9]+([A-Za-z]+)$")
  if letters then bad(item, "size_suffix", letters) end
  bad(item, "size_not_number")
end

-- gpumem:SIZE or gpumem=SIZE
local function parse_gpumem(item)
  local tokens, value = tokens_of(item)
  if value == nil then
    if #tokens == 1 then bad(item, "size_missing") end
    if #tokens > 2 then bad(item, "mem_malformed") end
    value = tokens[2]
  elseif #tokens > 1 then
    bad(item, "mem_malformed")
  end
  return parse_size(value, item)
end

-- gpucore:P or gpucore=P, P a whole percent 1..100
local function parse_gpucore(item)
  local tokens, value = tokens_of(item)
  if value == nil then
    value = (#tokens == 2) and tokens[2] or ""
  elseif #tokens > 1 then
    value = ""
  end
  if not is_digits(value) or #value > 3 then bad(item, "core_bad") end
  local percent = tonumber(value)
  if percent < 1 or percent > 100 then bad(item, "core_bad") end
  return percent
end

-- gpu, gpu:N, gpu:TYPE, gpu:TYPE:N, gpu=N, gpu:TYPE=N -> type (or nil), count
local function parse_gpu(item)
  local tokens, value = tokens_of(item)
  if #tokens > (value and 2 or 3) then bad(item, "gpu_malformed") end
  for i = 2, #tokens do
    if tokens[i] == "" then bad(item, "gpu_malformed") end
  end
  local gpu_type, count = tokens[2], value
  if value == nil and #tokens == 3 then count = tokens[3] end
  -- a count may carry Slurm's K..P suffix (`gpu:2k` is 2048 devices, not a type "2k"): no count here
  if value == nil and #tokens == 2 and string.find(tokens[2], "^%d+[KkMmGgTtPp]?$") then
    gpu_type, count = nil, tokens[2]
  end
  if gpu_type and not string.find(gpu_type, "^[A-Za-z0-9_.%-]+$") then bad(item, "gpu_malformed") end
  if count == nil then return gpu_type, 1 end
  if not is_digits(count) or #count > 4 or tonumber(count) == 0 then bad(item, "count_bad") end
  return gpu_type, tonumber(count)
end

-- Add one of our items to the request being gathered.
local function add(req, field, item)
  req.shown[#req.shown + 1] = item.body
  if item.name == "gpu" then
    if req.gpu_field then bad(item, "count_twice") end
    local gpu_type, count = parse_gpu(item)
    if gpu_type and not T.types[gpu_type] then
      reject(item.body .. ": " .. fmt("unknown_type", gpu_type, T.type_list))
    end
    req.gpu_type, req.count, req.gpu_field = gpu_type, count, field
    return
  end
  if req[item.name] then bad(item, "duplicate") end
  req.memory_items[#req.memory_items + 1] = item.body
  if item.name == "gpumem" then req.gpumem = parse_gpumem(item) else req.gpucore = parse_gpucore(item) end
  -- how the answer is written: "22.05" gres:gpu:T:N, "24.11" gres/gpu:T:N, "slash" gres/gpu:T=N
  if req.form == nil then
    req.form = item.prefix ~= "gres/" and "22.05" or string.find(item.body, "=", 1, true) and "slash" or "24.11"
  end
end

-- The request from all four TRES fields, items checked in order (the first bad one rejects).
local function gather(job_desc)
  local req = { shown = {}, memory_items = {}, fields = {}, count = 1 }
  for _, field in ipairs(FIELDS) do
    req.fields[field] = items_of(job_desc[field])
    for _, item in ipairs(req.fields[field]) do
      if is_ours(item.name) then add(req, field, item) end
    end
  end
  req.form = req.form or "22.05"
  return req
end

-- Cheap first look: a gpumem or gpucore item in any field (names_only: named at all)? No table.
local function asks_us(job_desc, names_only)
  for i = 1, #FIELDS do
    local text = job_desc[FIELDS[i]]
    -- most jobs name neither: no parsing for them
    if text and (string.find(text, "gpumem", 1, true) or string.find(text, "gpucore", 1, true)) then
      if names_only then return true end
      for _, item in ipairs(items_of(text)) do
        if item.name == "gpumem" or item.name == "gpucore" then return true end
      end
    end
  end
  return false
end

------------------------------------------------------------------ the --constraint grammar

-- Slurm's --constraint grammar as alternatives (several only for a matching OR [a|b]), each an OR
-- (list) of AND-sets ({ [feature] = true }). Counts (*N) and anything unreadable reject the job.
local MAX_TERMS = 64
local MAX_DEPTH = 1  -- of parentheses, slurmctld's; checked before the parser recurses
local BAD = {}
local TOO_MANY = {}  -- more than MAX_TERMS AND-sets: its own message (constraint_terms)

local function union(a, b)
  local out = {}
  for k in pairs(a) do out[k] = true end
  for k in pairs(b) do out[k] = true end
  return out
end

local function c_and(left, right)
  local out, terms = {}, 0
  for _, x in ipairs(left) do
    for _, y in ipairs(right) do
      local dnf = {}
      for _, a in ipairs(x) do
        for _, b in ipairs(y) do dnf[#dnf + 1] = union(a, b) end
      end
      terms = terms + #dnf
      out[#out + 1] = dnf
    end
  end
  if terms > MAX_TERMS then error(TOO_MANY, 0) end
  return out
end

local function constraint_parser(tokens)
  local p = { at = 1, brackets = 0 }
  local function peek() return tokens[p.at] end
  local function take()
    local token = tokens[p.at]
    if token == nil then error(BAD, 0) end
    p.at = p.at + 1
    return token
  end
  local either
  local function factor()
    local token = take()
    if token == "(" then
      local value = either()
      if take() ~= ")" then error(BAD, 0) end
      return value
    end
    if token == "[" then
      p.brackets = p.brackets + 1
      if p.brackets > 1 then error(BAD, 0) end
      local inner = either()
      if take() ~= "]" or #inner ~= 1 then error(BAD, 0) end
      local out = {}
      for _, term in ipairs(inner[1]) do out[#out + 1] = { term } end
      return out
    end
    if token == "&" or token == "|" or token == ")" or token == "]" then error(BAD, 0) end
    return { { { [token] = true } } }
  end
  local function both()
    local value = factor()
    while peek() == "&" do
      take()
      value = c_and(value, factor())
    end
    return value
  end
  either = function()
    local value = both()
    while peek() == "|" do
      take()
      local other = both()
      if #value ~= 1 or #other ~= 1 then error(BAD, 0) end
      if #value[1] + #other[1] > MAX_TERMS then error(TOO_MANY, 0) end
      local dnf = {}
      for _, t in ipairs(value[1]) do dnf[#dnf + 1] = t end
      for _, t in ipairs(other[1]) do dnf[#dnf + 1] = t end
      value = { dnf }
    end
    return value
  end
  local value = either()
  if peek() ~= nil then error(BAD, 0) end
  return value
end

local function parse_constraint(text)
  local where = "--constraint=" .. text .. ": "
  if string.find(text, "*", 1, true) then reject(where .. T.messages.constraint_counts, "constraint") end
  local tokens, rest = {}, text
  while rest ~= "" do
    local name = string.match(rest, "^[A-Za-z0-9_.%-]+")
    local token = name or string.match(rest, "^[&|()%[%]]")
    if token == nil then reject(where .. T.messages.constraint_bad, "constraint") end
    tokens[#tokens + 1] = token
    rest = string.sub(rest, #token + 1)
  end
  local depth, deepest = 0, 0
  for _, token in ipairs(tokens) do
    if token == "(" then depth = depth + 1 elseif token == ")" then depth = depth - 1 end
    if depth > deepest then deepest = depth end
  end
  if deepest > MAX_DEPTH then reject(where .. fmt("constraint_deep", MAX_DEPTH), "constraint") end
  local ok, value = pcall(constraint_parser, tokens)
  if not ok then
    if value == BAD then reject(where .. T.messages.constraint_bad, "constraint") end
    if value == TOO_MANY then reject(where .. fmt("constraint_terms", MAX_TERMS), "constraint") end
    error(value, 0)
  end
  return value
end

-- The constraint as alternatives, and whether it is complex (anything but a plain "a&b", which is
-- read without the parser): the hook neither filters on nor extends a complex one.
local function constraint_match(features)
  local set = {}
  if features == nil or features == "" then return { { set } }, false end
  for _, name in ipairs(split(features, "&")) do
    if not string.find(name, "^[A-Za-z0-9_.%-]+$") then return parse_constraint(features), true end
    set[name] = true
  end
  return { { set } }, false
end

-- Whether a node's features satisfy one alternative (an OR of AND-sets).
local function satisfies(dnf, features)
  for _, term in ipairs(dnf) do
    local all = true
    for name in pairs(term) do
      if not features[name] then all = false break end
    end
    if all then return true end
  end
  return false
end

---------------------------------------------------------------------------- fit and ranking

local function matches(shape, match)
  for _, alt in ipairs(match) do
    if satisfies(alt, shape.features) then return true end
  end
  return false
end

-- Most devices of a type on one node satisfying the constraint (0: no such node).
local function max_per_node(facts, match)
  local best = 0
  for _, shape in ipairs(facts.shapes) do
    if shape.count > best and matches(shape, match) then best = shape.count end
  end
  return best
end

-- Whether a node of the shape has the CPUs and memory each node of the job needs (0: unknown).
local function holds(shape, need)
  return (shape.cpus == 0 or shape.cpus >= need.cpus) and (shape.mem == 0 or shape.mem >= need.node_mem)
end

-- Nodes with at least count devices of a type and the CPUs and memory the job needs per node, on the
-- best alternative (a matching OR puts every node on one); less_excluded: less the nodes -x excludes.
local function nodes_with(facts, need, count, less_excluded)
  local best = 0
  local gone = less_excluded and need.excluded[facts.name] or nil
  for _, alt in ipairs(need.match) do
    local total = 0
    for index, shape in ipairs(facts.shapes) do
      if shape.count >= count and holds(shape, need) and satisfies(alt, shape.features) then
        total = total + shape.nodes - (gone and gone[index] or 0)
      end
    end
    if total > best then best = total end
  end
  return best
end

-- nodes_with less the nodes -x excludes and those earlier het components take (never shared).
local function free_nodes(facts, need, count)
  return nodes_with(facts, need, count, true) - (need.taken[facts.name] or 0)
end

-- The limit that nodes of the type with enough devices fall short of: their most CPUs, else their
-- most memory (among those with the CPUs).
local function node_limit(facts, need)
  local cpus, mem = 0, 0
  for _, shape in ipairs(facts.shapes) do
    if shape.count >= need.each and matches(shape, need.match) then
      local have = shape.cpus == 0 and math.huge or shape.cpus
      if have > cpus then cpus = have end
    end
  end
  if need.cpus > cpus then return fmt("node_cpus", facts.name, need.each, cpus, need.cpus) end
  for _, shape in ipairs(facts.shapes) do
    if shape.count >= need.each and matches(shape, need.match) and (shape.cpus == 0 or shape.cpus >= need.cpus) then
      local have = shape.mem == 0 and math.huge or shape.mem
      if have > mem then mem = have end
    end
  end
  return fmt("node_memory", facts.name, need.each, size_text(mem), size_text(need.node_mem))
end

-- The first check a type fails (a reason code), or nil when it takes the request.
local function reason(facts, need, allowed)
  if not allowed[facts.name] then return "TYPE_EXCLUDED" end
  local per_node = max_per_node(facts, need.match)
  if per_node == 0 then return "MISSING_FEATURE" end
  if need.gpumem and facts.mem < need.gpumem then return "INSUFFICIENT_MEMORY" end
  if per_node < need.each then return "TOO_FEW_DEVICES" end
  if (need.cpus > 0 or need.node_mem > 0) and nodes_with(facts, need, need.each) == 0 then return "NODE_TOO_SMALL" end
  if (need.nodes > 1 or need.het or need.excl) and free_nodes(facts, need, need.each) < need.nodes then return "TOO_FEW_NODES" end
  return nil
end

-- The first name of the job's partition list ("a,b") that the table does not know, "" for a list
-- naming none (","), else nil. Empty names are skipped, as slurmctld skips them.
local function unknown_partition(partition)
  if partition == nil then return nil end
  local any = false
  for name in string.gmatch(partition, "[^,]+") do
    if T.partitions[name] == nil and name ~= T.default_partition then return name end
    any = true
  end
  return (not any) and "" or nil
end

-- The rule of each partition the job lists (none: the default partition), in order.
local function rules_for(partition)
  local rules, seen = {}, {}
  for name in string.gmatch(partition or T.default_partition or "", "[^,]+") do
    if not seen[name] then
      seen[name] = true
      rules[#rules + 1] = T.partitions[name] or T.default
    end
  end
  if #rules == 0 then rules[1] = T.default end
  return rules
end

-- Rules of a partition list as one: the first one's policy and mode, the types any allows, the
-- vendor scopes together (none when one of them has none).
local function joined(rules)
  if #rules == 1 then return rules[1] end
  local allowed, vendors, every = {}, {}, true
  for _, rule in ipairs(rules) do
    for name in pairs(rule.allowed) do allowed[name] = true end
    if next(rule.vendors or {}) == nil then every = false end
    for vendor in pairs(rule.vendors or {}) do vendors[vendor] = true end
  end
  return { policy = rules[1].policy, mode = rules[1].mode, allowed = allowed, vendors = every and vendors or {} }
end

-- The rule a request decides with: for a bare one (no gpu TYPE, no feature in -C that only one
-- vendor's nodes carry) the allowed types of the rule's vendor scope; else the rule without one.
local function scoped(rule, need)
  local vendors = rule.vendors or {}
  local applies = next(vendors) ~= nil and need.gpu_type == nil
  if applies then
    for name in pairs(need.named) do
      if (T.vendor_features or {})[name] then applies = false break end
    end
  end
  if not applies then return { policy = rule.policy, mode = rule.mode, allowed = rule.allowed, vendors = {} } end
  local allowed = {}
  for name in pairs(rule.allowed) do
    if vendors[T.types[name].vendor] then allowed[name] = true end
  end
  return { policy = rule.policy, mode = rule.mode, allowed = allowed, vendors = vendors }
end

-- The "scope" note of a rewrite under a vendor scope (the scope, the vendors left out), or nil.
local function scope_note(unscoped, rule)
  if next(rule.vendors) == nil then return nil end
  local scope, others, seen = {}, {}, {}
  for vendor in pairs(rule.vendors) do scope[#scope + 1] = vendor end
  for name in pairs(unscoped.allowed) do
    local vendor = T.types[name].vendor
    if not rule.vendors[vendor] and not seen[vendor] then
      seen[vendor] = true
      others[#others + 1] = vendor
    end
  end
  table.sort(scope)
  table.sort(others)
  return fmt("scope", table.concat(scope, ","), table.concat(others, " or -C "))
end

local function order_for(policy, count)
  return T.orders[policy][count > 1 and "multi" or "single"]
end

-- Shards of one device covering gpumem (shard_mib each) and gpucore (at least 1).
local function shards(facts, need)
  local by_memory = need.gpumem and ceil_div(need.gpumem, facts.shard_mib) or 1
  local by_core = need.gpucore and ceil_div(need.gpucore * facts.shares, 100) or 1
  return math.max(by_memory, by_core, 1)
end

-- Below a whole device, on a type with shards: a shard choice; else nil.
local function shard_choice(need, adequate, rule)
  if need.explicit_count or need.complex or (need.gpucore or 0) >= 100 then return nil end
  for _, name in ipairs(adequate) do
    local facts = T.types[name]
    if facts.shares > 0 then
      local count = shards(facts, need)
      if count >= facts.shares then return nil end
      return { kind = "shard", types = { name }, count = count, policy = rule.policy,
               constraint = { facts.feature } }
    end
  end
  return nil
end

-- Whole devices: the first adequate type, or (any-fit) all of them as a constraint.
local function whole_choice(need, adequate, rule)
  if rule.mode == "any-fit" and need.gpu_type == nil and not need.complex then
    local constraint, seen = {}, {}
    for _, name in ipairs(adequate) do
      local feature = T.types[name].feature
      if not seen[feature] then
        seen[feature] = true
        constraint[#constraint + 1] = feature
      end
    end
    return { kind = "any", types = adequate, count = need.count, policy = rule.policy, constraint = constraint }
  end
  return { kind = "gpu", types = { adequate[1] }, count = need.count, policy = rule.policy, constraint = {} }
end

--------------------------------------------------------------------- why not, and what would

local function counts_text(counts)
  local parts = {}
  for _, code in ipairs(T.codes) do
    local n = counts[code] or 0
    if n > 0 then parts[#parts + 1] = n .. " " .. T.labels[code] end
  end
  return table.concat(parts, ", ")
end

local function headline(need, rule, usable, counts)
  if need.gpu_type then
    local facts = T.types[need.gpu_type]
    local code = reason(facts, need, rule.allowed)
    if code == "TYPE_EXCLUDED" then return fmt("type_excluded", facts.name) end
    if code == "MISSING_FEATURE" then return fmt("type_features", facts.name) end
    if code == "INSUFFICIENT_MEMORY" then return fmt("type_memory", facts.name, facts.size) end
    if code == "TOO_FEW_NODES" then
      return fmt("type_nodes", facts.name, free_nodes(facts, need, need.each), need.each, need.nodes)
    end
    if code == "NODE_TOO_SMALL" then return node_limit(facts, need) end
    return fmt("type_count", facts.name, max_per_node(facts, need.match))
  end
  local largest = nil
  for _, name in ipairs(usable) do
    local facts = T.types[name]
    if largest == nil or facts.mem > largest.mem
        or (facts.mem == largest.mem and facts.rank < largest.rank) then
      largest = facts
    end
  end
  if need.gpumem and largest and largest.mem < need.gpumem then
    return fmt("largest", largest.name, largest.size)
  end
  return fmt("none_fit", counts_text(counts))
end

-- With a gpu TYPE that fails: another type that takes the same request.
local function would_fit(need, usable, usable_set)
  for _, name in ipairs(usable) do
    if name ~= need.gpu_type and reason(T.types[name], need, usable_set) == nil then
      local extra = ""
      for _, text in ipairs(need.memory_items) do extra = extra .. "," .. text end
      return fmt("would_fit", name, need.count, extra)
    end
  end
  return nil
end

-- The same memory spread over more devices (k), on the first type (multi order) that holds it; a
-- request that names a type hears of that type only, and keeps it.
local function split_hint(need, usable_set, rule, most)
  if not need.gpumem or need.each ~= need.count then return nil end
  local names = need.gpu_type and { need.gpu_type } or order_for(rule.policy, 2)
  for k = need.count + 1, most do
    local per = ceil_div(need.count * need.gpumem, k)
    for _, name in ipairs(names) do
      local facts = T.types[name]
      if usable_set[name] and facts.mem >= per and free_nodes(facts, need, k) >= need.nodes then
        return fmt("split", k, need.gpu_type and (name .. ":" .. k) or k, size_up(per, facts.mem))
      end
    end
  end
  return nil
end

-- The type (first in order) with the most nodes, for a job that fails only on its node count; a
-- job that names a type (or holds one, an edit) hears of that type only.
local function nodes_hint(need, usable, usable_set)
  local best, best_name = 0, nil
  for _, name in ipairs(need.gpu_type and { need.gpu_type } or usable) do
    local facts = T.types[name]
    if reason(facts, need, usable_set) == "TOO_FEW_NODES" then
      local found = free_nodes(facts, need, need.each)
      if best_name == nil or found > best then best, best_name = found, name end
    end
  end
  if best_name == nil then return nil end
  local per_node = need.tasks_per_node
  if per_node then return fmt("nodes_tasks", best, need.each, best_name, best, best * per_node, per_node) end
  return fmt("nodes", best, need.each, best_name, best)
end

-- Nodes per type for messages ("a100_80g:1, l40s:1"); a per-shape count (need.excluded) is summed.
local function per_type(counts)
  local names, parts = {}, {}
  for name in pairs(counts) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local sum = counts[name]
    if type(sum) == "table" then
      sum = 0
      for _, n in pairs(counts[name]) do sum = sum + n end
    end
    parts[#parts + 1] = name .. ":" .. sum
  end
  return table.concat(parts, ", ")
end

-- What would fit (or why not, beyond the headline). A request that names a type hears of other
-- types only as one that takes the very same request (would_fit): its device counts are its type's.
local function hint(need, rule, usable, usable_set)
  if #usable == 0 then return nil end
  local most, most_name = 0, nil
  for _, name in ipairs(need.gpu_type and { need.gpu_type } or usable) do
    local per_node = max_per_node(T.types[name], need.match)
    if per_node > most then most, most_name = per_node, name end
  end
  local small = nil  -- the first type whose nodes are too small for the job's CPUs or memory
  for _, name in ipairs(usable) do
    if reason(T.types[name], need, usable_set) == "NODE_TOO_SMALL" then
      small = name
      break
    end
  end
  local text = need.gpu_type and would_fit(need, usable, usable_set) or nil
  if text == nil and (need.het or need.excl) then
    for _, name in ipairs(usable) do
      if reason(T.types[name], need, usable_set) == "TOO_FEW_NODES" then
        if not need.het then return fmt("excluded", per_type(need.excluded)) end
        if need.excl then  -- both took nodes (adversarial A21): say both
          return fmt("het_nodes_excluded", per_type(need.taken), per_type(need.excluded))
        end
        return fmt("het_nodes", per_type(need.taken))
      end
    end
  end
  if small then
    if text == nil and not need.gpu_type then text = node_limit(T.types[small], need) end
    return text
  end
  text = text or split_hint(need, usable_set, rule, most)
  local said = need.gpu_type and reason(T.types[need.gpu_type], need, usable_set) == "TOO_FEW_DEVICES"
  -- most_name nil: no node of the named type has the features (that is the headline)
  if text == nil and most_name and need.each > most and not said then text = fmt("per_node", most, most_name) end
  if text == nil and need.nodes > 1 then text = nodes_hint(need, usable, usable_set) end
  return text
end

-- For a request the vendor scope left without a fit: the first type of another vendor that takes it.
local function other_vendor(need, rule, unscoped)
  if next(rule.vendors) == nil then return nil end
  for _, name in ipairs(order_for(rule.policy, need.each)) do
    local facts = T.types[name]
    if not rule.vendors[facts.vendor] and reason(facts, need, unscoped.allowed) == nil then
      return fmt("other_vendor", name, facts.vendor, facts.vendor)
    end
  end
  return nil
end

-- "REQUEST: HEADLINE[; HINT]", and the key of its Slurm error: the furthest check any type failed.
local function report(need, rule, candidates, unscoped)
  local counts, furthest = {}, "request"
  for _, name in ipairs(candidates) do
    local code = reason(T.types[name], need, rule.allowed)
    counts[code] = (counts[code] or 0) + 1
  end
  for _, code in ipairs(T.codes) do
    if (counts[code] or 0) > 0 then furthest = code end
  end
  local usable, usable_set = {}, {}
  for _, name in ipairs(order_for(rule.policy, need.each)) do
    if rule.allowed[name] and max_per_node(T.types[name], need.match) > 0 then
      usable[#usable + 1] = name
      usable_set[name] = true
    end
  end
  local message = need.request .. ": " .. headline(need, rule, usable, counts)
  local extra = other_vendor(need, rule, unscoped) or hint(need, rule, usable, usable_set)
  if extra then message = message .. "; " .. extra end
  return message, furthest
end

-- The decision: a choice, or nil, the rejection message and its error key.
local function decide(need)
  local rules, each = rules_for(need.partition), {}
  for i, r in ipairs(rules) do each[i] = scoped(r, need) end
  local unscoped, rule = joined(rules), joined(each)
  local candidates = need.gpu_type and { need.gpu_type } or order_for(rule.policy, need.each)
  -- an edit of a job holding a type, whose -x Slurm does not show the hook: that type when it fits
  if need.prefer and not need.gpu_type and T.types[need.prefer]
      and reason(T.types[need.prefer], need, rule.allowed) == nil then
    candidates = { need.prefer }
  end
  local adequate = {}
  for _, name in ipairs(candidates) do
    if reason(T.types[name], need, rule.allowed) == nil then adequate[#adequate + 1] = name end
  end
  if #adequate == 0 then
    local message, code = report(need, rule, candidates, unscoped)
    return nil, message, code
  end
  local choice = shard_choice(need, adequate, rule) or whole_choice(need, adequate, rule)
  choice.scope = scope_note(unscoped, rule)
  return choice
end

---------------------------------------------------------------------------------- rewriting

local function new_item(choice, form)
  local template = T.item_forms[choice.kind][form]
  if choice.kind == "gpu" then return string.format(template, choice.types[1], choice.count) end
  return string.format(template, choice.count)
end

-- New values of the four TRES fields: the gpu item and (unless sharing) gpumem/gpucore removed,
-- the new item first in tres_per_node (or where the count came from, for per-task/socket).
local function new_fields(req, choice, item)
  local target = IN_PLACE[req.gpu_field or ""] and req.gpu_field or "tres_per_node"
  local out = {}
  for _, field in ipairs(FIELDS) do
    local kept = (field == target) and { item } or {}
    for _, old in ipairs(req.fields[field]) do
      -- empty items (24.11's `--gres=gpumem:20G,,`) go too, and shard items: the new item replaces
      -- them (a request cli_filter.lua already rewrote is decided again to the same)
      if not (old.name == "gpu" or old.name == "shard" or (is_ours(old.name) and choice.kind ~= "shard")
              or old.body == "") then
        kept[#kept + 1] = old.text
      end
    end
    out[field] = table.concat(kept, ",")
  end
  return out
end

-- The job's constraint AND one of the choice's features (unchanged when already its last term).
local function new_features(features, constraint)
  if #constraint == 0 then return nil end
  local either = table.concat(constraint, "|")
  if features == nil or features == "" then return either end
  local tail = (#constraint == 1) and ("&" .. either) or ("&(" .. either .. ")")
  -- already there (cli_filter.lua made the same decision): unchanged
  if features == either or string.sub(features, -#tail) == tail then return features end
  return features .. tail
end

local function note(req, choice, item)
  local text
  if choice.kind == "any" then
    text = fmt("rewrite_any", req.text, item, table.concat(choice.constraint, "|"), choice.policy)
  elseif choice.kind == "shard" then
    text = fmt("rewrite_shard", req.text, item, choice.constraint[1], choice.policy, choice.types[1])
  else
    text = fmt("rewrite", req.text, item, choice.policy)
  end
  return text .. (choice.scope or "")
end

------------------------------------------------------------------------------ one submission

-- The count field `name` of a record, or nil when unset: nil, 0, or its width's NO_VAL.
local function count_of(record, name)
  local value = tonumber(record[name])
  if value == nil or value <= 0 or value == (FIELDS16[name] and NO_VAL16 or NO_VAL) then return nil end
  return value
end

-- Nodes the job spans: -N, or more when tasks over tasks per node need more.
local function job_nodes(job_desc)
  local tasks, per_node = count_of(job_desc, "num_tasks"), count_of(job_desc, "ntasks_per_node")
  local by_tasks = (tasks and per_node) and ceil_div(tasks, per_node) or 1
  return math.max(count_of(job_desc, "min_nodes") or 1, by_tasks)
end

-- Devices each node needs: a job total over the nodes, per task x tasks per node, else the count.
local function devices_per_node(req, job_desc, nodes)
  if req.gpu_field == "tres_per_job" then return ceil_div(req.count, nodes) end
  if req.gpu_field == "tres_per_task" then
    local tasks = count_of(job_desc, "num_tasks")
    local per_node = count_of(job_desc, "ntasks_per_node") or (tasks and ceil_div(tasks, nodes)) or 1
    return req.count * per_node
  end
  return req.count
end

-- A job_desc memory figure (MiB), 0 when Slurm's value means unset (nil, 0, MEM_UNSET and above).
local function amount_of(value)
  value = tonumber(value)
  if value == nil or value <= 0 or value >= MEM_UNSET then return 0 end
  return value
end

-- N of the first NAME item of a TRES field, after its last ':' or '=' (--cpus-per-gpu, --mem-per-gpu:
-- gpu; 24.11's -c in tres_per_task: cpu); 0 for none or past a uint64's 20 digits (slurmctld's).
local function item_count(text, name)
  for _, item in ipairs(items_of(text)) do
    if item.name == name then
      local value = string.match(item.body, "[^:=]*$")
      if is_digits(value) and #value <= 20 then return tonumber(value) end
      return 0
    end
  end
  return 0
end

-- Whether the job overcommits (-O): Lua sees no overcommit field, but clients send min_cpus = nodes
-- for -O and at least the tasks otherwise (24.11 counts --ntasks-per-node x -N as the tasks).
local function overcommits(job_desc)
  local total = count_of(job_desc, "min_cpus")
  if total == nil then return false end
  local low, high = count_of(job_desc, "min_nodes") or 1, count_of(job_desc, "max_nodes")
  local tasks, per_node = count_of(job_desc, "num_tasks"), count_of(job_desc, "ntasks_per_node")
  if tasks == nil and per_node and (high == nil or high == low) then tasks = per_node * low end
  return tasks ~= nil and total < tasks
end

-- CPUs and MiB each node of the job needs: tasks per node (one with -O) x CPUs per task (-c, or
-- 24.11's cpu=N in tres_per_task), at least --mincpus, CPUs per gpu x devices, or min_cpus over the
-- nodes (sbatch's tasks x -c in 32 bits: `-c 65537` reaches cpus_per_task as 1); --mem, memory per
-- gpu x devices, or per CPU x CPUs. Also the most nodes Slurm may spread the tasks over, or nil.
local function node_needs(job_desc, nodes, each)
  local tasks = count_of(job_desc, "num_tasks")
  local per_node = count_of(job_desc, "ntasks_per_node") or (tasks and ceil_div(tasks, nodes)) or 1
  local over = overcommits(job_desc)
  if over then per_node = 1 end
  local per_task = count_of(job_desc, "cpus_per_task") or item_count(job_desc.tres_per_task, "cpu")
  if per_task == 0 then per_task = 1 end
  local total = count_of(job_desc, "min_cpus")
  local cpus = math.max(per_node * per_task, item_count(job_desc.cpus_per_tres, "gpu") * each,
                        total and ceil_div(total, nodes) or 0, count_of(job_desc, "pn_min_cpus") or 0)
  local mem = math.max(amount_of(job_desc.min_mem_per_node), item_count(job_desc.mem_per_tres, "gpu") * each,
                       amount_of(job_desc.min_mem_per_cpu) * cpus)
  -- -n without --ntasks-per-node or -O, with room under -N's maximum
  local high = count_of(job_desc, "max_nodes")
  local spread = tasks and tasks > nodes and count_of(job_desc, "ntasks_per_node") == nil
    and not over and (high == nil or high > nodes)
  return cpus, mem, spread and math.min(tasks, high or tasks) or nil
end

-- An edit's -w of a job the hook rewrote: of the hosts it names that the table knows, one no shape
-- lets hold the job's devices, CPUs, memory and constraint (shortest name, then byte order); false
-- when each can. Unknown hosts and an unreadable -w are left to slurmctld.
local function misfit_host(need, spec)
  local by_host = host_shapes()
  local hosts = hostlist_names(spec, T.limits.max_excluded, LONGEST_HOST)
  local worst = false
  for _, host in ipairs(hosts or {}) do
    local places, fits = by_host[host], false
    for _, at in ipairs(places or {}) do
      local shape = T.types[at[1]].shapes[at[2]]
      if (need.gpu_type == nil or need.gpu_type == at[1]) and shape.count >= need.each and holds(shape, need)
          and matches(shape, need.match) then
        fits = true
        break
      end
    end
    if places and not fits and (not worst or #host < #worst or (#host == #worst and host < worst)) then
      worst = host
    end
  end
  return worst
end

local function is_exempt(job_desc, submit_uid)
  return (submit_uid ~= nil and T.exempt_uids[submit_uid]) or T.exempt_uids[job_desc.user_id or -1]
end

local MAX_SPREAD = 64  -- more nodes than -N's minimum a job's tasks are tried on (each a decision)

-- What to do with the job: { action = "untouched" | "reject" | "rewrite", ... }. Reads only.
-- held: what an edited job holds (held_devices: whole stays whole, untyped untyped, shards shards).
-- check: only whether those still fit (else edit_counts). taken / taken_hosts: the nodes per type and
-- the -w hosts of earlier het components. tasks_hidden: an edit that cannot see the task count
-- (devices per task refused). prefer: the type an edited job holds (Slurm hides its -x).
local function evaluate(job_desc, submit_uid, held, check, taken, tasks_hidden, taken_hosts, prefer)
  if not check and not asks_us(job_desc) then return { action = "untouched" } end
  if T == nil then error(LOAD_ERROR, 0) end
  if is_exempt(job_desc, submit_uid) then return { action = "untouched" } end
  local ok, req = pcall(gather, job_desc)
  if not ok then return rejected(req) end
  req.text = table.concat(req.shown, ",")
  if tasks_hidden and req.gpu_field == "tres_per_task" then
    -- an edit of a job with devices per task: its task count is not in job_rec
    return refusal(req.text .. ": " .. fmt("edit_tasks"), "request")
  end
  if req.gpu_field == "tres_per_socket" then
    -- devices per socket x sockets per node: the table knows no sockets, so no type can be checked
    return refusal(req.text .. ": " .. fmt("per_socket", T.type_list), "request")
  end
  local stray = unknown_partition(job_desc.partition)
  if stray then  -- slurmctld refuses the job after the hook: not decided as the default partition's
    local text = stray == "" and fmt("partition_none", T.partition_list)
      or fmt("partition_unknown", stray, T.partition_list)
    return refusal("--partition=" .. job_desc.partition .. ": " .. text, "partition")
  end
  if not check and (job_desc.req_nodes or "") ~= "" then
    return refusal(req.text .. ": " .. fmt("node_list", T.type_list), "request")
  end
  local exc, gone, excl = job_desc.exc_nodes, {}, false
  if (exc or "") ~= "" or next(taken_hosts or {}) ~= nil then
    gone, excl = excluded(exc, taken_hosts)
    if gone == nil then  -- slurmctld's own error for an -x it cannot read: Invalid node name specified
      return refusal(req.text .. ": " .. exclude_refusal(exc), "node_name")
    end
  end
  local parsed, match, complex = pcall(constraint_match, job_desc.features)
  if not parsed then return rejected(match) end
  -- the constraint's names, and the first no node has (slurmctld refuses it; unchecked without a list)
  local named, unknown, known = {}, nil, next(T.features or {}) ~= nil and T.features
  for name in string.gmatch(job_desc.features or "", "[A-Za-z0-9_.%-]+") do
    named[name] = true
    if known and unknown == nil and not known[name] then unknown = name end
  end
  if unknown then
    return refusal("--constraint=" .. job_desc.features .. ": " .. fmt("constraint_unknown", unknown), "constraint")
  end
  local nodes = job_nodes(job_desc)
  local tasks, per_node = count_of(job_desc, "num_tasks"), count_of(job_desc, "ntasks_per_node")
  if req.gpu_field == "tres_per_job" and req.count < nodes then
    -- slurmctld refuses a job total below min_nodes (which the rewrite pins): --gpus < -N
    return refusal(req.text .. ": " .. fmt("job_total", req.count, nodes, nodes), "request")
  end
  local function need_at(n)  -- what each of n nodes must hold
    local each = devices_per_node(req, job_desc, n)
    local cpus, node_mem, spread = node_needs(job_desc, n, each)
    return { request = req.text, gpumem = req.gpumem, gpucore = req.gpucore, count = req.count,
             gpu_type = req.gpu_type,
             -- --cpus-per-gpu / --mem-per-gpu need gpu items: slurmctld refuses them beside shards
             explicit_count = req.gpu_field ~= nil or held == "typed" or held == "untyped"
               or (job_desc.cpus_per_tres or "") ~= "" or (job_desc.mem_per_tres or "") ~= "",
             partition = job_desc.partition, complex = complex,
             memory_items = req.memory_items, nodes = n, match = match, named = named,
             each = each, cpus = cpus, node_mem = node_mem, taken = taken or {},
             het = taken ~= nil and next(taken) ~= nil, excluded = gone, excl = excl, prefer = prefer,
             spread = spread,
             -- the node count is -n over --ntasks-per-node: the hint asks fewer tasks too
             tasks_per_node = (tasks and per_node and ceil_div(tasks, per_node) == n) and per_node or nil }
  end
  local need = need_at(nodes)
  local misfit = check and (job_desc.req_nodes or "") ~= "" and misfit_host(need, job_desc.req_nodes)
  if misfit then
    return refusal(req.text .. ": " .. fmt("edit_hosts", misfit, need.each), "NODE_TOO_SMALL")
  end
  local choice, why, code = decide(need)
  if choice == nil and not check and need.spread then
    -- Slurm spreads -n over more nodes where -N leaves room (typed `-n 9 --gres=gpu:l40s:1` runs
    -- on two 8-CPU nodes): the fewest that take the job, within MAX_SPREAD more (bounded work)
    local most = math.min(need.spread, nodes + MAX_SPREAD)
    if req.gpu_field == "tres_per_job" then most = math.min(most, req.count) end
    for n = nodes + 1, most do
      local wider = need_at(n)
      local found = decide(wider)
      if found then
        choice, need, nodes = found, wider, n
        break
      end
    end
  end
  if choice == nil then
    return refusal(check and fmt("edit_counts", why) or why, code)
  end
  if held == "untyped" and choice.kind == "gpu" then
    choice = { kind = "any", types = choice.types, count = choice.count, policy = choice.policy,
               constraint = { T.types[choice.types[1]].feature }, scope = choice.scope }
  end
  if held == "shard" and choice.kind ~= "shard" then
    return refusal(req.text .. ": " .. T.messages.edit_shards, "request")
  end
  if check then return { action = "untouched" } end
  local item = new_item(choice, req.form)
  -- pin the node count the decision assumed where the job leaves it open: the minimum always, the
  -- maximum where devices per node follow it (per task or job; `-O -n 32 -N1` is refused on 8 CPUs)
  local pin, follows = {}, req.gpu_field == "tres_per_task" or req.gpu_field == "tres_per_job"
  if count_of(job_desc, "min_nodes") == nil then pin.min_nodes = nodes end
  if follows and count_of(job_desc, "max_nodes") == nil then pin.max_nodes = nodes end
  return { action = "rewrite", message = note(req, choice, item), fields = new_fields(req, choice, item),
           types = choice.types, request = req.text, pin = pin, nodes = nodes,
           features = new_features(job_desc.features, choice.constraint) }
end

-- The most specific Slurm error: the release's exported name, else its number, else slurm.ERROR.
local function error_code(key)
  local name = T.reject_codes and T.reject_codes[key]
  local code = name and slurm[name]
  if type(code) == "number" then return code end
  code = name and T.error_numbers and T.error_numbers[name]
  if type(code) == "number" then return code end
  return slurm.ERROR
end

local PIN_FIELDS = { "min_nodes", "max_nodes" }

-- A rejection told: slurmctld's log (where: the uid and job, loggable) and the user; its Slurm error.
local function refuse(where, outcome)
  local said, logged = texts(outcome)
  slurm.log_info("slurm_hetero: %s: rejected [%s]: %s", where, tostring(outcome.code), logged)
  slurm.log_user("%s", said)
  return error_code(outcome.code)
end

-- Write the outcome into the job (only fields that change) and tell the user. view: the job's
-- fields as slurm_job_submit read them (job_desc is only written, and its admin_comment read).
local function apply(job_desc, view, submit_uid, outcome)
  if outcome.action == "untouched" then return slurm.SUCCESS end
  local where, offset = "uid " .. tostring(submit_uid), view.het_job_offset
  if offset ~= nil and offset ~= NO_VAL then where = where .. " component " .. offset end
  where = loggable(where)
  if outcome.action == "reject" then return refuse(where, outcome) end
  for _, field in ipairs(FIELDS) do
    if outcome.fields[field] ~= (view[field] or "") then job_desc[field] = outcome.fields[field] end
  end
  if outcome.features then job_desc.features = outcome.features end
  -- Slurm may spread a job without -N over more nodes than the type was checked for (24.11)
  for _, name in ipairs(PIN_FIELDS) do
    if outcome.pin[name] then job_desc[name] = outcome.pin[name] end
  end
  local comment = T.note_prefix .. outcome.message
  local existing = job_desc.admin_comment
  if existing ~= nil and existing ~= "" then comment = existing .. "; " .. comment end
  job_desc.admin_comment = comment
  local said, logged = texts(outcome)
  slurm.log_info("slurm_hetero: %s: %s", where, logged)
  slurm.log_user("%s", said)
  return slurm.SUCCESS
end

-- An internal error: logged; the table's fail policy when valid, else the baked one.
local function failed(err)
  local valid = T and (T.fail_policy == "open" or T.fail_policy == "closed")
  local policy = valid and T.fail_policy or FAIL_POLICY
  log(slurm.log_error, "slurm_hetero: internal error, failing %s: %s", policy, tostring(err))
  if policy == "closed" then
    slurm.log_user("%s", (T and type(T.messages) == "table" and T.messages.internal) or INTERNAL)
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

------------------------------------------------------------------------------ entry points

-- Slurm calls the hook once per het component, in order (het_job_offset 0, 1, ...), and never puts
-- two on one node; reset by component 0 and by every other job. HET_TAKEN: nodes per type earlier
-- components take; HET_CHOSEN: of those, the hook's own choices (het_typed); HET_HOSTS: their -w
-- hosts (a set), which later components get in exc_nodes and so count there, once.
local HET_TAKEN, HET_CHOSEN, HET_HOSTS = {}, {}, {}

-- Decisions of recent single-job submissions, keyed by everything a decision reads (MEMO_FIELDS and
-- the uid): users resubmit the same request. Emptied when full.
local MEMO_FIELDS = { "tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket", "features",
                      "partition", "req_nodes", "exc_nodes", "num_tasks", "ntasks_per_node", "min_nodes",
                      "max_nodes", "cpus_per_task", "min_cpus", "pn_min_cpus", "cpus_per_tres", "mem_per_tres",
                      "min_mem_per_node", "min_mem_per_cpu", "user_id" }
local MEMO_MAX = 1024
local MEMO, MEMO_SIZE = {}, 0
-- A tree: the uid, then each MEMO_FIELDS value from last to first (UNSET_KEY for unset), an outcome
-- at the end; cheaper than building a key string.
local UNSET_KEY = {}

local function recall(view, submit_uid)
  local node = MEMO[submit_uid == nil and UNSET_KEY or submit_uid]
  for i = #MEMO_FIELDS, 1, -1 do
    if node == nil then return nil end
    local value = view[MEMO_FIELDS[i]]
    node = node[value == nil and UNSET_KEY or value]
  end
  return node
end

local function remember(view, submit_uid, outcome)
  if submit_uid ~= submit_uid then return end  -- NaN: not a table key
  if MEMO_SIZE >= MEMO_MAX then MEMO, MEMO_SIZE = {}, 0 end
  local node, key = MEMO, submit_uid == nil and UNSET_KEY or submit_uid
  for i = #MEMO_FIELDS, 1, -1 do
    local value = view[MEMO_FIELDS[i]]
    if value ~= value then return end
    local next_node = node[key]
    if next_node == nil then
      next_node = {}
      node[key] = next_node
    end
    node, key = next_node, value == nil and UNSET_KEY or value
  end
  if node[key] == nil then MEMO_SIZE = MEMO_SIZE + 1 end
  node[key] = outcome
end

-- The job's fields, each read from job_desc once (a read is slow on 22.05); others when asked for.
local VIEW_JOB = {}  -- the view's key for its job_desc
local VIEW_HOLDS = { het_job_offset = true }
for _, name in ipairs(MEMO_FIELDS) do VIEW_HOLDS[name] = true end
local VIEW_META = {
  __index = function(view, name)
    if VIEW_HOLDS[name] then return nil end
    return rawget(view, VIEW_JOB)[name]
  end,
}

-- The one type whose nodes could hold a component asking for devices without a type (--gpus=1 -C
-- l40s); nil where several or none could, or the request or constraint cannot be read (Slurm picks).
local function sole_type(fields, job)
  local ok, req = pcall(gather, fields)
  if not ok or req.gpu_field == nil or req.gpu_type ~= nil then return nil end
  local parsed, match = pcall(constraint_match, job.features)
  if not parsed then return nil end
  local nodes = job_nodes(job)
  local each = devices_per_node(req, job, nodes)
  local cpus, node_mem = node_needs(job, nodes, each)
  local need, found = { match = match, cpus = cpus, node_mem = node_mem }, nil
  for name, facts in pairs(T.types) do
    if nodes_with(facts, need, each) > 0 then
      if found then return nil end
      found = name
    end
  end
  return found
end

-- A het component the hook leaves alone still takes its nodes of the type it names (without one, of
-- sole_type) less its -w hosts of that type, and its -w hosts (HET_HOSTS): later components must not
-- be decided onto them. Two gpu items or a malformed one: slurmctld refuses it.
local function het_take(fields, job)
  if T == nil then return end
  local found, readable = nil, true
  for i = 1, #FIELDS do
    for _, item in ipairs(items_of(fields[FIELDS[i]])) do
      if item.name == "gpu" and readable then
        local ok, gpu_type = pcall(parse_gpu, item)
        if found ~= nil or not ok then readable = false end
        found = gpu_type or false
      end
    end
  end
  local nodelist = job.req_nodes
  if found == false and readable then found = sole_type(fields, job) end
  if found and readable then
    local _, named = named_hosts(nodelist, found)
    local nodes = job_nodes(job) - named
    if nodes > 0 then HET_TAKEN[found] = (HET_TAKEN[found] or 0) + nodes end
  end
  for host in pairs(named_hosts(nodelist)) do HET_HOSTS[host] = true end
end

-- A het component the hook leaves alone that names a gpu type is refused when the hook's choices for
-- earlier components (HET_CHOSEN) leave that type too few nodes (components never share a node:
-- `--gres=gpumem:20G : --gres=gpu:l40s:1` on one l40s node never starts); nil otherwise, for Slurm.
local function het_typed(fields, job_desc, submit_uid)
  if next(HET_CHOSEN) == nil or T == nil or is_exempt(job_desc, submit_uid) then return nil end
  if (job_desc.req_nodes or "") ~= "" then return nil end
  local ok, req = pcall(gather, fields)
  if not ok then return nil end  -- two gpu items, a malformed or unknown one: slurmctld's to refuse
  local name = req.gpu_type
  if name == nil or not HET_CHOSEN[name] then return nil end
  local gone = excluded(job_desc.exc_nodes, HET_HOSTS)
  if gone == nil then return nil end  -- an -x the hook cannot read: slurmctld's
  local nodes = job_nodes(job_desc)
  local each = devices_per_node(req, job_desc, nodes)
  local have = nodes_with(T.types[name], { match = { { {} } }, cpus = 0, node_mem = 0, excluded = gone }, each, true)
  local used = HET_TAKEN[name] or 0
  local left = have - used
  if left >= nodes or left + HET_CHOSEN[name] < nodes then return nil end
  local text = fmt("het_typed", name, have, each, used, HET_CHOSEN[name], nodes)
  return refusal(table.concat(req.shown, ",") .. ": " .. text, "TOO_FEW_NODES")
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local offset = job_desc.het_job_offset
  local het = offset ~= nil and offset ~= NO_VAL
  if not het or offset == 0 then HET_TAKEN, HET_CHOSEN, HET_HOSTS = {}, {}, {} end
  local view = { het_job_offset = offset, [VIEW_JOB] = job_desc }
  for i = 1, #FIELDS do view[FIELDS[i]] = job_desc[FIELDS[i]] end
  local ok, outcome
  -- most jobs name neither: untouched (what evaluate decides for them), nothing else read
  if not asks_us(view, true) then
    if not het then return slurm.SUCCESS end
    ok, outcome = pcall(het_typed, view, job_desc, submit_uid)
    if ok and not outcome then
      het_take(view, job_desc)
      return slurm.SUCCESS
    end
  else
    for i = #FIELDS + 1, #MEMO_FIELDS do view[MEMO_FIELDS[i]] = job_desc[MEMO_FIELDS[i]] end
    if not het then
      outcome = recall(view, submit_uid)  -- before the metatable: unset fields are plain misses
      ok = outcome ~= nil
    end
    setmetatable(view, VIEW_META)
    if not ok then
      ok, outcome = pcall(evaluate, view, submit_uid, nil, nil, het and HET_TAKEN or nil, nil, het and HET_HOSTS or nil)
      if ok and not het then remember(view, submit_uid, outcome) end
    end
  end
  if not ok then return failed(outcome) end
  local applied, rc = pcall(apply, job_desc, view, submit_uid, outcome)
  if not applied then return failed(rc) end
  if het and rc == slurm.SUCCESS and outcome.action == "rewrite" then
    local name = outcome.types[1]
    HET_TAKEN[name] = (HET_TAKEN[name] or 0) + outcome.nodes
    HET_CHOSEN[name] = (HET_CHOSEN[name] or 0) + outcome.nodes
  elseif het and rc == slurm.SUCCESS then
    het_take(view, view)
  end
  return rc
end

-- An edit (scontrol update): the same rules on the job as edited. An edit with gpumem/gpucore is
-- decided as a submission with the job's device count and scope; an edit of the node or task count,
-- node lists, partition or constraint of a job this hook rewrote is checked against the devices it
-- holds. Fields the edit leaves unset come from job_rec, which lacks num_tasks, ntasks_per_node,
-- exc_nodes and req_nodes (22.05, 24.11): those count only when the edit sets them.
local VIEW_STRINGS = { "tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket", "features", "partition",
                       "admin_comment", "cpus_per_tres", "mem_per_tres" }
-- pn_min_cpus: the CPUs slurmctld holds each node to (--mincpus, -c; scontrol's MinCPUsNode)
local VIEW_COUNTS = { "min_nodes", "num_tasks", "ntasks_per_node", "pn_min_cpus" }
local VIEW_AMOUNTS = { "min_mem_per_node", "min_mem_per_cpu" }
local VIEW_EDIT = { "req_nodes", "exc_nodes" }

-- The constraint our last rewrite of the job added ("l40s", "a100_80g|h100"), from the last note
-- in its admin comment ("... -> gres:shard:5 constraint l40s (...)"); nil when it added none.
local function our_constraint(comment)
  if type(comment) ~= "string" then return nil end
  local last, start = nil, 1
  while true do
    local at = string.find(comment, T.note_prefix, start, true)
    if not at then break end
    last, start = at, at + 1
  end
  if last == nil then return nil end
  return string.match(string.sub(comment, last), " constraint ([^ ]+) %(")
end

-- features without the part `added` that new_features appended (nil when nothing is left).
local function without(features, added)
  if features == nil or added == nil then return features end
  if features == added then return nil end
  for _, tail in ipairs({ "&" .. added, "&(" .. added .. ")" }) do
    if #features > #tail and string.sub(features, -#tail) == tail then
      return string.sub(features, 1, #features - #tail)
    end
  end
  return features
end

-- How the job asks for devices: "shard", "typed" (a gpu item with a type), "untyped" (gpu:N only) or
-- nil; also its first typed gpu item's type and field prefix. Slurm 22.05 refuses an update between
-- gpu and shard requests, and from untyped to typed ("Invalid generic resource (gres) specification"),
-- so an edit keeps a job on whole devices or shards, and an untyped one untyped (the type in -C).
local function held_devices(job_rec)
  local held, gpu_type, prefix = nil, nil, nil
  for _, field in ipairs(FIELDS) do
    for _, item in ipairs(items_of(job_rec[field])) do
      if item.name == "shard" then
        held = "shard"
      elseif item.name == "gpu" then
        local tokens = split(split(item.body, "=")[1], ":")
        local typed = #tokens > 1 and not is_digits(tokens[2])
        if typed and gpu_type == nil then gpu_type, prefix = tokens[2], item.prefix end
        if held == nil or held == "untyped" then held = typed and "typed" or "untyped" end
      end
    end
  end
  return held, gpu_type, prefix
end

-- text with every gpu item's type dropped: gres:gpu:l40s:2 -> gres:gpu:2, gres/gpu:l40s=2 ->
-- gres/gpu=2, gres:gpu:l40s -> gres:gpu (other items unchanged).
local function untyped(text)
  if text == nil or text == "" then return text end
  local out = {}
  for _, item in ipairs(items_of(text)) do
    local piece = item.text
    if item.name == "gpu" then
      local at = string.find(item.body, "=", 1, true)
      local tokens = split(at and string.sub(item.body, 1, at - 1) or item.body, ":")
      if at and #tokens == 2 then
        piece = item.prefix .. "gpu=" .. string.sub(item.body, at + 1)
      elseif not at and #tokens == 3 then
        piece = item.prefix .. "gpu:" .. tokens[3]
      elseif not at and #tokens == 2 and not is_digits(tokens[2]) then
        piece = item.prefix .. "gpu"
      end
    end
    out[#out + 1] = piece
  end
  return table.concat(out, ",")
end

-- Whether any TRES field of job_desc holds a gpu item.
local function gpu_asked(job_desc)
  for _, field in ipairs(FIELDS) do
    for _, item in ipairs(items_of(job_desc[field])) do
      if item.name == "gpu" then return true end
    end
  end
  return false
end

-- again: the edit asks for gpumem/gpucore: the record's gpu items lose their type, chosen again.
local function edited_view(job_desc, job_rec, again)
  local view = {}
  for _, name in ipairs(VIEW_STRINGS) do
    local value = job_desc[name]
    if value == nil or value == "" then
      value = job_rec[name]
      if again and (name == "tres_per_node" or IN_PLACE[name]) then value = untyped(value) end
    end
    view[name] = value
  end
  if again and (job_desc.tres_per_node or "") ~= "" and not gpu_asked(job_desc) then
    -- `scontrol update gres=gpumem:30G` replaces the field: the job's per-node device count (above
    -- the default 1) stays, as 22.05 merges it
    for _, item in ipairs(items_of(untyped(job_rec.tres_per_node))) do
      local count = tonumber(string.match(item.text, "[:=](%d+)$") or "")
      if item.name == "gpu" and count and count > 1 then
        view.tres_per_node = view.tres_per_node .. "," .. item.text
      end
    end
  end
  for _, name in ipairs(VIEW_COUNTS) do
    view[name] = count_of(job_desc, name) or count_of(job_rec, name)
  end
  for _, name in ipairs(VIEW_AMOUNTS) do
    view[name] = amount_of(job_desc[name]) > 0 and job_desc[name] or job_rec[name]
  end
  for _, name in ipairs(VIEW_EDIT) do
    if (job_desc[name] or "") ~= "" then view[name] = job_desc[name] end
  end
  local ours = our_constraint(job_rec.admin_comment)
  if job_desc.features == nil or job_desc.features == "" then
    -- decided again: not the constraint we added; checked: the job's whole constraint (an untyped
    -- job's type is only there: l40s|a100_80g)
    if again then
      view.features = without(job_rec.features, ours)
      view.restore = view.features ~= job_rec.features
    end
  elseif not again and ours then  -- a new constraint: still on the types our rewrite chose
    view.features = new_features(job_desc.features, split(ours, "|"))
    view.keep = view.features ~= job_desc.features
  end
  view.user_id = job_rec.user_id
  view.het_job_offset = job_rec.het_job_offset
  return view
end

-- Write an edit's outcome: an update cannot clear a field ("" means no change), so only non-empty
-- values are written; the admin comment is the administrator's, left alone.
local function apply_edit(job_desc, view, modify_uid, outcome)
  if outcome.action == "untouched" then
    if view.keep then job_desc.features = view.features end
    return slurm.SUCCESS
  end
  local where = loggable("uid " .. tostring(modify_uid) .. " edit of job " .. tostring(view.job_id))
  if outcome.action == "reject" then return refuse(where, outcome) end
  for _, field in ipairs(FIELDS) do
    local value = outcome.fields[field]
    -- a field the edit set is always written (its gpumem item must not stay), another when it changes
    local set = (job_desc[field] or "") ~= ""
    if set or (value ~= "" and value ~= (view.record[field] or "")) then job_desc[field] = value end
  end
  if outcome.features then
    job_desc.features = outcome.features
  elseif view.restore then  -- drop the constraint we added before; an update cannot clear a field,
    -- so an empty one becomes the chosen type's own feature, which every node of the type has
    job_desc.features = (view.features ~= nil and view.features ~= "") and view.features
      or T.types[outcome.types[1]].feature
  end
  -- slurmctld's log only: scontrol (24.11) prints every log_user line of an update as "error: "
  slurm.log_info("slurm_hetero: %s: %s", where, loggable(outcome.message))
  return slurm.SUCCESS
end

-- Whether an edit changes what the held devices must fit: counts, node lists, partition, constraint.
local function fit_edit(job_desc)
  for _, name in ipairs(VIEW_COUNTS) do
    if count_of(job_desc, name) then return true end
  end
  for _, name in ipairs(VIEW_EDIT) do
    if (job_desc[name] or "") ~= "" then return true end
  end
  return (job_desc.partition or "") ~= "" or (job_desc.features or "") ~= ""
end

local function decide_edit(job_desc, job_rec, modify_uid)
  local asks = asks_us(job_desc)
  if not asks and not fit_edit(job_desc) then return { action = "untouched" } end
  if T == nil then error(LOAD_ERROR, 0) end
  local held, old, prefix = held_devices(job_rec)
  local ours = type(job_rec.admin_comment) == "string" and string.find(job_rec.admin_comment, T.note_prefix, 1, true)
  if not asks and not (held and ours) then return { action = "untouched" } end
  local view = edited_view(job_desc, job_rec, asks)
  view.job_id, view.record = job_rec.job_id, job_rec
  -- job_rec has no task counts (22.05, 24.11): unknown unless the edit sets one
  local hidden = view.num_tasks == nil and view.ntasks_per_node == nil
  -- nor -x / -w: without the edit's own, a job holding a type keeps it when it fits, and another
  -- type is refused (the job's -x or -w may rule it out: it would never start)
  local known = job_desc.exc_nodes ~= nil and job_desc.req_nodes ~= nil  -- "" (excnodelist=): none
  local prefer = asks and not known and old or nil
  local result = evaluate(view, modify_uid, held, not asks, nil, asks and hidden, nil, prefer)
  local het_id = tonumber(job_rec.het_job_id)
  if result.action == "rewrite" and het_id ~= nil and het_id > 0 and het_id < NO_VAL then
    -- Slurm shows an edit no other component of the job: a new type could land beside theirs
    return { view = view, result = refusal(result.request .. ": " .. fmt("edit_het"), "request") }
  end
  -- Slurm 22.05 merges an update's GRES into the job's, so a new type goes beside the one the job
  -- holds in its "gres:" form and the job asks for both; 24.11 builds the list again.
  if result.action == "rewrite" and prefix == "gres:" and result.types[1] ~= old then
    result = refusal(result.request .. ": " .. fmt("edit_type", old, result.types[1]), "request")
  elseif result.action == "rewrite" and prefer and result.types[1] ~= prefer then
    result = refusal(result.request .. ": " .. fmt("edit_hidden", prefer, result.types[1]), "request")
  end
  return { view = view, result = result }
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  local ok, outcome = pcall(decide_edit, job_desc, job_rec, modify_uid)
  if not ok then return failed(outcome) end
  if outcome.action == "untouched" then return slurm.SUCCESS end
  local applied, rc = pcall(apply_edit, job_desc, outcome.view, modify_uid, outcome.result)
  if not applied then return failed(rc) end
  return rc
end

------------------------------------------------------------------------------ host files

-- A -w/-x value with a "/" names a host file, which sbatch, salloc and srun read and send as hosts
-- (slurm_read_hostfile), byte for byte as here: 1,023-byte fgets pieces ending at a NUL; "#" starts
-- a comment ("\#" is "#", the C shift leaving the last byte twice); a full piece is cut after its
-- last comma; a line must start with a letter or digit; `name*N` is the name atoi(N) times (0: as
-- written); the names are sent folded (hostlist_ranged_string), blanks and other bytes kept.
local HOSTFILE_PIECE = 1023
local MAX_PUSHED = 65536  -- pushes of one name folded; past it a host file of no use to the hook

-- C's (int) atoi(text): strtol's digits after blanks and a sign, saturated to a long, low 32 bits.
local function atoi32(text)
  local sign, digits = string.match(text, "^[ \t\n\v\f\r]*([+-]?)(%d+)")
  if digits == nil then return 0 end
  digits = string.match(digits, "^0*(%d*)$")
  local long_max = "9223372036854775807"
  if #digits > #long_max or (#digits == #long_max and digits > long_max) then
    return sign == "-" and 0 or -1  -- LONG_MIN's low 32 bits are 0, LONG_MAX's all ones
  end
  local low = 0
  for i = 1, #digits do low = (low * 10 + tonumber(string.sub(digits, i, i))) % 4294967296 end
  if sign == "-" then low = (4294967296 - low) % 4294967296 end
  return low >= 2147483648 and low - 4294967296 or low
end

-- A piece up to its NUL, newline or first "#" no backslash escapes, as the C loop leaves it.
local function uncommented(piece)
  local line = string.match(piece, "^[^%z]*")
  local size, i = #line, 1
  while i <= size do
    local c = string.sub(line, i, i)
    if c == "\n" then return string.sub(line, 1, i - 1) end
    if c == "#" then
      if i == 1 or string.sub(line, i - 1, i - 1) ~= "\\" then return string.sub(line, 1, i - 1) end
      line = string.sub(line, 1, i - 2) .. string.sub(line, i, size) .. string.sub(line, size + 1)
      line = string.sub(line, 1, size - 1) .. string.sub(line, size - 1)  -- the last byte twice
      size = size - 1
    end
    i = i + 1
  end
  return line
end

-- The names as hostlist_ranged_string writes them: a name's trailing digits (up to 15) are its
-- number; a push of the next number of the last range's prefix and width extends it; neighbouring
-- ranges of one prefix and width share brackets ("a100n[1,1,1]", "a100n[1-2]").
local function ranged(pushed)
  local ranges = {}
  for _, push in ipairs(pushed) do
    local prefix, digits = string.match(push[1], "^(.-)(%d*)$")
    if #digits > 15 then prefix, digits = push[1], "" end
    local width, number = #digits > 0 and #digits or -1, tonumber(digits) or 0
    for _ = 1, math.min(push[2], MAX_PUSHED) do
      local last = ranges[#ranges]
      if last and width >= 0 and last[1] == prefix and last[2] == width and last[4] == number - 1 then
        last[4] = number
      else
        ranges[#ranges + 1] = { prefix, width, number, number }
      end
    end
  end
  local out, k = {}, 1
  while k <= #ranges do
    local r, j = ranges[k], k
    while ranges[j + 1] and ranges[j + 1][1] == r[1] and ranges[j + 1][2] == r[2] do j = j + 1 end
    if r[2] < 0 then
      for _ = k, j do out[#out + 1] = r[1] end
    else
      local spans, f = {}, "%0" .. r[2] .. "d"
      for m = k, j do
        local lo, hi = ranges[m][3], ranges[m][4]
        spans[#spans + 1] = string.format(f, lo) .. (hi ~= lo and ("-" .. string.format(f, hi)) or "")
      end
      local single = j == k and r[3] == r[4]
      out[#out + 1] = single and (r[1] .. spans[1]) or (r[1] .. "[" .. table.concat(spans, ",") .. "]")
    end
    k = j + 1
  end
  return table.concat(out, ",")
end

-- The hosts of a host file's bytes as sbatch sends them, or nil and sbatch's error.
local function hostfile_hosts(data, path)
  local pushed, carried, number, at = {}, "", 0, 1
  while at <= #data do
    local newline = string.find(data, "\n", at, true)
    local stop = (newline and newline - at < HOSTFILE_PIECE) and newline or at + HOSTFILE_PIECE - 1
    local line, rest = uncommented(string.sub(data, at, stop)), ""
    at = stop + 1
    if #line == HOSTFILE_PIECE then  -- the buffer filled: keep what follows the last comma
      local comma = string.match(line, "^.*(),")
      if comma == nil then return nil, "Line " .. number .. ", of hostfile " .. path .. " too long" end
      line, rest = string.sub(line, 1, comma - 1), string.sub(line, comma + 1)
    else
      number = number + 1
    end
    local text = carried .. line
    carried = rest
    if text ~= "" then
      if not string.find(text, "^[A-Za-z0-9]") then
        return nil, "Invalid hostfile " .. path .. " contents on line " .. number
      end
      for piece in string.gmatch(text, "[^,]+") do
        local star = string.find(piece, "*", 1, true)
        local count = star and atoi32(string.sub(piece, star + 1)) or 0
        if count > 0 then pushed[#pushed + 1] = { string.sub(piece, 1, star - 1), count }
        elseif count == 0 then pushed[#pushed + 1] = { piece, 1 } end
      end
    end
  end
  if #pushed == 0 then return nil, path .. ": Hostlist is empty!" end
  return ranged(pushed), nil
end

------------------------------------------------------------------------------ the module

-- What the srun half (slurm_hetero_srun.lua) and Python (hook.py, through lupa) use of the hook, so
-- that neither has a reader of its own. A global, as Slurm finds slurm_job_submit.
slurm_hetero_hook = {
  submit = slurm_job_submit, items_of = items_of, gather = gather, hostfile_hosts = hostfile_hosts,
}

return slurm.SUCCESS
