-- touch: restart the timeouts of records a slow operator is still processing (Storm's resetTimeout).
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt
-- ARGV: prefix, sids
--   sids: source record ids, n x 8 bytes
-- Returns: the chunks re-filed. Timeouts are per chunk: each still-pending chunk the ids fall in
-- moves to the current bucket with its flags cleared, so none of its records fails before
-- timeout_s from now unless it is acked or failed first. An id no longer pending is skipped, and
-- a chunk already in the current bucket stays: touching is idempotent.

--@include lib/keys.lua

--@include lib/counts.lua

--@include lib/chunk.lua

local cur = tonumber(redis.call('GET', K_GEN) or '0')
local seen, moved, blob = {}, {}, ARGV[2]
for p = 1, #blob - 7, 8 do
  local key = string.sub(blob, p, p + KEY_BYTES - 1)
  if not seen[key] then
    seen[key] = true
    local c = chunk_load(key)
    if c and c.gen ~= cur then
      bucket_done(c.gen)
      c.gen, c.flags, c.dirty = cur, 0, true
      chunk_save(c)
      moved[#moved + 1] = key
    end
  end
end
if #moved > 0 then
  redis.call('RPUSH', K_BKT, struct.pack('>I4', cur) .. table.concat(moved))
  redis.call('HINCRBY', K_BCNT, cur, #moved)
end
settle_counts()
return #moved
