-- Concurrency slots (seed 002's concurrent requests limiter, as leases): a sorted set of
-- lease ids scored by their deadline in µs. A lease is live while its deadline is after now;
-- expired ones (a process died holding them) are dropped when a slot is taken. The lease id
-- comes from the caller (ARGV[3], random), so the caller can renew and release it.
-- Rust twin: src/algorithm/concurrency.rs.
--
-- Fragments of the generated check script (see check.lua), for the limit $x: $n its count,
-- $w the lease (µs), $key its sorted set, $ttl the key's TTL in ms after a slot is taken
-- (the lease, rounded up, plus 1 ms). The key outlives its last deadline: taking a slot sets
-- the TTL to the lease, never shortening it (GT) when the key already holds live leases.

--@ prepare
-- leases whose deadline is after now are live
local live$x = string.format('(%d', now)
local deadline$x = string.format('%d', now + $w)
-- per identifier j: live leases, when a denied request may retry
local L$x = {}

--@ evaluate
  do
    local used = redis.call('ZCOUNT', $key, live$x, '+inf')
    local retry = 0
    if used >= $n then
      ok = false
      -- Slots free up when requests finish, which nobody can predict: suggest retrying in a
      -- second, or at the earliest lease deadline if that comes sooner.
      local first = redis.call('ZRANGEBYSCORE', $key, live$x, '+inf', 'WITHSCORES', 'LIMIT', '0', '1')
      retry = math.min(tonumber(first[2]), now + 1000000)
    end
    L$x[2 * j - 1], L$x[2 * j] = used, retry
  end

--@ commit
    redis.call('ZREMRANGEBYSCORE', $key, '-inf', string.sub(live$x, 2))
    redis.call('ZADD', $key, deadline$x, ARGV[3])
    if L$x[2 * j - 1] > 0 then
      redis.call('PEXPIRE', $key, '$ttl', 'GT')
    else
      redis.call('PEXPIRE', $key, '$ttl')
    end

--@ report
  do
    local used, retry = L$x[2 * j - 1], L$x[2 * j]
    if ok then
      used = used + 1
    end
    head = head .. struct.pack('<dddd', retry == 0 and 1 or 0, math.max($n - used, 0), 0, retry > 0 and retry - now or 0)
  end

--@ refund
  -- Twin: `refund`. Gives back the slot the check took: its lease id.
  redis.call('ZREM', $key, lease)
