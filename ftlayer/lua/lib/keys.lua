-- KEYS[1..11] of every script that changes record state, bound to names (the declarations
-- list them as ftlayer.scripting.lua_script.STATE_KEYS; SourceStore.state_keys passes them in this order).
-- A script that persists sets CH_BASE to where its channel streams start in KEYS.

local K_CK, K_CI, K_CF, K_XV, K_LIVE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local K_GEN, K_BCNT, K_FAILED, K_DUE, K_STATS, K_BKT = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local CH_BASE = #KEYS  -- scripts that persist set it to where their channel streams start
