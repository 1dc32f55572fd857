-- Penalties: once a rule with a penalty denies a client, the client is
-- denied by that rule for the whole penalty, whatever its rate would allow
-- meanwhile. One key per client and rule holds a running penalty; it is
-- written only when a penalty starts, never while one runs, so requests
-- made during a penalty cannot extend it, and it expires by itself.
--
-- On Redis's clock the key's expiry is the penalty: PTTL tells what is
-- left. With a pinned clock (tests, simulations) the value holds the
-- instant it ends, and the key lives one day longer (see common.lua).

-- Milliseconds left of a running penalty (0: none).
--   now   the pinned clock, milliseconds, or nil for Redis's clock
local function penalty_left(key, now)
  local left
  if now then
    left = (tonumber(redis.call('GET', key) or '') or 0) - now
  else
    left = redis.call('PTTL', key)
  end
  if left > 0 then
    return left
  end
  return 0
end

-- Starts a penalty of `ms` milliseconds (decimal text), from now.
local function penalty_start(key, now, ms)
  if now then
    redis.call('SET', key, string.format('%d', now + ms), 'PX', string.format('%d', ms + 86400000))
  else
    redis.call('SET', key, '', 'PX', ms)
  end
end
