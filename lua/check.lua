-- tollgate's check: every limit of a policy, for every identifier of a request, decided in
-- one atomic call, all-or-nothing.
-- Rust twin: src/algorithm/mod.rs (`decide`, `Layout`); assembly and wire layout:
-- src/store/script.rs.
--
-- The script is generated per policy, from prelude.lua, the sections below (`--@ name`) and
-- each limit's fragments (one file per algorithm), with the policy's numbers written in: no
-- limit is parsed, nothing dispatched at run time. $x names a limit (its index in the
-- policy), $keys is the number of keys per identifier, $fields / $zeros / $format the packed
-- fields (T, then each packed limit's fields, in policy order), their zeros and their
-- struct format.
--
-- KEYS: per identifier, identifier-major: the packed key (when the policy has window or GCRA
--       limits), then one sorted set per log or concurrency limit, in policy order.
-- ARGV: now (µs; empty to read the server clock), cost, lease id (for a concurrency limit;
--       may be empty).
-- Returns one string (a table costs Redis more to convert): "1" (allowed) or "0", the time as
--       "SECONDS,MICROSECONDS", ";", then per identifier: its packed state as read (as many
--       zero bytes when none), from which the client derives the packed limits' figures with
--       the Rust twin; then per sorted-set limit four little-endian doubles: admitted,
--       remaining, reset_after, retry_after (µs from now).
--
-- The packed key is one string, written once with SET: T (the time of the identifier's last
-- charge; every window limit's index is T / w), then each limit's fields. Its TTL (PX) runs to
-- the latest moment one of its limits' state matters (`expires`), rounded up to whole
-- milliseconds, plus 1 ms because Redis takes the expiry's base time when the script starts,
-- a little before TIME was read; when the key's TTL already covers that moment, it is kept.
-- Phase 1 only reads. Only when every pair admits does phase 2 write: a denied request
-- charges nothing anywhere and leaves every key, TTLs included, as it was.

--@ head
local cost = tonumber(ARGV[2])
local ids = #KEYS / $keys
local ok = true

--@ read_one
local packed
local new, ttl = {}, {}
local lastlife, lastttl = -1, ''
if ids == 1 then
  -- One identifier and only packed limits: a fresh key admits whatever cost the limiter
  -- lets through, so the state a charge gives a fresh key is written by the very call that
  -- reads an existing key (SET NX GET: nothing is written when the key exists).
  local T, $fields = 0, $zeros

--@ fresh_open
  if ok then
    local life, old = 0, 0

--@ fresh_close
    lastlife, lastttl = life, string.format('%d', math.ceil((life - now) / 1000) + 1)
    local got = redis.call('SET', KEYS[1], struct.pack('$format', now, $fields), 'NX', 'GET', 'PX', lastttl)
    if not got then
      return '1' .. sec .. ',' .. usec .. ';$zero'
    end
    packed = { got }
  else
    ok = true
    packed = { redis.call('GET', KEYS[1]) }
  end
else
  packed = redis.call('MGET', unpack(KEYS))
end

--@ read_each
local names = {}
for j = 1, ids do
  names[j] = KEYS[(j - 1) * $keys + 1]
end
local packed = redis.call('MGET', unpack(names))
local new, ttl = {}, {}
local lastlife, lastttl = -1, ''

--@ phase1
for j = 1, ids do
  local base = (j - 1) * $keys

--@ unpack
  if not ok then
    -- denied already: the client derives every figure from the states returned
  elseif j > 1 and packed[j] == packed[j - 1] then
    -- the same state as the previous identifier's: the same verdict, the same new state
    new[j], ttl[j] = new[j - 1], ttl[j - 1]
  else
    local T, $fields = 0, $zeros
    if packed[j] then
      T, $fields = struct.unpack('$format', packed[j])
    end

--@ pack_open
    if ok then
      -- life: when the new state stops mattering; old: at most when the stored one did
      local life, old = 0, 0

--@ pack_close
      if T < now then
        T = now
      end
      new[j] = struct.pack('$format', T, $fields)
      if packed[j] and life <= old then
        -- the key's TTL covers the stored state's life, so the new state's too: keep it
        ttl[j] = false
      elseif life == lastlife then
        ttl[j] = lastttl
      else
        lastlife, lastttl = life, string.format('%d', math.ceil((life - now) / 1000) + 1)
        ttl[j] = lastttl
      end
    end
  end

--@ phase2
end
if ok then
  for j = 1, ids do
    local base = (j - 1) * $keys

--@ write
    if ttl[j] then
      redis.call('SET', KEYS[base + 1], new[j], 'PX', ttl[j])
    else
      redis.call('SET', KEYS[base + 1], new[j], 'KEEPTTL')
    end

--@ reply
  end
end
local head = (ok and '1' or '0') .. sec .. ',' .. usec .. ';'
for j = 1, ids do

--@ reply_packed
  head = head .. (packed[j] or '$zero')

--@ tail
end
return head
