-- Sliding log (seeds 000, 001, 004): a sorted set of admitted cost units scored by their time
-- in µs. The rolling window at `now` is the half-open interval (now - w, now]; an entry at
-- exactly now - w has left it. Members are "<time>-<k>", k counting the entries already at
-- that time, so two requests in the same microsecond are two entries.
-- Rust twin: src/algorithm/sliding_log.rs.
--
-- Fragments of the generated check script (see check.lua), for the limit $x: $n its count,
-- $w its window (µs), $key its sorted set, $life the key's TTL in ms after a charge (the
-- window, rounded up, plus 1 ms: see `expires` in check.lua's header). The key outlives its
-- newest entry by the window: a charge sets the TTL to the window, never shortening it (GT)
-- when the key already holds live entries.

--@ prepare
-- entries after now - w are live
local live$x = string.format('(%d', now - $w)
-- per identifier j: live entries, the newest one's time, when a denied cost fits
local L$x = {}

--@ evaluate
  do
    local used = redis.call('ZCOUNT', $key, live$x, '+inf')
    local newest, retry = 0, 0
    if used > 0 then
      -- the newest entry's time, read from its member (fetching scores costs more)
      newest = tonumber(string.match(redis.call('ZRANGE', $key, '-1', '-1')[1], '^%d+'))
    end
    if used + cost > $n then
      ok = false
      -- the (used + cost - n)-th oldest live entry must leave the window first
      local k = used + cost - $n - 1
      k = k == 0 and '0' or string.format('%d', k)
      local e = redis.call('ZRANGEBYSCORE', $key, live$x, '+inf', 'LIMIT', k, '1')
      retry = tonumber(string.match(e[1], '^%d+')) + $w
    end
    L$x[3 * j - 2], L$x[3 * j - 1], L$x[3 * j] = used, newest, retry
  end

--@ commit
    do
      -- the entries out of the window by the clock's time ($cut: from live$x, or for a check
      -- admitted as of a later time, reserve.lua, from `real`)
      redis.call('ZREMRANGEBYSCORE', $key, '-inf', $cut)
      local at = string.format('%d', now)
      local k = 0
      if L$x[3 * j - 1] >= now then
        k = redis.call('ZCOUNT', $key, at, at)
      end
      if cost == 1 then
        redis.call('ZADD', $key, at, at .. '-' .. (k + 1))
      else
        -- in batches: unpack() of a large cost would overflow Lua's C stack
        local m = 1
        while m <= cost do
          local args = {}
          for u = m, math.min(m + 499, cost) do
            args[#args + 1] = at
            args[#args + 1] = at .. '-' .. (k + u)
          end
          redis.call('ZADD', $key, unpack(args))
          m = m + 500
        end
      end
      -- $life: the TTL, longer by the wait for a check admitted as of a later time
      if L$x[3 * j - 2] > 0 then
        redis.call('PEXPIRE', $key, $life, 'GT')
      else
        redis.call('PEXPIRE', $key, $life)
      end
    end

--@ report
  do
    local used, newest, retry = L$x[3 * j - 2], L$x[3 * j - 1], L$x[3 * j]
    if ok then
      used = used + cost
      if newest < now then
        newest = now
      end
    end
    local remaining, reset = $n, 0
    if used > 0 then
      remaining = math.max($n - used, 0)
      reset = math.max(newest + $w - now, 0)
    end
    head = head .. struct.pack('<dddd', retry == 0 and 1 or 0, remaining, reset, retry > 0 and retry - now or 0)
  end

--@ refund
  -- Twin: `refund`. Removes up to `cost` entries scored `at` (entries of one time are
  -- interchangeable): the newest-numbered ones, so that the members of that time stay
  -- "<at>-1" .. "<at>-<count>" and the next charge numbers its own after them.
  do
    local t = string.format('%d', at)
    local k = redis.call('ZCOUNT', $key, t, t)
    local m = math.min(cost, k)
    while m > 0 do
      -- in batches: unpack() of a large cost would overflow Lua's C stack
      local args = {}
      for u = 1, math.min(m, 500) do
        args[u] = t .. '-' .. (k - u + 1)
      end
      redis.call('ZREM', $key, unpack(args))
      k, m = k - #args, m - #args
    end
  end
