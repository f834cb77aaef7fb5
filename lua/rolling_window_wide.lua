-- Rolling window (the default algorithm): never more than n admitted in any interval of
-- length w, wherever it starts, in five counters. The window is cut into four sub-windows of
-- g = w / 4 µs, aligned to the Unix epoch, and a ring of five counters holds what was admitted
-- in the current sub-window and the four before it: every sub-window the rolling window
-- (now - w, now] touches. The oldest has partly left the rolling window but is counted in
-- full, so the count is never below the exact one (never over-admits), and never counts
-- anything older than w + g (admits whatever an exact window of w + g would).
-- Rust twin: src/algorithm/rolling_window.rs.
--
-- This file is the form for counts over 1550, whose five counters do not fit in one number
-- (rolling_window.lua, which runs the smaller ones, says how they are packed there): five
-- fields of four bytes.
--
-- Fragments of the generated check script (see check.lua), for the limit $x: $n its count,
-- $w its window and $g its sub-window (µs). Its fields in the identifier's packed state are
-- the ring, newest first: ra counts the sub-window T falls in (T / g), rb the one before, and
-- so on to re, four sub-windows before T's. The retry time and the report are derived by the
-- client from the state the script returns (the twin's `evaluate` and `report`); in a check
-- that may wait, reserve.lua's `retry_rolling_window_wide` says when it admits.
--
-- Four sub-windows: see rolling_window.lua and DESIGN.md ("The rolling window").

--@ fields
ra:I4 rb:I4 rc:I4 rd:I4 re:I4

--@ prepare
-- now's sub-window starts at s$x; a state charged now matters until that sub-window has left
-- the ring, w + g after it began.
local s$x = now - now % $g
local life$x = s$x + $w + $g

--@ fresh
    -- a fresh state charged once (what evaluate and commit give it): the cost, in now's
    -- sub-window
    ra$x, rb$x, rc$x, rd$x, re$x = cost, 0, 0, 0, 0
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
        ra$x, rb$x, rc$x, rd$x, re$x = 0, ra$x, rb$x, rc$x, rd$x
      elseif d == 2 then
        ra$x, rb$x, rc$x, rd$x, re$x = 0, 0, ra$x, rb$x, rc$x
      elseif d == 3 then
        ra$x, rb$x, rc$x, rd$x, re$x = 0, 0, 0, ra$x, rb$x
      elseif d == 4 then
        ra$x, rb$x, rc$x, rd$x, re$x = 0, 0, 0, 0, ra$x
      else
        ra$x, rb$x, rc$x, rd$x, re$x = 0, 0, 0, 0, 0
      end
    end
    if ra$x + rb$x + rc$x + rd$x + re$x + cost > $n then
      ok = false
    end

--@ commit
      ra$x = ra$x + cost

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
    -- Twin: `refund`. The charge at `at` counts in its sub-window: the counter d sub-windows
    -- older than T's, lowered by the cost (never below zero), or nothing once that
    -- sub-window has left the ring (d > 4).
    local d = ((T - T % $g) - (at - at % $g)) / $g
    if d == 0 then
      ra$x = math.max(ra$x - cost, 0)
    elseif d == 1 then
      rb$x = math.max(rb$x - cost, 0)
    elseif d == 2 then
      rc$x = math.max(rc$x - cost, 0)
    elseif d == 3 then
      rd$x = math.max(rd$x - cost, 0)
    elseif d == 4 then
      re$x = math.max(re$x - cost, 0)
    end
