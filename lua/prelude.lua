-- tollgate: the helpers every generated check script starts with.
-- Rust twin: none (Lua-only helpers; see src/algorithm/mod.rs).
--
-- The check script is generated per policy from this file, one fragment file per algorithm
-- and check.lua (see check.lua and src/store/script.rs); the renew script is this file and
-- renew.lua. All times are integer microseconds held in Lua numbers (doubles, exact below
-- 2^53); policies are validated so that every product stays below that.
--
-- Numbers handed to redis.call() are formatted by Redis with %.17g, slowly: the scripts pass
-- strings where they can (string.format('%d', x), exact for integers below 2^53), and
-- constants are written into the script as string literals by the generator.

--@ helpers
-- Floor division of non-negative integers, exact even where a/b rounds up to an integer.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

--@ clock
-- The time in µs: ARGV[1] when the caller gives one (tests and replays), else Redis' own
-- clock. Redis is the clock: the application servers' clocks drift, Redis' is one for all.
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(ARGV[1])
end
