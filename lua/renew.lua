-- tollgate: extends concurrency leases that are still held.
-- Rust twin: src/algorithm/concurrency.rs (`renew`).
--
-- KEYS: the slot sets; ARGV: now (µs; empty to read the server clock), lease (µs), then one
-- lease id per key. A lease that already expired (and may have been given to someone else) is
-- not brought back: ZADD XX only updates members that exist. The key's TTL is extended to
-- cover the new deadline (GT: never shortened).

--@ renew
local lease = tonumber(ARGV[2])
local deadline = string.format('%d', now + lease)
local ttl = string.format('%d', math.ceil(lease / 1000) + 1)
local renewed = 0
for k = 1, #KEYS do
  local score = redis.call('ZSCORE', KEYS[k], ARGV[k + 2])
  if score and tonumber(score) > now then
    redis.call('ZADD', KEYS[k], 'XX', deadline, ARGV[k + 2])
    redis.call('PEXPIRE', KEYS[k], ttl, 'GT')
    renewed = renewed + 1
  end
end
return renewed
