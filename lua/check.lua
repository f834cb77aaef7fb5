-- tollgate's check: every limit of a policy, for every identifier of a request, decided in
-- one atomic call, all-or-nothing.
-- Rust twin: src/algorithm/mod.rs (`decide`, `Layout`); assembly and wire layout:
-- src/store/script.rs.
--
-- The script is generated per policy and number of identifiers, from prelude.lua, the
-- sections below (`--@ name`) and each limit's fragments (one file per algorithm), with the
-- numbers written in: no limit is parsed, nothing dispatched, no loop run at run time. The
-- sections between `id_open` and `id_close` are repeated for each identifier $j (its keys
-- start after KEYS[$b], at KEYS[$first]); $x names a limit (its index in the policy); $fields / $zeros / $format are the
-- packed fields (T, then each packed limit's fields, in policy order), their zeros and their
-- struct format, $zero a missing state (as many zero bytes). $put / $ttl name the new packed
-- state of identifier $j and its TTL ($putp / $ttlp the previous identifier's): locals
-- `put$j` / `ttl$j` for up to four identifiers, beyond that slots of the tables `put` / `ttl`,
-- as Lua gives a function at most 250 registers, which the largest policies checked for
-- many identifiers would otherwise pass.
--
-- KEYS: per identifier, identifier-major: the packed key (when the policy has window or GCRA
--       limits), then one sorted set per log or concurrency limit, in policy order.
-- ARGV: cost, then now (µs; left out or empty to read the server clock), then the lease id
--       of a concurrency limit (left out when the policy has none).
-- Returns one string (a table costs Redis more to convert): "1" (allowed) or "0", the time as
--       "SECONDS,MICROSECONDS", ";", then per identifier: its packed state as read (as many
--       zero bytes when none), from which the client derives the packed limits' figures with
--       the Rust twin; then per log or concurrency limit what it read, as text ending in ";"
--       (sliding_log.lua, concurrency.lua), from which the client derives its figures.
--
-- The packed key is one string, written once (PSETEX, or SET KEEPTTL): T (the time of the
-- identifier's last charge; every window limit's index is T / w), then each limit's fields.
-- Its TTL runs to the latest moment one of its limits' state matters (`expires`), rounded up
-- to whole milliseconds, plus 1 ms because Redis takes the expiry's base time when the script
-- starts, a little before TIME was read; when the key's TTL already covers that moment, it is
-- kept.
-- With a caller's clock (tests, replays) the TTL is at least a minute: Redis' clock, on which
-- it runs, does not follow the caller's.
-- Phase 1 only reads. Only when every pair admits does phase 2 write: a denied request
-- charges nothing anywhere and leaves every key, TTLs included, as it was.
--
-- Each fragment file also has a `refund` section, which this script does not use: it goes
-- into the refund script, which gives back what an admitted check charged (refund.lua, whose
-- header states what a refund fragment may read and write).
--
-- A check that may wait has a second form, with phase 1 in passes (reserve.lua): $skip
-- says when an identifier goes unevaluated (`not ok`: once one denied; `false` when every
-- pair must say when it admits), $real names the clock's time (`now`, or `real` while
-- `now` is the time a waiting check is decided at).

--@ head
local cost = tonumber(ARGV[1])
local ok = true
-- the TTL last formatted, for the life it was formatted for
local lastlife, lastttl = -1, ''

--@ read_one
local got1 = redis.call('GET', KEYS[1])
local put1, ttl1

--@ read_many
local $states = unpack(redis.call('MGET', $names))
local $news

--@ id_open
-- identifier $j
do
  local j, base = $j, $b

--@ unpack
  if $skip then
    -- denied already: the client derives every figure from the states returned
  elseif $same then
    -- the same state as the previous identifier's: the same verdict, the same new state
    $put, $ttl = $putp, $ttlp
  elseif not got$j and cost <= $most then
    -- no state: charged once, a fresh state admits any cost up to the policy's largest
    local T, $fields = now, $zeros
    local life, old = 0, 0

--@ fresh_pack
    $put = struct.pack('$format', T, $fields)

--@ stored
  else
    local T, $fields = 0, $zeros
    if got$j then
      T, $fields = struct.unpack('$format', got$j)
    end
    -- life: when the new state stops mattering; old: at most when the stored one did
    local life, old = 0, 0

--@ pack_open
    if ok then

--@ pack_close
      if T < now then
        T = now
      end
      $put = struct.pack('$format', T, $fields)

--@ ttl
      if got$j and realtime and life <= old then
        -- the key's TTL covers the stored state's life, so the new state's too: keep it
        -- (with a caller's clock, TTLs and states run on different clocks: set it anew)
        $ttl = false
      elseif life == lastlife then
        $ttl = lastttl
      else
        local ms = life - $real + 999
        ms = (ms - ms % 1000) / 1000 + 1
        if not realtime and ms < 60000 then
          -- Redis' clock, on which the TTL runs, does not follow a caller's clock: a state
          -- must not vanish while that clock stands still
          ms = 60000
        end
        lastlife, lastttl = life, string.format('%d', ms)
        $ttl = lastttl
      end

--@ stored_close
    end
  end

--@ id_close
end

--@ phase2
if ok then

--@ write
  if $ttl then
    redis.call('PSETEX', KEYS[$first], $ttl, $put)
  else
    redis.call('SET', KEYS[$first], $put, 'KEEPTTL')
  end

--@ reply
end

--@ reply_only
return (ok and '1' or '0') .. sec .. ',' .. usec .. ';' .. $replies

--@ reply_open
local head = (ok and '1' or '0') .. sec .. ',' .. usec .. ';'

--@ reply_packed
head = head .. (got$j or '$zero')

--@ tail
return head
