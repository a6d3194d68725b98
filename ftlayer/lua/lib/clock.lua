-- The server's CPU time inside a script. TIME cannot serve: the server freezes it for the
-- whole script. The bounded scripts (see ftlayer.scripting.script_bounds) stop once their budget is spent.

local function clock_ms()
  return os.clock() * 1000
end
