local function clock_ms()
  return os.clock() * 1000
end
