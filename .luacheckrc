-- luacheck's configuration for the server-side scripts (scripts/test runs `luacheck ftlayer/lua`
-- from the repository root; Debian's package lua-check).
--
-- The scripts run in the Lua 5.1 of Redis/Valkey, which adds the globals below. A script is
-- assembled (ftlayer/scripting/lua_source.py) from the generated layout (ftlayer/scripting/lua_layout.py), then its
-- file with each `--@include lib/<file>.lua` line replaced by that library file, so the names a
-- file may use without defining them are read here from the same sources, not listed by hand:
-- the `local` names of the layout, and the top-level `local` names of each library file it
-- includes. A library file may use the names of the layout and of the other library files; its
-- own top-level names are its exports, used by the scripts (not "unused").

std = "lua51"
max_line_length = 120
local SERVER = { "redis", "KEYS", "ARGV", "cjson", "cmsgpack", "bit", "struct" }  -- what Redis/Valkey add

local LUA = "ftlayer/lua/"

local function lines_of(path)
  local f = io.open(path)
  if not f then error(".luacheckrc: cannot read " .. path .. " (run luacheck from the repository root)") end
  local out = {}
  for line in f:lines() do out[#out + 1] = line end
  f:close()
  return out
end

local function top_level_names(path)
  -- the names a file defines at its top level: `local function name` and `local a, b = ...`
  local names = {}
  for _, line in ipairs(lines_of(path)) do
    local fn = line:match("^local function ([%w_]+)")
    local list = line:match("^local ([%w_, ]+) =")
    if fn then names[#names + 1] = fn end
    if list then
      for name in list:gmatch("[%w_]+") do names[#names + 1] = name end
    end
  end
  return names
end

local layout = top_level_names("ftlayer/scripting/lua_layout.py")
if #layout == 0 then error(".luacheckrc: no layout names found in ftlayer/scripting/lua_layout.py") end
read_globals = {}
for _, n in ipairs(SERVER) do read_globals[#read_globals + 1] = n end
for _, n in ipairs(layout) do read_globals[#read_globals + 1] = n end

local lfs = require("lfs")
local exports, libs = {}, {}
for name in lfs.dir(LUA .. "lib") do
  if name:match("%.lua$") then
    libs[#libs + 1] = name
    exports[name] = top_level_names(LUA .. "lib/" .. name)
  end
end

for _, lib in ipairs(libs) do
  local others, own = {}, {}
  for _, other in ipairs(libs) do
    if other ~= lib then
      for _, n in ipairs(exports[other]) do others[#others + 1] = n end
    end
  end
  for _, n in ipairs(exports[lib]) do own[#own + 1] = "211/" .. n end
  files[LUA .. "lib/" .. lib] = { globals = others, ignore = own }
end

for name in lfs.dir(LUA) do
  if name:match("%.lua$") then
    local names = {}
    for _, line in ipairs(lines_of(LUA .. name)) do
      local lib = line:match("^%-%-@include lib/([%w_]+%.lua)%s*$")
      if lib then
        if not exports[lib] then error(".luacheckrc: " .. name .. " includes a missing lib/" .. lib) end
        for _, n in ipairs(exports[lib]) do names[#names + 1] = n end
      end
    end
    files[LUA .. name] = { globals = names }
  end
end
