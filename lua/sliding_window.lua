-- Sliding-window counter (seed 004; Cloudflare's two-counter variant): counts per window
-- aligned to the Unix epoch, and an estimate of the rolling window
--   prev * (w - e) / w + curr
-- where e is how far `now` is into the current window. A hash holds i (window index),
-- c (its count) and p (the previous window's count).
-- Rust twin: src/algorithm/sliding_window.rs.
--
-- The estimate is a double computed in exactly the order the Rust twin computes it, so
-- both stores agree bit for bit; offsets derived from it by division are corrected with the
-- admission test itself.

-- The (curr, prev) counts of the state seen from window i.
local function window_counts(st, i)
  if st.i >= i then
    return st.c, st.p
  elseif st.i + 1 == i then
    return 0, st.c
  end
  return 0, 0
end

local function window_admits(n, w, prev, curr, e, cost)
  return prev * (w - e) / w + (curr + cost) <= n
end

-- The smallest offset in [lo, hi] that admits (a monotone test), from the estimate x.
local function first_admitting(x, lo, hi, admits)
  local o = math.min(math.max(math.ceil(x), lo), hi)
  while o > lo and admits(o - 1) do
    o = o - 1
  end
  while o < hi and not admits(o) do
    o = o + 1
  end
  return o
end

ALG[2] = {
  load = function(key, lim)
    local v = redis.call('HMGET', key, 'i', 'c', 'p')
    return { key = key, i = tonumber(v[1]) or 0, c = tonumber(v[2]) or 0, p = tonumber(v[3]) or 0 }
  end,

  evaluate = function(st, lim, now, cost)
    local n, w = lim.n, lim.w
    local i = idiv(now, w)
    local e = now - i * w
    local curr, prev = window_counts(st, i)
    if window_admits(n, w, prev, curr, e, cost) then
      return true, 0
    end
    if curr + cost <= n then
      -- Within this window, as the previous window's weight decays (prev > 0 here).
      local x = w - (n - curr - cost) * w / prev
      local o = first_admitting(x, e + 1, w, function(o)
        return window_admits(n, w, prev, curr, o, cost)
      end)
      return false, i * w + o
    end
    -- In the next window, where this window's count becomes the previous one.
    local x = w - (n - cost) * w / curr
    local o = first_admitting(x, 0, w, function(o)
      return window_admits(n, w, curr, 0, o, cost)
    end)
    return false, (i + 1) * w + o
  end,

  commit = function(st, lim, now, cost)
    local i = idiv(now, lim.w)
    local curr, prev = window_counts(st, i)
    st.i, st.c, st.p = math.max(st.i, i), curr + cost, prev
    redis.call('HSET', st.key, 'i', int(st.i), 'c', int(st.c), 'p', int(st.p))
    expire(st.key, (st.i + 2) * lim.w, now)
  end,

  report = function(st, lim, now)
    local n, w = lim.n, lim.w
    local i = idiv(now, w)
    local e = now - i * w
    local curr, prev = window_counts(st, i)
    local reset = 0
    if curr > 0 then
      reset = (i + 2) * w - now
    elseif prev > 0 then
      reset = (i + 1) * w - now
    end
    local estimate = prev * (w - e) / w + curr
    local k = math.min(math.max(math.floor(n - estimate), 0), n)
    while k > 0 and not window_admits(n, w, prev, curr, e, k) do
      k = k - 1
    end
    while k < n and window_admits(n, w, prev, curr, e, k + 1) do
      k = k + 1
    end
    return k, reset
  end,
}
