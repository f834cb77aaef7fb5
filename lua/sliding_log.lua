-- Sliding log (seeds 000, 001, 004): a sorted set of admitted cost units scored by their time
-- in µs. The rolling window at `now` is the half-open interval (now - w, now]; an entry at
-- exactly now - w has left it. Members are "<time>-<k>", k counting the entries already at
-- that time, so two requests in the same microsecond are two entries.
-- Rust twin: src/algorithm/sliding_log.rs.
ALG[1] = {
  load = function(key, lim)
    return { key = key }
  end,

  evaluate = function(st, lim, now, cost)
    local floor = '(' .. int(now - lim.w)
    local used = redis.call('ZCOUNT', st.key, floor, '+inf')
    if used + cost <= lim.n then
      return true, 0
    end
    -- The (used + cost - n)-th oldest live entry must leave the window first.
    local k = used + cost - lim.n
    local e = redis.call('ZRANGEBYSCORE', st.key, floor, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
    return false, tonumber(e[2]) + lim.w
  end,

  commit = function(st, lim, now, cost)
    redis.call('ZREMRANGEBYSCORE', st.key, '-inf', int(now - lim.w))
    local t = int(now)
    local k = redis.call('ZCOUNT', st.key, t, t)
    -- ZADD in batches: unpack() of a large cost would overflow Lua's C stack.
    local j = 1
    while j <= cost do
      local args = {}
      for m = j, math.min(j + 499, cost) do
        args[#args + 1] = t
        args[#args + 1] = t .. '-' .. (k + m)
      end
      redis.call('ZADD', st.key, unpack(args))
      j = j + 500
    end
    local newest = redis.call('ZRANGE', st.key, -1, -1, 'WITHSCORES')
    expire(st.key, tonumber(newest[2]) + lim.w, now)
  end,

  report = function(st, lim, now)
    local used = redis.call('ZCOUNT', st.key, '(' .. int(now - lim.w), '+inf')
    if used == 0 then
      return lim.burst, 0
    end
    local newest = redis.call('ZRANGE', st.key, -1, -1, 'WITHSCORES')
    return math.max(lim.n - used, 0), math.max(tonumber(newest[2]) + lim.w - now, 0)
  end,
}
