-- GCRA, which is also how the token bucket is run (seed 002's request limiter: a bucket of
-- `burst` tokens refilled at n per w is the same automaton). One emission interval is
-- T = w / n µs, usually not a whole number, so times are kept exactly as pairs {us, rem}
-- meaning us + rem / n, with 0 <= rem < n. A hash holds t (the theoretical arrival time's
-- µs) and r (its remainder).
-- Rust twin: src/algorithm/gcra.rs.
--
-- A request of cost c is admitted when max(tat, now) + c*T - now <= burst*T; it then moves
-- tat to max(tat, now) + c*T.

-- k * T as {us, rem}, without ever forming k * w (which could pass 2^53).
local function times(lim, k)
  local q, r = idiv(lim.w, lim.n), lim.w % lim.n
  local kr = k * r
  local whole = idiv(kr, lim.n)
  return { k * q + whole, kr - whole * lim.n }
end

local function add(lim, a, b)
  local rem = a[2] + b[2]
  if rem >= lim.n then
    return { a[1] + b[1] + 1, rem - lim.n }
  end
  return { a[1] + b[1], rem }
end

-- a - b, for a >= b.
local function sub(lim, a, b)
  if a[2] >= b[2] then
    return { a[1] - b[1], a[2] - b[2] }
  end
  return { a[1] - b[1] - 1, a[2] + lim.n - b[2] }
end

local function le(a, b)
  return a[1] < b[1] or (a[1] == b[1] and a[2] <= b[2])
end

local function later(a, b)
  if le(a, b) then
    return b
  end
  return a
end

ALG[4] = {
  load = function(key, lim)
    local v = redis.call('HMGET', key, 't', 'r')
    return { key = key, tat = { tonumber(v[1]) or 0, tonumber(v[2]) or 0 } }
  end,

  evaluate = function(st, lim, now, cost)
    local nxt = add(lim, later(st.tat, { now, 0 }), times(lim, cost))
    local tau = times(lim, lim.burst)
    if le(sub(lim, nxt, { now, 0 }), tau) then
      return true, 0
    end
    -- Admitted once tat + cost*T - tau <= t.
    local x = sub(lim, nxt, tau)
    if x[2] > 0 then
      return false, x[1] + 1
    end
    return false, x[1]
  end,

  commit = function(st, lim, now, cost)
    st.tat = add(lim, later(st.tat, { now, 0 }), times(lim, cost))
    redis.call('HSET', st.key, 't', int(st.tat[1]), 'r', int(st.tat[2]))
    local ends = st.tat[1]
    if st.tat[2] > 0 then
      ends = ends + 1
    end
    expire(st.key, ends, now)
  end,

  report = function(st, lim, now)
    local m = later(st.tat, { now, 0 })
    local fin = add(lim, { now, 0 }, times(lim, lim.burst))
    local remaining = 0
    if le(m, fin) then
      -- floor(slack / T): an estimate, then made exact with times(). (The Rust twin divides
      -- exactly in 128-bit integers, which Lua lacks.)
      local slack = sub(lim, fin, m)
      local k = math.floor((slack[1] + slack[2] / lim.n) * lim.n / lim.w)
      k = math.max(k, 0)
      while k > 0 and not le(times(lim, k), slack) do
        k = k - 1
      end
      while le(times(lim, k + 1), slack) do
        k = k + 1
      end
      remaining = k
    end
    local reset = m[1] - now
    if m[2] > 0 then
      reset = reset + 1
    end
    return remaining, reset
  end,
}
