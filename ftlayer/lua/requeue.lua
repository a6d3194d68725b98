-- requeue: move dead letters back into their channel streams as new source records.
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt, dlq, ch:*[num_channels]
--   ch:*: the channel streams ch:0 .. ch:<num_channels - 1>
-- ARGV: prefix, num_channels, chunks, entry_ids
--   chunks: persist input of the new records; entry_ids: per chunk, per index, [entry id length
--   u16][entry id], length 0 for a hole
-- Returns: records requeued, or {-1, chunk id} if a new chunk id is in use (nothing written).
-- Per record, atomically: if XDEL removed the dead letter, its new frame is filed like a new
-- record (chunk, current bucket, channel stream); an entry already gone (purged, requeued
-- elsewhere) leaves a hole. Error (nothing written) if the input is malformed.

--@include lib/keys.lua

--@include lib/counts.lua

--@include lib/chunk.lua

--@include lib/filing.lua

CH_BASE = 12
local chunks, bad = read_input('requeue')
if not chunks then return bad end
local ids, pos, eids = ARGV[4], 1, {}
for _, c in ipairs(chunks) do
  local mine = {}
  for i = 0, c.n - 1 do
    if pos + 1 > #ids then return redis.error_reply('ftlayer requeue: entry ids end at byte ' .. pos) end
    local len = struct.unpack('>I2', ids, pos)
    mine[i] = string.sub(ids, pos + 2, pos + 1 + len)
    pos = pos + 2 + len
  end
  eids[#eids + 1] = mine
end
local used = chunk_in_use(chunks)
if used then return {-1, used} end
for k, c in ipairs(chunks) do
  take_records(c, function(i)
    local eid = eids[k][i]
    return eid ~= '' and redis.call('XDEL', KEYS[12], eid) == 1
  end)
end
local count = store_chunks(chunks)
settle_counts()
redis.call('HINCRBY', K_STATS, 'requeued', count)  -- even 0: see REPLAY (a retry's wait covers the first call)
return count
