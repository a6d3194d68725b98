-- migrate: move records of a layout-format-2 source (one `pend` entry each) into chunks.
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt, pend, ch:*[num_channels]
--   ch:*: the channel streams ch:0 .. ch:<num_channels - 1>
-- ARGV: prefix, num_channels, chunks, olds
--   chunks: persist input of the records under new ids; olds: per chunk, per index, the record's
--   format-2 sid, 8 bytes
-- Returns: records moved; {-1, chunk id} if a new chunk id is in use while some old id is still in
-- `pend` (nothing written: draw new ids). Per record, atomically: if HDEL removed the old entry,
-- the record is filed under its new id; else (moved by an earlier call) it is a hole. A retried
-- call whose records all moved returns 0.

--@include lib/keys.lua

--@include lib/counts.lua

--@include lib/chunk.lua

--@include lib/filing.lua

CH_BASE = 12
local chunks, bad = read_input('migrate')
if not chunks then return bad end
local olds = ARGV[4]
local used = chunk_in_use(chunks)
if used then
  for p = 1, #olds - 7, 8 do
    if redis.call('HEXISTS', KEYS[12], string.sub(olds, p, p + 7)) == 1 then return {-1, used} end
  end
  return 0
end
take_by_olds(chunks, olds, function(old) return redis.call('HDEL', KEYS[12], old) == 1 end)
local count = store_chunks(chunks)
settle_counts()
return count
