-- rescale: empty the channel streams of a drained shard, so its channel count may change.
-- KEYS: ck, failed, live, ch:*...
--   ch:*...: the channel streams ch:0 .. ch:<recorded count - 1>
-- ARGV: (none)
-- Returns: {1, 0, 0} if the shard is drained (nothing pending, nothing failed and waiting for a
-- replay) and its streams are now empty; {0, pending records, failed} if records are still in
-- flight (nothing changed). Emptied streams can only name settled chunks; their last ids stay,
-- so readers never go back. The caller then changes the count in `meta` (META_CAS).
local chunks, failed = redis.call('HLEN', KEYS[1]), redis.call('HLEN', KEYS[2])
if chunks > 0 or failed > 0 then return {0, tonumber(redis.call('GET', KEYS[3]) or '0'), failed} end
for i = 4, #KEYS do redis.call('XTRIM', KEYS[i], 'MAXLEN', 0) end
return {1, 0, 0}
