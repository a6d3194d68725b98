-- The fields of a channel stream entry, as store_chunks (lib/filing.lua) writes them with XADD:
-- c = the packed chunk ids (KEY_BYTES each), g = the bucket gen it was written in, n = its records.

local function entry_fields(e)
  -- the packed chunk ids of stream entry e ('' if it has none) and its gen (a string; nil if none)
  local f, ids, g = e[2], '', nil
  for i = 1, #f - 1, 2 do
    if f[i] == 'c' then ids = f[i + 1] elseif f[i] == 'g' then g = f[i + 1] end
  end
  return ids, g
end
