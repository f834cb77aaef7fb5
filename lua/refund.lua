-- tollgate's refund: gives back what one admitted check charged, for every identifier of it,
-- in one atomic call. A check whose identifiers were split into several calls (one per Redis
-- Cluster slot) and that some of them denied is denied as a whole: the calls that admitted
-- are refunded, so that it charged nothing in the end.
-- Rust twin: src/algorithm/mod.rs (`refund`, and each algorithm file's `refund`); assembly:
-- src/store/script/refund.rs.
--
-- Generated per policy and number of identifiers like the check script (see check.lua), from
-- the sections below and each limit's `refund` fragment, with the numbers written in. The
-- sections between `id_open` and `id_close` are repeated for each identifier $j (its keys
-- start after KEYS[$b]; the packed key is KEYS[$first]); $fields and $format are the packed
-- fields and their struct format, as in the check script.
--
-- KEYS: the check's, identifier-major: the packed key (when the policy has window or GCRA
--       limits), then one sorted set per log or concurrency limit, in policy order.
-- ARGV: cost, the time of the charge (µs: the time the check read, as its reply gives it),
--       then the lease id of a concurrency limit (left out when the policy has none).
-- Returns nothing. It reads no clock: what it gives back depends on the charge's time and
-- on the state alone, so that retrying it later would give the same (it is never retried).
--
-- A refund never gives back more than the charge added, and never creates a key: a missing
-- key has nothing to give back. The packed key is written back with SET KEEPTTL, and only
-- when it changed (its TTL covers the charged state's life, so it covers the refunded one's);
-- sorted sets only lose members.
--
-- A `refund` fragment (one per algorithm file, its twin the file's Rust `refund`):
--  * of a packed limit (window, GCRA and the like): runs in a block of its own after the
--    packed state was read, and may read `cost`, `at` (the charge's time), `T` (the time of
--    the identifier's last charge: `at`, or later when a later check charged it, or when the
--    clock went back) and its own fields (`c$x`...), which it may lower; the driver packs
--    them back with T unchanged;
--  * of a sorted-set limit: runs once per identifier, with `$key` its key and `lease` the
--    lease id; it may remove members, never add any nor touch the TTL.
-- Either way it gives back at most what the charge at `at` still adds to its state (nothing
-- once the state has moved past it), so that a refund can under-admit, never over-admit.

--@ head
local cost = tonumber(ARGV[1])
local at = tonumber(ARGV[2])
local lease = ARGV[3]

--@ id_open
-- identifier $j
do
  local j, base = $j, $b

--@ packed_open
  local got = redis.call('GET', KEYS[$first])
  if got then
    local T, $fields = struct.unpack('$format', got)

--@ packed_close
    local put = struct.pack('$format', T, $fields)
    if put ~= got then
      redis.call('SET', KEYS[$first], put, 'KEEPTTL')
    end
  end

--@ id_close
end
