--[[
cli_filter.lua: slurm-hetero's client-side filter (Slurm cli_filter/lua plugin, Lua 5.1), in
sbatch, salloc and srun (CliFilterPlugins=lua; the file sits beside slurm.conf).

The plugin reads and compiles this file for every command, so it stays small. sbatch and salloc
return at once: the job_submit hook decides there (and records why in the admin comment). srun,
when its options name gpumem or gpucore, runs slurm_hetero_srun.lua (beside this file, or the path
baked in at render time), which writes the hook's decision into the options so that the step
gets the device too. Any error leaves the options alone.
--]]

-- Baked in by `slurm-hetero job-submit render` (the line ending in "@render"; keep it so).
local SRUN_PATH = nil  -- @render srun_path

local real = slurm
local DEVICE_OPTIONS = { "gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket" }

-- Whether a device option names gpumem or gpucore (the hook leaves every other request alone),
-- and whether one may name a gpu type (a value with a letter: gpu:l40s:1, l40s:2).
local function asks_us(options)
  local named = false
  for _, name in ipairs(DEVICE_OPTIONS) do
    local value = options[name]
    if value ~= nil then
      value = tostring(value)
      if string.find(value, "gpumem", 1, true) or string.find(value, "gpucore", 1, true) then return true end
      named = named or string.find(value, "%a") ~= nil
    end
  end
  return false, named
end

local function srun_path()
  if SRUN_PATH then return SRUN_PATH end
  local info = debug and debug.getinfo and debug.getinfo(1, "S")
  local source = info and info.source or ""
  local dir = string.sub(source, 1, 1) == "@" and string.match(string.sub(source, 2), "^(.*)/[^/]*$")
  return (dir or ".") .. "/slurm_hetero_srun.lua"
end

local decide = nil  -- slurm_hetero_srun.lua's function, loaded once per command

-- This srun's het components with a device but no gpumem/gpucore (`srun --gres=gpu:l40s:1 A :
-- --gres=gpumem:20G B`) or a -w (slurmctld excludes its hosts from the other components), for the
-- srun half to count their nodes as taken, as the hook does: srun calls the filter once per
-- component, offset 0 first, and reuses neither options table.
local COUNTS = { "nodes", "ntasks", "ntasks-per-node", "nodelist", "exclude", "constraint", "cpus-per-task",
                 "cpus-per-gpu", "mem", "mem-per-cpu", "mem-per-gpu", "tres-per-task" }
local earlier = {}

local function remember(options, offset)
  local seen = { offset = offset }
  for _, name in ipairs(DEVICE_OPTIONS) do seen[name] = options[name] end
  for _, name in ipairs(COUNTS) do seen[name] = options[name] end
  if real.json_cli_options then seen.set = real.json_cli_options(options) end
  earlier[#earlier + 1] = seen
end

function slurm_cli_setup_defaults(options, early_pass)
  return real.SUCCESS
end

local function pre_submit(options, offset)
  -- the plugin names its client in options.type (22.05, 24.11); only srun creates a step from
  -- these very options (without a type, slurm_hetero_srun.lua asks /proc/self/status)
  local kind = options["type"]
  if kind ~= nil and kind ~= "srun" then return real.SUCCESS end
  if offset == 0 then earlier = {} end
  local asked, named = asks_us(options)
  if not asked then
    -- after a component decided here, the srun half checks it as the hook would (het_typed)
    if decide and offset and offset > 0 then return decide(options, offset, earlier) end
    if offset and (named or options["nodelist"]) then remember(options, offset) end
    return real.SUCCESS
  end
  decide = decide or dofile(srun_path())
  return decide(options, offset, earlier)
end

function slurm_cli_pre_submit(options, pack_offset)
  local ok, rc = pcall(pre_submit, options, pack_offset)
  slurm = real
  if not ok then
    if real.log_debug then real.log_debug("slurm_hetero cli_filter: %s", tostring(rc)) end
    return real.SUCCESS
  end
  return rc
end

function slurm_cli_post_submit(offset, job_id, step_id)
  return real.SUCCESS
end

return real.SUCCESS
