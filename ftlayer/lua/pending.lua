-- pending: which of the given records are still pending (neither completed nor failed).
-- KEYS: ck
-- ARGV: prefix, sids
--   sids: packed 8-byte
-- Returns: a string with one byte per sid, '1' if pending, else '0'. Read-only; one HGET per chunk.
local sids, out, cache = ARGV[2], {}, {}
for pos = 1, #sids - 7, 8 do
  local key = string.sub(sids, pos, pos + KEY_BYTES - 1)
  local i = struct.unpack('>I2', sids, pos + KEY_BYTES)
  local st = cache[key]
  if st == nil then
    st = redis.call('HGET', KEYS[1], key) or false
    cache[key] = st
  end
  local p = '0'
  if st and i < struct.unpack('>I2', st, CK_N)
      and bit.band(string.byte(st, HDR + math.floor(i / 8) + 1), P2[i % 8 + 1]) == 0 then
    p = '1'
  end
  out[#out + 1] = p
end
return table.concat(out)
