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
local kr$x = cost * $r
local kq$x = math.floor(kr$x / $n)
local cu$x, cr$x = cost * $q + kq$x, kr$x - kq$x * $n

--@ evaluate
    -- the stored state's life: its arrival time, rounded up
    local o$x = t$x
    if r$x > 0 then
      o$x = o$x + 1
    end
    -- next = max(tat, now) + cost*T
    local nu$x, nr$x = t$x, r$x
    if nu$x < now or (nu$x == now and nr$x == 0) then
      nu$x, nr$x = now, 0
    end
    nu$x, nr$x = nu$x + cu$x, nr$x + cr$x
    if nr$x >= $n then
      nu$x, nr$x = nu$x + 1, nr$x - $n
    end
    -- admitted when next - now <= burst*T
    if nu$x - now > $tu or (nu$x - now == $tu and nr$x > $tr) then
      ok = false
    end

--@ commit
      t$x, r$x = nu$x, nr$x

--@ expires
      -- the new arrival time, rounded up
      local l$x = t$x
      if r$x > 0 then
        l$x = l$x + 1
      end
      if l$x > life then
        life = l$x
      end
      if o$x > old then
        old = o$x
      end
