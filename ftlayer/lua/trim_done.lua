-- trim_done: drop the head of a channel stream whose chunks are all settled, bounded.
-- KEYS: ch:*, ck
--   ch:*: the channel stream
-- ARGV: max_entries, max_chunks, budget_ms
--   max_entries: stream entries to examine; max_chunks: chunks to examine; budget_ms: time budget
-- Returns: {entries removed, 1 if a limit stopped the call before a pending chunk or the
-- end of the stream (call again to go on), else 0}. Stops at the first entry that still
-- names a pending chunk. Safe at any time: an entry whose chunks all settled would be read
-- as empty anyway (readers skip chunks not in ck), and readers address ranges by stream id,
-- which trimming does not change. An entry is removed only once all its chunks were checked,
-- so a call cut short removes only whole finished entries.

--@include lib/clock.lua

--@include lib/entry.lua

local max_e, max_n, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t0, n, ents, fetch, from = clock_ms(), 0, 0, 4, '-'
local done_upto, keep, more = nil, false, 0
while not keep and ents < max_e do
  local entries = redis.call('XRANGE', KEYS[1], from, '+', 'COUNT', math.min(fetch, max_e - ents))
  if #entries == 0 then break end
  fetch = math.min(fetch * 2, 256)
  for _, e in ipairs(entries) do
    local ids = entry_fields(e)
    local left = math.floor(#ids / KEY_BYTES)
    if n > 0 and (n + left > max_n or clock_ms() - t0 >= budget) then more = 1; keep = true; break end
    for p = 1, #ids - KEY_BYTES + 1, KEY_BYTES do
      if redis.call('HEXISTS', KEYS[2], string.sub(ids, p, p + KEY_BYTES - 1)) == 1 then keep = true; break end
    end
    if keep then break end
    n, ents, done_upto = n + left, ents + 1, e[1]
  end
  if done_upto then from = '(' .. done_upto end
end
if not keep and ents >= max_e then more = 1 end
if not done_upto then return {0, more} end
local ms, seq = string.match(done_upto, '(%d+)-(%d+)')
return {redis.call('XTRIM', KEYS[1], 'MINID', ms .. '-' .. (tonumber(seq) + 1)), more}
