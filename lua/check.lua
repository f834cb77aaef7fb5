-- tollgate's check: every limit of a policy, for every identifier of a request, decided in
-- one atomic call, all-or-nothing.
-- Rust twin: src/algorithm/mod.rs (`decide`, `Layout`); assembly and wire layout:
-- src/store/script.rs.
--
-- The script is generated per policy, from the sections below (`--@ name`), each limit's
-- fragments (one file per algorithm) and prelude.lua, with the policy's numbers written in:
-- no limit is parsed, no function looked up at run time. $x names a limit (its index in the
-- policy), $keys is the number of keys per identifier, $fields / $zeros / $format the packed
-- fields (T, then each packed limit's fields, in policy order), their zeros and their
-- struct format.
--
-- KEYS: per identifier, identifier-major: the packed key (when the policy has window or GCRA
--       limits), then one sorted set per log or concurrency limit, in policy order.
-- ARGV: now (µs; empty to read the server clock), cost, lease id (for a concurrency limit;
--       may be empty).
-- Returns {allowed, now, then per identifier: its packed state as read (nil when none), then
--       per sorted-set limit: admitted, remaining, reset_after, retry_after (µs from now)}.
--       The client derives the packed limits' figures from the state with the Rust twin.
--
-- The packed key is one string, written once with SET ... PX: T (the time of the
-- identifier's last charge; every window limit's index is T / w), then each limit's fields.
-- Phase 1 only reads. Only when every pair admits does phase 2 write: a denied request
-- charges nothing anywhere and leaves every key, TTLs included, as it was.

--@ head
local now = clock(ARGV[1])
local cost = tonumber(ARGV[2])
local ids = #KEYS / $keys
local ok = true

--@ read_all
local packed = redis.call('MGET', unpack(KEYS))
local new, ttl = {}, {}

--@ read_each
local names = {}
for j = 1, ids do
  names[j] = KEYS[(j - 1) * $keys + 1]
end
local packed = redis.call('MGET', unpack(names))
local new, ttl = {}, {}

--@ phase1
for j = 1, ids do
  local base = (j - 1) * $keys

--@ unpack
  local T, $fields = 0, $zeros
  if packed[j] then
    T, $fields = struct.unpack('$format', packed[j])
  end

--@ pack_open
  if ok then
    local life = 0

--@ pack_close
    if T < now then
      T = now
    end
    new[j] = struct.pack('$format', T, $fields)
    ttl[j] = string.format('%d', math.ceil((life - now) / 1000) + 1)
  end

--@ phase2
end
if ok then
  for j = 1, ids do
    local base = (j - 1) * $keys

--@ write
    redis.call('SET', KEYS[base + 1], new[j], 'PX', ttl[j])

--@ reply
  end
end
local out = { ok and 1 or 0, now }
for j = 1, ids do

--@ reply_packed
  out[#out + 1] = packed[j]

--@ tail
end
return out
