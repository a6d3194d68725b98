-- dead_letter: set aside one record that never became pending, at most once.
-- KEYS: dlq, stats, tok:*
--   tok:* is the guard key (tok:dl:<source_record_id>)
-- ARGV: sid, now_ms, reason, frame, guard_ttl_ms
--   sid: the source_record_id (8 bytes)
-- Returns: the dlq entry id. A retried call (the guard exists) appends nothing and
-- returns the entry id of the call that did, so a lost reply cannot add a second entry.
local prev = redis.call('GET', KEYS[3])
if prev then return prev end
local id = redis.call('XADD', KEYS[1], '*', 'sid', ARGV[1], 'failed_ms', ARGV[2], 'dead_ms', ARGV[2],
  'reason', ARGV[3], 'frame', ARGV[4])
redis.call('SET', KEYS[3], id, 'PX', ARGV[5])
redis.call('HINCRBY', KEYS[2], 'dead_lettered', 1)
return id
