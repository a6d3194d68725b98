-- read_channel: the chunks of one channel between two stream positions that still hold pending
-- records, bounded.
-- KEYS: ch:*, ck, cf, rd, hld:*?, dfs:*?
--   ch:*: the channel stream; rd: read watermarks; hld:<tag> (optional): the running batch's hold set;
--   dfs:<tag> (optional, with hld:*): the batch's read notes (DataFrame path)
-- ARGV: start_id, start_skip, end_id, max_entries, max_records, max_bytes, budget_ms, channel, hold_ttl_ms,
--       start_chunk?, end_chunk?, skips_ttl_ms?, first_call?
--   start_id: '-' = from the beginning; start_skip: chunks of the start entry already read (0 = all
--   of it: the read begins after it; k > 0: it begins at the entry's (k+1)-th chunk); end_id:
--   inclusive, '+' = to the end; max_entries: stream entries; max_records: records to examine;
--   max_bytes: frame bytes to return; budget_ms: time budget; hold_ttl_ms: hold set ttl (with
--   hld:*); start_chunk: chunk id ('' = none: with skip 0 the read begins at that chunk of the start
--   entry, which it includes); end_chunk: chunk id ('' = none: the end entry is read up to that
--   chunk, included); skips_ttl_ms: dfs:* ttl (with dfs:*); first_call: '1' if this call begins a
--   read (a read task's first page of the channel), else '0'
-- Returns: {cursor id ('' if no entry was read), chunks of the cursor entry read (0 = all),
-- chunk id, state, frames, chunk id, state, frames, ...}: per chunk still pending, its id, its
-- `ck` state (header and settled bitmap) and its `cf` frames, as stored. The reader skips the
-- settled records itself (no work per record here), so a re-run batch re-reads exactly the
-- records of its range that still need processing. The call stops at the first limit reached
-- (after at least one chunk); passing the cursor back as the start reads on with the next chunk,
-- so a range is read whole, in order, each chunk once, however it is cut. Entries are fetched a
-- few at a time (doubling).
-- The channel's read watermark (`rd`) moves up to the cursor entry, the last entry this call
-- finished or entered (never back): its chunks count as handed to a task (see EXPIRE).
-- With a hold set, every chunk returned joins it: EXPIRE postpones their timeouts while the
-- hold lasts (a re-read adds nothing new: it is a set).
-- With dfs:<tag> (the batch's read notes), for BATCH_SETTLE's late completion, which must complete
-- late only records every read of the batch handed on (a foreachBatch function with two actions,
-- a task's retry and the re-run of an uncommitted batch each read a partition again, and a record
-- that timed out in between is no longer pending: that read skips it, and the output written from
-- it may lack it):
--   field <chunk id>: the records of that chunk of the range this read found no longer pending,
--     ORed over the reads ('*': the chunk was gone whole);
--   field 'r'<channel>: the reads of the channel's partition (counted by each read's first call);
--   field 'n'<chunk id>: channel * 2^24 + the reads that returned the chunk. A chunk whose records
--     all settled and whose entry was trimmed before a read is in no entry that read sees: it
--     returned the chunk fewer times than the partition was read.

--@include lib/clock.lua

--@include lib/entry.lua

local start, skip, last_id = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local max_e, max_n, max_b, budget = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local start_chunk, end_chunk = ARGV[10] or '', ARGV[11] or ''
local from = start
if start == '-' then
  skip = 0
elseif skip == 0 and start_chunk == '' then
  from = '(' .. start
end

local K_DFS = KEYS[6]
local dfs_touched = false
if K_DFS and ARGV[13] == '1' then
  redis.call('HINCRBY', K_DFS, 'r' .. ARGV[8], 1)
  dfs_touched = true
end
local function note_read(key, st)
  -- dfs:<tag>: count the chunk's read, and note its records this read does not hand on
  if not st then
    redis.call('HSET', K_DFS, key, '*')
    dfs_touched = true
    return
  end
  if redis.call('HSETNX', K_DFS, 'n' .. key, tonumber(ARGV[8]) * 16777216 + 1) == 0 then
    redis.call('HINCRBY', K_DFS, 'n' .. key, 1)
  end
  dfs_touched = true
  local bm = string.sub(st, HDR + 1, HDR + math.floor((struct.unpack('>I2', st, CK_N) + 7) / 8))
  if not string.find(bm, '[^%z]') then return end  -- every record of the chunk pending: the usual case
  local old = redis.call('HGET', K_DFS, key)
  if old == '*' then return end
  if old then
    local merged = {}
    for b = 1, #bm do merged[b] = string.char(bit.bor(string.byte(bm, b), string.byte(old, b) or 0)) end
    bm = table.concat(merged)
  end
  redis.call('HSET', K_DFS, key, bm)
end

local function chunk_pos(ids, key)
  for q = 1, #ids - KEY_BYTES + 1, KEY_BYTES do
    if string.sub(ids, q, q + KEY_BYTES - 1) == key then return (q - 1) / KEY_BYTES end
  end
  return nil
end
local t0, out, n, bytes, ents, fetch, done = clock_ms(), {'', 0}, 0, 0, 0, 4, false
local mark_g = nil
while not done and ents < max_e do
  local entries = redis.call('XRANGE', KEYS[1], from, last_id, 'COUNT', math.min(fetch, max_e - ents))
  if #entries == 0 then break end
  fetch = math.min(fetch * 2, 256)
  for _, e in ipairs(entries) do
    ents = ents + 1
    local ids, g = entry_fields(e)
    local total, pos = math.floor(#ids / KEY_BYTES), 0
    if skip > 0 and e[1] == start then
      pos = skip
    elseif start_chunk ~= '' and e[1] == start then
      pos = chunk_pos(ids, start_chunk) or 0
    end
    skip = 0
    local stop_at = total
    if end_chunk ~= '' and e[1] == last_id then stop_at = (chunk_pos(ids, end_chunk) or (total - 1)) + 1 end
    while pos < stop_at do
      local key = string.sub(ids, KEY_BYTES * pos + 1, KEY_BYTES * (pos + 1))
      pos = pos + 1
      local st = redis.call('HGET', KEYS[2], key)
      if K_DFS then note_read(key, st) end
      if not st then n = n + 1 end  -- a settled chunk costs one look-up: count it as one record
      if st then
        local fr = redis.call('HGET', KEYS[3], key) or ''
        out[#out + 1] = key
        out[#out + 1] = st
        out[#out + 1] = fr
        bytes = bytes + #fr
        n = n + struct.unpack('>I2', st, CK_N)
      end
      if n >= max_n or bytes >= max_b or clock_ms() - t0 >= budget then done = true; break end
    end
    out[1] = e[1]
    mark_g = g or '2147483648'  -- an entry written without its gen: count everything before it as read
    if pos < stop_at then out[2] = pos else out[2] = 0 end
    if done then break end
  end
  from = '(' .. out[1]
end
if mark_g then
  local mark = redis.call('HGET', KEYS[4], ARGV[8])
  local newer = not mark
  if mark then
    local mm, ms = string.match(mark, ' (%d+)-(%d+)$')
    local lm, ls = string.match(out[1], '^(%d+)-(%d+)$')
    mm, ms, lm, ls = tonumber(mm), tonumber(ms), tonumber(lm), tonumber(ls)
    newer = lm > mm or (lm == mm and ls > ms)
  end
  if newer then redis.call('HSET', KEYS[4], ARGV[8], mark_g .. ' ' .. out[1]) end
end
if KEYS[5] and #out > 2 then
  local batch = {}
  for i = 3, #out, 3 do
    batch[#batch + 1] = out[i]
    if #batch == 1000 then redis.call('SADD', KEYS[5], unpack(batch)); batch = {} end
  end
  if #batch > 0 then redis.call('SADD', KEYS[5], unpack(batch)) end
  redis.call('PEXPIRE', KEYS[5], ARGV[9])
end
if dfs_touched then redis.call('PEXPIRE', K_DFS, ARGV[12]) end
return out
