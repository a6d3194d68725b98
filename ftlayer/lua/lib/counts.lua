-- Buckets and counts. Every change to the pending-record count (LIVE) and to a bucket
-- generation's live-chunk count (bucket_done) is gathered during a script and applied once by
-- settle_counts, which every script that settles or files records calls before it returns.

local LEFT_BUCKET, LIVE = {}, 0
local function bucket_done(g)
  -- a chunk filed in bucket g left it (all its records settled, or it was re-filed elsewhere)
  LEFT_BUCKET[g] = (LEFT_BUCKET[g] or 0) + 1
end

local HEAD_DROP_MAX = 1024  -- bucket elements one call may drop (bounded script time)

local function drop_done_heads()
  -- pop the head elements of `bkt` whose bucket has no live chunk left. Elements are in
  -- generation order, so buckets that completed leave from the head; one behind an older
  -- bucket still live waits for it (or for EXPIRE)
  local live = {}
  for _ = 1, HEAD_DROP_MAX do
    local e = redis.call('LINDEX', K_BKT, 0)
    if not e then return end
    local g = struct.unpack('>I4', e)
    if live[g] == nil then live[g] = redis.call('HEXISTS', K_BCNT, g) == 1 end
    if live[g] then return end
    redis.call('LPOP', K_BKT)
  end
end

local function settle_counts()
  -- one HINCRBY per bucket touched and one INCRBY of the pending count (not per record)
  local emptied = false
  for g, n in pairs(LEFT_BUCKET) do
    if redis.call('HINCRBY', K_BCNT, g, -n) <= 0 then
      redis.call('HDEL', K_BCNT, g)
      emptied = true
    end
  end
  LEFT_BUCKET = {}
  if LIVE ~= 0 then
    redis.call('INCRBY', K_LIVE, LIVE)
    LIVE = 0
  end
  if emptied then drop_done_heads() end
end

local function channel_keys_error(nch)
  -- nil if KEYS declares a stream for each of nch channels after CH_BASE, else why not
  if #KEYS < CH_BASE + nch then
    return 'KEYS declares ' .. (#KEYS - CH_BASE) .. ' channel streams for ' .. nch .. ' channels'
  end
  return nil
end

local NO_REPLAY = 32768  -- top bit of a reason length: dead-letter without replays
-- an rpl value's first 8 bytes in place of a copy's id: a row function failed the record after its
-- timeout (FLUSH), so its batch may not complete it late and REPLAY links no copy to it
local NO_LINK = string.rep('\255', 8)
