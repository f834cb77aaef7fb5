-- Sliding log (seeds 000, 001, 004): a sorted set of admitted cost units scored by their time
-- in µs. The rolling window at `now` is the half-open interval (now - w, now]; an entry at
-- exactly now - w has left it. Members are "<time>-<k>", k counting the entries already at
-- that time, so two requests in the same microsecond are two entries.
-- Rust twin: src/algorithm/sliding_log.rs.
--
-- Fragments of the generated check script (see check.lua), for the limit $x: $n its count,
-- $w its window (µs), $key its sorted set, $life the key's TTL in ms after a charge (the
-- window, rounded up, plus 1 ms: see `expires` in check.lua's header; with a caller's clock
-- at least a minute, as check.lua's header says of every key). The key outlives its
-- newest entry by the window: a charge sets the TTL to the window, never shortening it (GT)
-- when the key keeps entries through the charge's trim.
--
-- What a check costs Redis is mostly its calls: a denied check makes two reads by rank (the
-- newest entry, and the one that must leave the window before the cost fits) and converts
-- one member to a number; a check on a missing key one read. The reply carries what was
-- read as text, "<used>,<entry>,<newest>;" (used: the live entries, left out when a cost
-- of 1 is denied, as then at least n are live; entry: the member that must leave the
-- window first, when the cost does not fit; newest: the newest member, when there is
-- one), and the client derives the figures from it with the twin (`settle`): formatting
-- numbers costs Redis more than reading them costs the client.

--@ prepare
-- per identifier j: the reply's record (one string: tables cost Redis more to fill)
local L$x = {''}

--@ evaluate
  -- when a denied cost fits (0 when it fits; reserve.lua reads it)
  local retry$x = 0
  do
    local newest = redis.call('ZRANGE', $key, '-1', '-1')[1]
    local record = '0,,;'
    if newest then
      -- the cost fits unless the (n - cost + 1)-th newest entry is live; then it is the
      -- (used + cost - n)-th oldest live one, which must leave the window first (live
      -- entries are the newest ones: the window has no end but now, or a later entry's time)
      local r = cost == 1 and '-$n' or string.format('%d', cost - $n - 1)
      local e = redis.call('ZRANGE', $key, r, r)[1]
      if e then
        retry$x = string.match(e, '^%d+') + $w
      end
      if retry$x > now then
        ok = false
        if cost == 1 then
          record = ',' .. e .. ',' .. newest .. ';'
        else
          local used = redis.call('ZCOUNT', $key, string.format('(%d', now - $w), '+inf')
          record = used .. ',' .. e .. ',' .. newest .. ';'
        end
      else
        retry$x = 0
        local used = redis.call('ZCOUNT', $key, string.format('(%d', now - $w), '+inf')
        record = used .. ',,' .. newest .. ';'
      end
    end
    L$x[j] = record
  end

--@ commit
    do
      -- admitted: the record is "<used>,,<newest>;", or "0,,;" when the key held nothing
      local record = L$x[j]
      local held = record ~= '0,,;'
      local at = string.format('%d', now)
      local k = 0
      -- the window's start ($cut: by the clock's time, also for a check admitted as of a
      -- later time, reserve.lua), and the time of the newest entry held
      local cut, newest = $cut, 0
      if held then
        -- the entries out of the window
        redis.call('ZREMRANGEBYSCORE', $key, '-inf', cut)
        newest = string.match(record, ',(%d+)%-%d+;') + 0
        if newest >= now then
          k = redis.call('ZCOUNT', $key, at, at)
        end
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
      -- $life: the TTL, longer by the wait for a check admitted as of a later time, and
      -- with a caller's clock at least a minute (Redis' clock, on which the TTL runs, does
      -- not follow it); a key that holds entries keeps a longer TTL (a charge admitted as of
      -- a later time set it). The trim above empties the set when even its newest entry is
      -- out (Redis then deletes it, TTL and all), and the ZADD made it anew without a TTL,
      -- which GT would leave so: such a key takes its TTL as a new one does.
      if held and newest > cut + 0 then
        redis.call('PEXPIRE', $key, $life, 'GT')
      else
        redis.call('PEXPIRE', $key, $life)
      end
    end

--@ report
  head = head .. L$x[j]

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
