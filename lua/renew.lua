-- tollgate: extends concurrency leases that are still held.
--
-- KEYS: the slot sets; ARGV: now (µs; empty to read the server clock), lease (µs), then one
-- lease id per key. A lease that already expired (and may have been given to someone else) is
-- not brought back: ZADD XX only updates members that exist. The key's TTL is extended to
-- cover the new deadline (GT: never shortened).
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local lease = tonumber(ARGV[2])
local deadline = string.format('%.0f', now + lease)
local ttl = string.format('%.0f', math.ceil(lease / 1000) + 1)
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
