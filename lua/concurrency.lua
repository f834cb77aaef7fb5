-- Concurrency slots (seed 002's concurrent requests limiter, as leases): a sorted set of
-- lease ids scored by their deadline in µs. A lease is live while its deadline is after now;
-- expired ones (a process died holding them) are dropped when a slot is taken. The lease id
-- comes from the caller (LEASE, random), so the caller can renew and release it.
-- Rust twin: src/algorithm/concurrency.rs.
ALG[5] = {
  load = function(key, lim)
    return { key = key }
  end,

  evaluate = function(st, lim, now, cost)
    local live = '(' .. int(now)
    local used = redis.call('ZCOUNT', st.key, live, '+inf')
    if used < lim.n then
      return true, 0
    end
    -- Slots free up when requests finish, which nobody can predict: suggest retrying in a
    -- second, or at the earliest lease deadline if that comes sooner.
    local first = redis.call('ZRANGEBYSCORE', st.key, live, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    return false, math.min(tonumber(first[2]), now + 1000000)
  end,

  commit = function(st, lim, now, cost)
    redis.call('ZREMRANGEBYSCORE', st.key, '-inf', int(now))
    redis.call('ZADD', st.key, int(now + lim.w), LEASE)
    local last = redis.call('ZRANGE', st.key, -1, -1, 'WITHSCORES')
    expire(st.key, tonumber(last[2]), now)
  end,

  report = function(st, lim, now)
    local used = redis.call('ZCOUNT', st.key, '(' .. int(now), '+inf')
    return math.max(lim.n - used, 0), 0
  end,
}
