-- persist: file a batch of source records, chunk by chunk, atomically, at most once per call token.
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt, tok:*, ch:*[num_channels]
--   tok:* is the call token (tok:p:<hash of the input>); ch:* the channel streams ch:0 .. ch:<num_channels - 1>
-- ARGV: prefix, num_channels, chunks, token_ttl_ms
--   chunks: ftlayer.records.chunks persist input, concatenated
-- Returns: {records filed, bucket gen}; {-1, chunk id} if a chunk id of the input is already in
-- use (nothing is written: the caller draws new ids). A retried call (its token exists) files
-- nothing: its records were filed by the first call and may since have been read, processed and
-- acked. A call whose writes a failover lost lost its token with them, so its retry files them again.
-- Error (nothing written) if a chunk is malformed or its channel >= num_channels.

--@include lib/keys.lua

--@include lib/counts.lua

--@include lib/chunk.lua

--@include lib/filing.lua

CH_BASE = 12
local chunks, bad = read_input('persist')
if not chunks then return bad end
if redis.call('EXISTS', KEYS[12]) == 1 then
  redis.call('HINCRBY', K_STATS, 'persisted', 0)  -- a write all the same: see the note in REPLAY
  return {0, tonumber(redis.call('GET', K_GEN) or '0')}
end
local used = chunk_in_use(chunks)
if used then return {-1, used} end
redis.call('SET', KEYS[12], '1', 'PX', ARGV[4])
local count, gen = store_chunks(chunks)
settle_counts()
redis.call('HINCRBY', K_STATS, 'persisted', count)  -- even 0: see REPLAY (a retry's wait covers the first call)
return {count, gen}
