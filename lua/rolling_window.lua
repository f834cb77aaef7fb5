-- Rolling window (the default algorithm): never more than n admitted in any interval of
-- length w, wherever it starts, in five counters. The window is cut into four sub-windows of
-- g = w / 4 µs, aligned to the Unix epoch, and a ring of five counters holds what was admitted
-- in the current sub-window and the four before it: every sub-window the rolling window
-- (now - w, now] touches. The oldest has partly left the rolling window but is counted in
-- full, so the count is never below the exact one (never over-admits), and never counts
-- anything older than w + g (admits whatever an exact window of w + g would).
-- Rust twin: src/algorithm/rolling_window.rs.
--
-- This file packs the ring into one number, for counts up to 1550 (most limits; larger ones
-- run rolling_window_wide.lua, five counters of four bytes). The ring is the five counters as
-- the digits of one integer in base B = 1552 (for every count: the state means the same
-- whatever the count, so a count change keeps it), the newest lowest:
--   ring = c0 + c1 * B + c2 * B^2 + c3 * B^3 + c4 * B^4   (< B^5 <= 2^53: exact in a double)
-- Every counter, and their sum, is at most n < B - 1, so
--   * the sum of the counters is ring % (B - 1) (B = 1 modulo B - 1: casting out nines),
--   * moving the ring on by d sub-windows is (ring % B^(5 - d)) * B^d,
--   * charging the current sub-window is ring + cost.
-- One packed field per limit instead of five: what the script unpacks, packs, stores and
-- returns is as small as the sliding window's, for five counters.
--
-- Fragments of the generated check script (see check.lua), for the limit $x: $n its count,
-- $w its window and $g its sub-window (µs), $m = B - 1 and $pa..$pd the powers B to B^4. Its
-- field in the identifier's packed state is ring; its newest counter is the sub-window T
-- falls in (T / g). The retry time and the report are derived by the client from the state
-- the script returns (the twin's `evaluate` and `report`); in a check that may wait,
-- reserve.lua's `retry_rolling_window` says when it admits.
--
-- Four sub-windows, not more: each one more is a counter more per limit (a digit more: the
-- largest count packed into one number falls, from 1550 with four sub-windows to 188 with
-- six and 57 with eight, so more limits would need the wide form, five times the bytes) and a branch more in
-- the shift, against an under-admission that shrinks as 1 / (k + 1). See DESIGN.md ("The
-- rolling window").

--@ fields
ring:d

--@ prepare
-- now's sub-window starts at s$x; a state charged now matters until that sub-window has left
-- the ring, w + g after it began.
local s$x = now - now % $g
local life$x = s$x + $w + $g

--@ fresh
    -- a fresh state charged once (what evaluate and commit give it): the cost, in now's
    -- sub-window
    ring$x = cost
    if life$x > life then
      life = life$x
    end

--@ evaluate
    -- the ring seen from now's sub-window: it moves on by as many sub-windows as have begun
    -- since T's, the oldest ones leaving it. A ring charged as of a later sub-window (a check
    -- that waits for it, reserve.lua, or a clock that went back) is full until that
    -- sub-window begins: it no longer counts the sub-windows before its oldest, which may
    -- hold admissions less than w before now.
    local t = T - T % $g
    if t > s$x then
      ok = false
    elseif t < s$x then
      local d = (s$x - t) / $g
      if d == 1 then
        ring$x = ring$x % $pd * $pa
      elseif d == 2 then
        ring$x = ring$x % $pc * $pb
      elseif d == 3 then
        ring$x = ring$x % $pb * $pc
      elseif d == 4 then
        ring$x = ring$x % $pa * $pd
      else
        ring$x = 0
      end
    end
    -- the sum of the five counters
    if ring$x % $m + cost > $n then
      ok = false
    end

--@ commit
      ring$x = ring$x + cost

--@ expires
      -- the newest sub-window leaves the ring w + g after it began: the new state's life (the
      -- later of now's and T's sub-window), and the stored one's (T's)
      local t = T - T % $g
      local o = t + $w + $g
      local l = life$x
      if t >= s$x then
        l = o
      end
      if l > life then
        life = l
      end
      if o > old then
        old = o
      end

--@ refund
    -- Twin: `refund`. The charge at `at` counts in its sub-window: the counter (digit) d
    -- sub-windows older than T's, lowered by the cost (never below zero), or nothing once
    -- that sub-window has left the ring (d > 4).
    local d = ((T - T % $g) - (at - at % $g)) / $g
    local p = 0
    if d == 0 then
      p = 1
    elseif d == 1 then
      p = $pa
    elseif d == 2 then
      p = $pb
    elseif d == 3 then
      p = $pc
    elseif d == 4 then
      p = $pd
    end
    if p > 0 then
      ring$x = ring$x - math.min(math.floor(ring$x / p) % $pa, cost) * p
    end
