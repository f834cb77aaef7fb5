-- tollgate's check: every limit of a policy, for every identifier of a request, decided in
-- one atomic call, all-or-nothing.
-- Rust twin: src/algorithm/mod.rs (`decide`); wire layout: src/store/script.rs.
--
-- KEYS: one per (identifier, limit), identifier-major: KEYS[(id - 1) * L + l].
-- ARGV: now (µs; empty to read the server clock), cost, L, lease id (for a concurrency
--       limit; may be empty), then per limit: algorithm (1 sliding log, 2 sliding window,
--       3 fixed window, 4 GCRA / token bucket, 5 concurrency), count, window (µs; the lease
--       for concurrency), largest cost (count, or the burst).
-- Returns {allowed, now, then per key: remaining, reset_after, retry_after, admitted}
-- with the times in µs relative to now.
--
-- Phase 1 only reads. Only when every pair admits does phase 2 write: a denied request
-- charges nothing anywhere and leaves every key, TTLs included, as it was.

local now = clock(ARGV[1])
local cost = tonumber(ARGV[2])
local nlimits = tonumber(ARGV[3])
LEASE = ARGV[4]

local limits = {}
for l = 1, nlimits do
  local a = 4 + (l - 1) * 4
  limits[l] = {
    alg = ALG[tonumber(ARGV[a + 1])],
    n = tonumber(ARGV[a + 2]),
    w = tonumber(ARGV[a + 3]),
    burst = tonumber(ARGV[a + 4]),
  }
end

local states, admitted, retry_at = {}, {}, {}
local allowed = true
for k = 1, #KEYS do
  local lim = limits[(k - 1) % nlimits + 1]
  states[k] = lim.alg.load(KEYS[k], lim)
  admitted[k], retry_at[k] = lim.alg.evaluate(states[k], lim, now, cost)
  allowed = allowed and admitted[k]
end

if allowed then
  for k = 1, #KEYS do
    local lim = limits[(k - 1) % nlimits + 1]
    lim.alg.commit(states[k], lim, now, cost)
  end
end

local out = { allowed and 1 or 0, now }
for k = 1, #KEYS do
  local lim = limits[(k - 1) % nlimits + 1]
  local remaining, reset = lim.alg.report(states[k], lim, now)
  local retry = 0
  if not admitted[k] then
    retry = retry_at[k] - now
  end
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = retry
  out[#out + 1] = admitted[k] and 1 or 0
end
return out
