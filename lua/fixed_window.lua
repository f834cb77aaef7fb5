-- Fixed window (seed 003): one counter per window aligned to the Unix epoch.
-- Rust twin: src/algorithm/fixed_window.rs.
--
-- Fragments of the generated check script (see check.lua), for the limit $x: $n its count,
-- $w its window (µs). Its field in the identifier's packed state is c, the count of the
-- window T falls in (T / w). The retry time and the report are derived by the client from the
-- state the script returns (the twin's `evaluate` and `report`).

--@ fields
c:I4

--@ prepare
local s$x = now - now % $w
local life$x = s$x + $w

--@ fresh
    -- a fresh state charged once (what evaluate and commit give it): the count is the cost
    -- until the window ends
    c$x = cost
    if life$x > life then
      life = life$x
    end

--@ evaluate
    if T >= s$x + $w then
      -- charged as of a later window (a check that waits for it, reserve.lua): full until
      -- that window begins
      ok = false
    else
      if T < s$x then
        c$x = 0
      end
      if c$x + cost > $n then
        ok = false
      end
    end

--@ commit
      c$x = c$x + cost

--@ expires
      -- the window ends: the new state's life, and at least the stored one's
      local l, o = life$x, 0
      if T >= life$x then
        l = T - T % $w + $w
        o = l
      elseif T >= s$x then
        o = l
      elseif T >= s$x - $w then
        o = l - $w
      end
      if l > life then
        life = l
      end
      if o > old then
        old = o
      end

--@ refund
    -- Twin: `refund`. The charge at `at` counts in the window at falls in: while the state is
    -- still that window's, its count goes down by the cost (never below zero); once a later
    -- window was charged, the charge no longer counts.
    if T - T % $w == at - at % $w then
      c$x = math.max(c$x - cost, 0)
    end
