-- tollgate's scheduler (seed 000's leaky bucket): every event of a key is given the next
-- free slot at a steady rate, across the fleet, and told how long to wait for it.
-- Rust twin: src/algorithm/schedule.rs; the calls: src/store/redis/schedule.rs.
--
-- A fixed script (not generated): prelude.lua's clock, then one of the sections below.
--
-- The rate is n events per w µs, so one interval is T = w / n µs, rarely a whole number: as
-- in gcra.lua, times are kept exactly as pairs (us, rem) meaning us + rem / n, 0 <= rem < n.
-- The key holds one such time, `tat`: when the queue is empty again (the slot after the last
-- one placed), packed as struct '<dI4' (a double, exact below 2^53, and the remainder).
--
-- Placing an event of cost c (c <= b, the burst: how many events may go at once):
--   base = max(tat, now)        the queue's end, or now when it is empty
--   next = base + c*T           the queue's new end
--   slot = max(next - b*T, now) when the event may go
-- With b = 1 and c = 1 this is seed 000's rule (slot = the last slot + T, or now), each
-- event T after the one before; a larger burst lets b go at once, then one per T (this is
-- GCRA's arrival rule, with a wait instead of a denial). The wait is slot - now rounded up
-- to the µs, so no one goes early. When it is longer than the caller's maximum, the event is
-- rejected at once and the key is left as it was: it takes no slot.

--@ schedule
-- KEYS[1]: the key. ARGV: cost, now (µs; empty to read the server clock), n, w (µs), b,
-- the longest wait (µs).
-- Returns {placed (1 or 0), wait (µs), drain (µs until the queue is empty: after the
-- placement, or as it stands when rejected), the state before (as read, or the state of an
-- empty queue at now when there was none), the state written (empty when rejected)}.
local cost, n, w, b = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local longest = tonumber(ARGV[6])
-- T = q + r / n; cost*T and b*T as pairs, without ever forming cost * w (which could pass
-- 2^53): cost, b <= 50,000,000 and r < n, so cost * r stays below 2^53
local q = math.floor(w / n)
local r = w - q * n
local kr = cost * r
local kq = math.floor(kr / n)
local cu, cr = cost * q + kq, kr - kq * n
local br = b * r
local bq = math.floor(br / n)
local tu, tr = b * q + bq, br - bq * n

local got = redis.call('GET', KEYS[1])
local old = got or struct.pack('<dI4', now, 0)
-- base = max(tat, now)
local bu, bre = now, 0
if got then
  local su, sr = struct.unpack('<dI4', got)
  if su > now or (su == now and sr > 0) then
    bu, bre = su, sr
  end
end
-- next = base + cost*T
local nu, nr = bu + cu, bre + cr
if nr >= n then
  nu, nr = nu + 1, nr - n
end
-- slot = next - b*T (the caller waits only when it lies after now)
local su, sr = nu - tu, nr - tr
if sr < 0 then
  su, sr = su - 1, sr + n
end
local wait = 0
if su > now or (su == now and sr > 0) then
  wait = su - now
  if sr > 0 then
    wait = wait + 1
  end
end
if wait > longest then
  -- rejected: nothing written; the queue drains by base
  local drain = bu - now
  if bre > 0 then
    drain = drain + 1
  end
  return {0, wait, drain, old, ''}
end
local new = struct.pack('<dI4', nu, nr)
-- the state matters until the queue is empty (next, rounded up); after that it decides as
-- no state would. TTL in ms, rounded up, plus 1 ms (Redis takes the expiry's base time when
-- the script starts, a little before TIME was read); with a caller's clock at least a minute:
-- Redis' clock, on which the TTL runs, does not follow the caller's.
local drain = nu - now
if nr > 0 then
  drain = drain + 1
end
local ms = drain + 999
ms = (ms - ms % 1000) / 1000 + 1
if not realtime and ms < 60000 then
  ms = 60000
end
redis.call('PSETEX', KEYS[1], string.format('%d', ms), new)
return {1, wait, drain, old, new}

--@ give_back
-- A waiter that gave up before its slot gives it back, when it is still the last one placed:
-- the key still holds the state its placement wrote (each placement moves the queue's end
-- strictly later, so equal bytes mean no one was placed since). The state before is put
-- back; the TTL, which covers the later state, is kept. Otherwise the slot stays used: the
-- waiters placed after it keep theirs.
-- KEYS[1]: the key. ARGV: the state the placement wrote, the state before it.
-- Returns 1 when the slot came back, else 0.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
return 1
