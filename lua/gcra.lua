-- GCRA, which is also how the token bucket is run (seed 002's request limiter: a bucket of
-- `burst` tokens refilled at n per w is the same automaton). One emission interval is
-- T = w / n µs, usually not a whole number, so times are kept exactly as pairs (us, rem)
-- meaning us + rem / n, with 0 <= rem < n.
-- Rust twin: src/algorithm/gcra.rs.
--
-- A request of cost c is admitted when max(tat, now) + c*T - now <= burst*T; it then moves
-- tat to max(tat, now) + c*T.
--
-- Fragments of the generated check script (see check.lua), for the limit $x: $n its count,
-- $q and $r the quotient and remainder of w / n, $tu and $tr the burst tolerance burst*T as
-- (us, rem). Its fields in the identifier's packed state are t and r, the theoretical arrival
-- time as (us, rem). The retry time and the report are derived by the client from the state
-- the script returns (the twin's `evaluate` and `report`).

--@ fields
t:d r:I4

--@ prepare
-- cost*T as (us, rem), without ever forming cost * w (which could pass 2^53)
local cu$x, cr$x
do
  local kr = cost * $r
  local kq = math.floor(kr / $n)
  cu$x, cr$x = cost * $q + kq, kr - kq * $n
end

--@ fresh
    -- a fresh state charged once (what evaluate and commit give it): the arrival time is
    -- now + cost*T (cr$x < n: no carry)
    t$x, r$x = now + cu$x, cr$x
    local l = t$x
    if r$x > 0 then
      l = l + 1
    end
    if l > life then
      life = l
    end

--@ evaluate
    -- the stored state's life: its arrival time, rounded up
    local o = t$x
    if r$x > 0 then
      o = o + 1
    end
    if o > old then
      old = o
    end
    -- next = max(tat, now) + cost*T, kept in the fields: only written if every limit admits
    if t$x < now or (t$x == now and r$x == 0) then
      t$x, r$x = now, 0
    end
    t$x, r$x = t$x + cu$x, r$x + cr$x
    if r$x >= $n then
      t$x, r$x = t$x + 1, r$x - $n
    end
    -- admitted when next - now <= burst*T
    if t$x - now > $tu or (t$x - now == $tu and r$x > $tr) then
      ok = false
    end

--@ commit
      -- evaluate has moved the arrival time already

--@ expires
      -- the new arrival time, rounded up
      local l = t$x
      if r$x > 0 then
        l = l + 1
      end
      if l > life then
        life = l
      end

--@ refund
    -- Twin: `refund`. The charge moved the arrival time to max(tat, at) + cost*T. With nothing
    -- charged since (T == at), moving it back by cost*T is the exact inverse (a result before
    -- now is as good as now: a full bucket). A later charge, at T, may have started from our
    -- arrival time instead of its own time, taking up to T - at of our cost*T: give back
    -- cost*T - (T - at), nothing when that is not positive, and never before T.
    if T >= at then
      local kr = cost * $r
      local kq = math.floor(kr / $n)
      local gu, gr = cost * $q + kq - (T - at), kr - kq * $n
      if gu > 0 or (gu == 0 and gr > 0) then
        local t, r = t$x - gu, r$x - gr
        if r < 0 then
          t, r = t - 1, r + $n
        end
        if t < T then
          t, r = T, 0
        end
        t$x, r$x = t, r
      end
    end
