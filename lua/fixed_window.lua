-- Fixed window (seed 003): one counter per window aligned to the Unix epoch. A hash holds
-- i (window index) and c (its count); the key expires when the window ends. The index is
-- stored rather than put in the key name because the script learns the time from TIME, and
-- may only touch keys it was passed.
-- Rust twin: src/algorithm/fixed_window.rs.
ALG[3] = {
  load = function(key, lim)
    local v = redis.call('HMGET', key, 'i', 'c')
    return { key = key, i = tonumber(v[1]) or 0, c = tonumber(v[2]) or 0 }
  end,

  evaluate = function(st, lim, now, cost)
    local i = idiv(now, lim.w)
    local count = 0
    if st.i >= i then
      count = st.c
    end
    if count + cost <= lim.n then
      return true, 0
    end
    return false, (math.max(i, st.i) + 1) * lim.w
  end,

  commit = function(st, lim, now, cost)
    local i = idiv(now, lim.w)
    if st.i < i then
      st.i, st.c = i, 0
    end
    st.c = st.c + cost
    redis.call('HSET', st.key, 'i', int(st.i), 'c', int(st.c))
    expire(st.key, (st.i + 1) * lim.w, now)
  end,

  report = function(st, lim, now)
    local i = idiv(now, lim.w)
    if st.i < i or st.c == 0 then
      return lim.burst, 0
    end
    return math.max(lim.n - st.c, 0), (st.i + 1) * lim.w - now
  end,
}
