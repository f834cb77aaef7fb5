-- Sliding-window counter (seed 004; Cloudflare's two-counter variant): counts per window
-- aligned to the Unix epoch, and an estimate of the rolling window
--   prev * (w - e) / w + curr
-- where e is how far `now` is into the current window.
-- Rust twin: src/algorithm/sliding_window.rs.
--
-- Fragments of the generated check script (see check.lua), for the limit $x: $n its count,
-- $w its window (µs). Its fields in the identifier's packed state are c (the count of the
-- window T falls in) and p (the window before's); the window index is T / w.
--
-- The estimate is a double computed in exactly the order the Rust twin computes it, so
-- both stores agree bit for bit. Retry times and the report are derived by the client from
-- the state the script returns (the twin's `evaluate` and `report`).

--@ fields
c:I4 p:I4

--@ prepare
-- The current window starts at s$x, the previous one at s$x - w; after a charge the state's
-- window is the current one (unless T is later, after the clock went back).
local s$x = now - now % $w
local life$x = s$x + 2 * $w

--@ fresh
    -- a fresh state charged once (what evaluate and commit give it): this window's count is
    -- the cost, which weighs on the next window too
    c$x, p$x = cost, 0
    if life$x > life then
      life = life$x
    end

--@ evaluate
    if T >= s$x + $w then
      -- charged as of a later window (a check that waits for it, reserve.lua): full until
      -- that window begins
      ok = false
    else
      -- the (curr, prev) counts seen from the current window
      if T < s$x then
        if T >= s$x - $w then
          c$x, p$x = 0, c$x
        else
          c$x, p$x = 0, 0
        end
      end
      if p$x * ($w - (now - s$x)) / $w + (c$x + cost) > $n then
        ok = false
      end
    end

--@ commit
      c$x = c$x + cost

--@ expires
      -- the count weighs on the next window's estimate too: the new state's life, and at
      -- least the stored one's
      local l, o = life$x, 0
      if T >= s$x + $w then
        l = T - T % $w + 2 * $w
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
    -- Twin: `refund`. The charge at `at` counts in the window at falls in: the state's
    -- current window while no later one was charged, its previous window once the next one
    -- was (never below zero); older, it weighs on no estimate any more.
    local i, k = T - T % $w, at - at % $w
    if i == k then
      c$x = math.max(c$x - cost, 0)
    elseif i == k + $w then
      p$x = math.max(p$x - cost, 0)
    end
