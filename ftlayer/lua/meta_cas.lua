-- meta_cas: set a field of a source's meta if it still holds the value the caller read.
-- KEYS: meta
-- ARGV: field, expected, value
--   expected: the value the caller read; value: the new value
-- Returns: 1 if set, 0 if the field held something else (nothing changed).
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
