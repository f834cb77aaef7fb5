-- tollgate's check that may wait: when a check is denied now, it is admitted as of the
-- earliest time every (identifier, limit) pair admits it, if that lies within the caller's
-- longest wait, and charged as of that time; the caller sleeps until then.
-- Rust twin: src/algorithm/reserve.rs.
--
-- The check script of a policy without a concurrency limit has a second form, generated
-- with these sections (see src/store/script.rs): phase 1 runs in passes, each at the time
-- `now`, from the clock's time `real` on. A pass that denies has each denying pair say when
-- it would admit (the `retry_*` sections, by algorithm, after its `evaluate`), into `tstar`,
-- the latest such time; every algorithm is monotone (a state that admits at t admits later
-- without new charges), so at `tstar` every pair admits, and the next pass runs at
-- `tstar`, where every pair admits; a third pass is a safeguard (a pair whose retry time
-- came short denies there too, and the check with it). The last pass — one that admits, the third, or
-- one whose `tstar` lies past the longest wait — writes (when it admits) and replies, its
-- time appended to the reply's as the wait (`SECONDS,MICROSECONDS,WAIT`). Every identifier
-- is evaluated in every pass, denied or not, so that `tstar` hears from every pair.
--
-- ARGV[3]: the longest wait (µs). The placeholders: $x the limit, $n its count, $w its
-- window (µs), $tu and $tr a GCRA's burst tolerance as (µs, rem), $g a rolling window's
-- sub-window (µs) and $m, $pa..$pd its packing (rolling_window.lua), $j the identifier.

--@ pass_open
local reserve, real = tonumber(ARGV[3]), now
for pass = 1, 3 do
  ok = true
  -- the latest time a denying pair admits, in this pass
  local tstar = now

--@ pass_final
  if ok or pass == 3 or tstar - real > reserve then
    if now > real then
      -- the wait, after the time
      usec = usec .. ',' .. string.format('%d', now - real)
    end

--@ pass_close
  end
  now = tstar
end

--@ retry_sliding_log
  -- evaluate's: when the cost fits (0 when it fits now)
  if retry$x > tstar then
    tstar = retry$x
  end

--@ retry_sliding_window
    -- the window seen from: now's, or a later one the state was charged as of (full until
    -- it begins, then as its counts say: evaluate left them unshifted)
    local s0, e0 = s$x, now - s$x
    if T >= s$x + $w then
      s0, e0 = T - T % $w, 0
      if s0 > tstar then
        tstar = s0
      end
    end
    if p$x * ($w - e0) / $w + (c$x + cost) > $n then
      -- the first offset o of a window that admits, from an estimate x corrected with the
      -- admission test itself (the twin's `first_admitting`), as prev's weight decays in
      -- this window, or else in the next one, where curr becomes prev
      local start, lo, prev, curr, x = s0, e0 + 1, p$x, c$x, 0
      if c$x + cost <= $n then
        x = $w - ($n - c$x - cost) * $w / p$x
      else
        start, lo, prev, curr = s0 + $w, 0, c$x, 0
        x = $w - ($n - cost) * $w / c$x
      end
      local o = math.min(math.max(math.ceil(x), lo), $w)
      while o > lo and prev * ($w - (o - 1)) / $w + (curr + cost) <= $n do
        o = o - 1
      end
      while o < $w and prev * ($w - o) / $w + (curr + cost) > $n do
        o = o + 1
      end
      if start + o > tstar then
        tstar = start + o
      end
    end

--@ retry_fixed_window
    if T >= s$x + $w then
      -- charged as of a later window: full until it begins, then as its count says
      local b = T - T % $w
      if c$x + cost > $n then
        b = b + $w
      end
      if b > tstar then
        tstar = b
      end
    elseif c$x + cost > $n and s$x + $w > tstar then
      -- the next window
      tstar = s$x + $w
    end

--@ retry_gcra
    if t$x - now > $tu or (t$x - now == $tu and r$x > $tr) then
      -- admitted once the arrival time less the tolerance has come, rounded up
      local xu, xr = t$x - $tu, r$x - $tr
      if xr < 0 then
        xu, xr = xu - 1, xr + $n
      end
      if xr > 0 then
        xu = xu + 1
      end
      if xu > tstar then
        tstar = xu
      end
    end

--@ retry_rolling_window
    -- the ring seen from now's sub-window (evaluate moved it on), or from T's when later
    -- (charged ahead of the clock: full until that sub-window begins, then as its counts
    -- say). The count falls only at sub-window starts, where the oldest counter left leaves
    -- the ring: the first start from which those still in it leave room (with all five gone
    -- any cost up to the count fits). Packed as in rolling_window.lua, ring % B^(5-d) %
    -- (B - 1) is what the ring holds once its d oldest counters have left.
    local e = math.max(T - T % $g, s$x)
    if e > s$x or ring$x % $m + cost > $n then
      local at = e
      if ring$x % $m + cost <= $n then
        -- room as soon as e begins
      elseif ring$x % $pd % $m + cost <= $n then
        at = e + $g
      elseif ring$x % $pc % $m + cost <= $n then
        at = e + 2 * $g
      elseif ring$x % $pb % $m + cost <= $n then
        at = e + 3 * $g
      elseif ring$x % $pa + cost <= $n then
        at = e + 4 * $g
      else
        at = e + 5 * $g
      end
      if at > tstar then
        tstar = at
      end
    end

--@ retry_rolling_window_wide
    -- the same for the wide form (rolling_window_wide.lua): the counters ra (newest) to re
    local e = math.max(T - T % $g, s$x)
    if e > s$x or ra$x + rb$x + rc$x + rd$x + re$x + cost > $n then
      local at = e
      if ra$x + rb$x + rc$x + rd$x + re$x + cost <= $n then
        -- room as soon as e begins
      elseif ra$x + rb$x + rc$x + rd$x + cost <= $n then
        at = e + $g
      elseif ra$x + rb$x + rc$x + cost <= $n then
        at = e + 2 * $g
      elseif ra$x + rb$x + cost <= $n then
        at = e + 3 * $g
      elseif ra$x + cost <= $n then
        at = e + 4 * $g
      else
        at = e + 5 * $g
      end
      if at > tstar then
        tstar = at
      end
    end
