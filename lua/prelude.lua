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
--
-- Floor division needs no correction: for integers 0 <= a < 2^53 and b >= 1, the double a / b
-- is never rounded up to the next integer (that would take an error of at least 1 / b, while
-- the rounding error is below a / b * 2^-53 < 1 / b), so math.floor(a / b) and a % b are
-- exact.

--@ clock
-- The time in µs: ARGV[1] when the caller gives one (tests and replays), else Redis' own
-- clock. Redis is the clock: the application servers' clocks drift, Redis' is one for all.
-- `sec` and `usec` give the same time as text for the reply ("SECONDS,MICROSECONDS"):
-- formatting a number costs more than passing on the strings TIME returns.
local now, sec, usec
if ARGV[1] == '' then
  local t = redis.call('TIME')
  sec, usec = t[1], t[2]
  now = sec * 1000000 + usec
else
  now = tonumber(ARGV[1])
  sec, usec = '0', ARGV[1]
end
