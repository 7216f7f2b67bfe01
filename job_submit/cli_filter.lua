--[[
cli_filter.lua: slurm-hetero's client-side filter (Slurm cli_filter/lua plugin, Lua 5.1).

The plugin compiles this file for every command, so it holds only the dispatch: sbatch and salloc
return at once (the job_submit hook decides there); srun runs slurm_hetero_srun.lua when it needs it
(needs_srun_half), so that the step gets the device too. Any error leaves the options alone.
--]]

-- Baked in by `slurm-hetero job-submit render` (the line ending in "@render"; keep it so).
local SRUN_PATH = nil  -- @render srun_path

local real = slurm
local srun_half = nil  -- slurm_hetero_srun.lua's function, loaded once per command

-- Whether srun needs its half: gpumem or gpucore in a device option; for a new job (srun reads an
-- unset --jobid as "unset"), whose het components the hook counts, also -w or a named device.
-- An unset option reads nil, or "(null)" where a release prints its empty string.
local function needs_srun_half(options)
  local new_job = not string.find(options["jobid"] or os.getenv("SLURM_JOB_ID") or "", "^%d")
  for _, name in ipairs({ "nodelist", "gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket" }) do
    local value = string.gsub(options[name] or "", "^%(null%)$", "")
    if string.find(value, "gpumem", 1, true) or string.find(value, "gpucore", 1, true)
        or new_job and string.find(value, name == "nodelist" and "." or "%a") then
      return true
    end
  end
  return false
end

local function pre_submit(options, offset)
  if not (srun_half or needs_srun_half(options)) then return real.SUCCESS end
  local beside = string.match(debug.getinfo(1, "S").source, "^@(.*/)") or "./"
  srun_half = srun_half or dofile(SRUN_PATH or beside .. "slurm_hetero_srun.lua")
  return srun_half(options, offset)
end

function slurm_cli_setup_defaults(options, early_pass)
  return real.SUCCESS
end

function slurm_cli_pre_submit(options, pack_offset)
  -- the plugin names its client in options.type (22.05, 24.11); only srun creates a step from
  -- these very options (without a type, slurm_hetero_srun.lua asks /proc/self/status)
  local kind = options["type"]
  if kind ~= nil and kind ~= "srun" then return real.SUCCESS end
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
