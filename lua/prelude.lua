-- tollgate: shared helpers for the check script.
-- Rust twin: none (Lua-only helpers; see src/algorithm/mod.rs).
--
-- The check script is this file, one file per algorithm, and check.lua, concatenated in that
-- order; the renew script is this file and renew.lua (see src/store/script.rs). All times are
-- integer microseconds held in Lua numbers (doubles, exact below 2^53); policies are
-- validated so that every product stays below that.

-- An integer as the decimal string Redis expects. tostring() would print 1.7e+15 and lose
-- digits, so every number written to Redis goes through here.
local function int(x)
  return string.format('%.0f', x)
end

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

-- The time in µs: ARGV's value when the caller gives one (tests and replays), else Redis'
-- own clock. Redis is the clock: the application servers' clocks drift, Redis' is one for all.
local function clock(arg)
  if arg ~= '' then
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Sets the key's TTL so that it outlives its state: the state stops mattering at `expires_at`
-- (µs); the TTL is that, rounded up to whole milliseconds, plus one millisecond because Redis
-- takes the expiry's base time when the script starts, a little before TIME was read.
local function expire(key, expires_at, now)
  local ms = math.ceil((expires_at - now) / 1000) + 1
  if ms < 1 then
    ms = 1
  end
  redis.call('PEXPIRE', key, int(ms))
end

-- Each algorithm fills this table with four functions:
--   load(key, lim)                 -> st   read the state (nothing written)
--   evaluate(st, lim, now, cost)   -> admitted, retry_at
--   commit(st, lim, now, cost)     charge `cost`, write the state and its TTL
--   report(st, lim, now)           -> remaining, reset_after
-- `lim` is {n = count, w = window µs, burst = largest cost}. They mirror src/algorithm/.
local ALG = {}

-- The lease id a concurrency limit takes, set by check.lua from ARGV (Redis forbids globals).
local LEASE = ''
