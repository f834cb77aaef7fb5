-- Concurrency slots (seed 002's concurrent requests limiter, as leases): a sorted set of
-- lease ids scored by their deadline in µs. A lease is live while its deadline is after now;
-- expired ones (a process died holding them) are dropped when a slot is taken. The lease id
-- comes from the caller (ARGV[3], random), so the caller can renew and release it.
-- Rust twin: src/algorithm/concurrency.rs.
--
-- Fragments of the generated check script (see check.lua), for the limit $x: $n its count,
-- $w the lease (µs), $key its sorted set, $life the key's TTL in ms after a slot is taken
-- (the lease, rounded up, plus 1 ms; with a caller's clock at least a minute, as every key's:
-- Redis' clock, on which the TTL runs, does not follow the caller's). The key outlives its
-- last deadline: taking a slot sets the TTL to the lease, never shortening it (GT) when the
-- key already holds live leases.
--
-- The reply carries what was read as text, "<used>,<deadline>;" (used: the live leases, left
-- out when denied, as then at least n are live; deadline: the earliest live lease's, as
-- Redis wrote the score, when denied), and the client derives the figures from it with the
-- twin (`settle`), as for a sliding log (sliding_log.lua).

--@ prepare
-- leases whose deadline is after now are live
local live$x = string.format('(%d', now)
-- per identifier j: the reply's record (one string: tables cost Redis more to fill)
local L$x = {''}

--@ evaluate
  do
    local used = redis.call('ZCOUNT', $key, live$x, '+inf')
    if used >= $n then
      ok = false
      -- Slots free up when requests finish, which nobody can predict: the client suggests
      -- retrying in a second, or at the earliest live deadline if that comes sooner (the
      -- live leases are those of the latest deadlines: the earliest is the used-th latest)
      local r = '-' .. used
      L$x[j] = ',' .. redis.call('ZRANGE', $key, r, r, 'WITHSCORES')[2] .. ';'
    else
      L$x[j] = used .. ',;'
    end
  end

--@ commit
    do
      -- admitted: the record is "<used>,;"
      redis.call('ZREMRANGEBYSCORE', $key, '-inf', string.sub(live$x, 2))
      redis.call('ZADD', $key, string.format('%d', now + $w), ARGV[3])
      if L$x[j] ~= '0,;' then
        redis.call('PEXPIRE', $key, $life, 'GT')
      else
        redis.call('PEXPIRE', $key, $life)
      end
    end

--@ report
  head = head .. L$x[j]

--@ refund
  -- Twin: `refund`. Gives back the slot the check took: its lease id.
  redis.call('ZREM', $key, lease)
