-- tollgate's peek: what the check of a policy would decide now, with nothing written.
-- Rust twin: src/algorithm/mod.rs (`peek`: phase 1 of `decide` alone); assembly:
-- src/store/script/peek.rs.
--
-- The peek script is generated as the check script is (see check.lua), from the same prelude,
-- fragments and driver sections, for the same KEYS and ARGV (no lease id: a peek takes no
-- slot), and answers with the same reply. It is the check's phase 1 alone: each identifier's
-- packed state is read and evaluated (the sections below stand for check.lua's `unpack` …
-- `stored_close`, without the fresh-state shortcut, the charge and the TTL), each sorted set
-- is evaluated by its fragment, and phase 2 is left out. Declared `no-writes`, so Redis
-- itself refuses any write in it: a peek changes no key, value or TTL.
--
-- The reply's verdict is whether every pair admits the cost; the sorted sets are reported as
-- evaluated (their `report` fragments append the record phase 1 made, whatever the verdict;
-- `ok` is cleared before the reply, as nothing was charged, and the client reads a log's
-- record as charged with nothing).

--@ shebang
#!lua flags=no-writes

--@ open
  if ok then
    -- the packed state, evaluated as the check evaluates a stored one
    local T, $fields = 0, $zeros
    if got$j then
      T, $fields = struct.unpack('$format', got$j)
    end
    local old = 0

--@ close
  end

--@ reply_open
local head = (ok and '1' or '0') .. sec .. ',' .. usec .. ';'
-- nothing was charged: the sorted sets are reported as they are
ok = false
