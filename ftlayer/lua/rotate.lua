-- rotate: open new timeout buckets up to a target generation; queue the expired ones for scanning.
-- KEYS: gen, lease, expq, bcnt
-- ARGV: owner, num_buckets, expected_gen, target_gen
--   owner: the owner token ('' = no lease check); expected_gen: '' = any; target_gen: '' = current
--   gen + 1
-- Returns: {1, new gen, last expired gen, previous gen} on success; {-1, gen} if the caller
-- does not hold the lease; {-2, gen} if gen differs from the expected one; {0, gen} if gen
-- already reached the target (a retry whose first reply was lost: nothing happens twice).
-- Jumping k generations at once is k rotations in one atomic step: the expired
-- generations are queued oldest first, so missed rotations are caught up in order,
-- and no record can be filed between them. Only gens >= gen + 1 - num_buckets can
-- still hold records (older ones were queued by earlier rotations): O(num_buckets).
local g = tonumber(redis.call('GET', KEYS[1]) or '0')
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[1] then return {-1, g} end
if ARGV[3] ~= '' and tonumber(ARGV[3]) ~= g then return {-2, g} end
local target = g + 1
if ARGV[4] ~= '' then target = tonumber(ARGV[4]) end
if target <= g then return {0, g} end
redis.call('SET', KEYS[1], target)
local n = tonumber(ARGV[2])
for e = math.max(0, g + 1 - n), math.min(g, target - n) do
  if redis.call('HEXISTS', KEYS[4], e) == 1 then redis.call('RPUSH', KEYS[3], e) end
end
return {1, target, target - n, g}
