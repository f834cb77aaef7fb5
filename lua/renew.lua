-- tollgate: extends concurrency leases that are still held.
-- Rust twin: src/algorithm/concurrency.rs (`renew`).
--
-- KEYS: the slot sets; ARGV: lease (µs), now (µs; empty to read the server clock), then one
-- lease id per key. A lease that already expired (and may have been given to someone else) is
-- not brought back: ZADD XX only updates members that exist. The key's TTL is extended to
-- cover the new deadline (GT: never shortened; with a caller's clock at least a minute). Returns, per key, 1 when its lease was
-- renewed and 0 when the set holds it no longer (expired, or lost with the key), so that the
-- caller can tell a request whose slot is gone.

--@ renew
local lease = tonumber(ARGV[1])
local deadline = string.format('%d', now + lease)
local ttl = math.ceil(lease / 1000) + 1
if not realtime and ttl < 60000 then
  -- with a caller's clock at least a minute, as every key's (see concurrency.lua)
  ttl = 60000
end
ttl = string.format('%d', ttl)
local renewed = {}
for k = 1, #KEYS do
  local score = redis.call('ZSCORE', KEYS[k], ARGV[k + 2])
  renewed[k] = 0
  if score and tonumber(score) > now then
    redis.call('ZADD', KEYS[k], 'XX', deadline, ARGV[k + 2])
    redis.call('PEXPIRE', KEYS[k], ttl, 'GT')
    renewed[k] = 1
  end
end
return renewed
