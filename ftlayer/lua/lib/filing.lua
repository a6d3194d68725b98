-- Filing new chunks: PERSIST, REPLAY and REQUEUE. Input format: ftlayer.records.chunks.CHUNK_IN_HEADER.
-- Needs lib/keys.lua, lib/counts.lua and lib/chunk.lua before it.

local function parse_chunks(blob, nch)
  -- split persist input into chunk tables; nil plus an error if one is malformed or off-range
  local out, pos, size, seen = {}, 1, #blob, {}
  while pos <= size do
    if pos + CIN_HEAD - 1 > size then return nil, 'truncated chunk at byte ' .. pos end
    local key = string.sub(blob, pos, pos + KEY_BYTES - 1)
    local n, ch, present, flen = struct.unpack('>I2I2I2I4', blob, pos + KEY_BYTES)
    local b0 = pos + CIN_HEAD
    local c0 = b0 + math.floor((n + 7) / 8)
    local f0 = c0 + 8 * n
    local stop = f0 + flen - 1
    if stop > size then return nil, 'truncated chunk at byte ' .. pos end
    if n < 1 or n > CHUNK_MAX or present > n or flen < 4 * n then return nil, 'bad chunk at byte ' .. pos end
    if ch >= nch then return nil, 'channel ' .. ch .. ' out of range 0..' .. (nch - 1) end
    if seen[key] then return nil, 'chunk at byte ' .. pos .. ' is given twice' end
    seen[key] = true
    out[#out + 1] = {key = key, n = n, ch = ch, present = present, bits = string.sub(blob, b0, c0 - 1),
      cids = string.sub(blob, c0, f0 - 1), frames = string.sub(blob, f0, stop)}
    pos = stop + 1
  end
  return out
end

local function chunk_in_use(chunks)
  -- the first chunk id of the input that pending records of other ids use, or nil. A chunk that
  -- is pending with the very same records (the same initial ack values: a persist repeated) is
  -- set to file nothing (present = 0). One HMGET per 500 chunks, more only where one is pending
  for base = 1, #chunks, 500 do
    local keys = {}
    for j = base, math.min(#chunks, base + 499) do keys[#keys + 1] = chunks[j].key end
    local have = redis.call('HMGET', K_CK, unpack(keys))
    for j = 1, #keys do
      if have[j] then
        local c = chunks[base + j - 1]
        if redis.call('HGET', K_CI, c.key) ~= c.cids then return c.key end
        c.present, c.dup = 0, true
      end
    end
  end
  return nil
end

local function take_records(c, keep)
  -- keep(i) decides each record i of parsed chunk c that is not a hole; one not kept becomes a hole.
  -- A chunk already pending with the same records (chunk_in_use) files nothing and takes nothing
  if c.dup then return end
  local bits, changed = {string.byte(c.bits, 1, -1)}, false
  for i = 0, c.n - 1 do
    local b, m = math.floor(i / 8) + 1, P2[i % 8 + 1]
    if bit.band(bits[b], m) == 0 and not keep(i) then
      bits[b] = bits[b] + m
      c.present = c.present - 1
      changed = true
    end
  end
  if changed then c.bits = string.char(unpack(bits)) end
end

local function read_input(what)
  -- the persist input of ARGV[3] for ARGV[2] channels (CH_BASE set), or nil plus an error reply
  local nch = tonumber(ARGV[2])
  local chunks, err = parse_chunks(ARGV[3], nch)
  err = err or channel_keys_error(nch)
  if err then return nil, redis.error_reply('ftlayer ' .. what .. ': ' .. err) end
  return chunks
end

local function take_by_olds(chunks, olds, take_old)
  -- olds holds an 8-byte id per chunk and index, aligned with the records: take_old(id, chunk,
  -- index) decides each (chunk and index name the new record that replaces the old one)
  local at = 0
  for _, c in ipairs(chunks) do
    local base = at
    take_records(c, function(i) return take_old(string.sub(olds, base + 8 * i + 1, base + 8 * i + 8), c, i) end)
    at = at + 8 * c.n
  end
end

local function store_chunks(chunks)
  -- file parsed chunks in the current bucket and their channel streams; returns records filed, gen.
  -- One HSET per hash per 500 chunks (a call of many one-record chunks stays cheap)
  local gen = tonumber(redis.call('GET', K_GEN) or '0')
  local ids, per_ch, per_n, count = {}, {}, {}, 0
  local st, ci, cf = {}, {}, {}
  local function flush_fields()
    if #st > 0 then
      redis.call('HSET', K_CK, unpack(st))
      redis.call('HSET', K_CI, unpack(ci))
      redis.call('HSET', K_CF, unpack(cf))
      st, ci, cf = {}, {}, {}
    end
  end
  for _, c in ipairs(chunks) do
    if c.present > 0 then
      st[#st + 1] = c.key
      st[#st + 1] = struct.pack(CK_HEAD, gen, gen, c.ch, c.n, c.present, 0, 0) .. c.bits
      ci[#ci + 1] = c.key
      ci[#ci + 1] = c.cids
      cf[#cf + 1] = c.key
      cf[#cf + 1] = c.frames
      if #st >= 1000 then flush_fields() end
      ids[#ids + 1] = c.key
      local t = per_ch[c.ch]
      if t == nil then
        t = {}
        per_ch[c.ch] = t
        per_n[c.ch] = 0
      end
      t[#t + 1] = c.key
      per_n[c.ch] = per_n[c.ch] + c.present
      count = count + c.present
    end
  end
  flush_fields()
  if #ids > 0 then
    redis.call('RPUSH', K_BKT, struct.pack('>I4', gen) .. table.concat(ids))
    redis.call('HINCRBY', K_BCNT, gen, #ids)
    for ch, keys in pairs(per_ch) do
      redis.call('XADD', KEYS[CH_BASE + 1 + ch], '*', 'c', table.concat(keys), 'g', gen, 'n', per_n[ch])
    end
    LIVE = LIVE + count
  end
  return count, gen
end
