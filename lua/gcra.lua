-- GCRA: the Generic Cell Rate Algorithm, as one stored number per key.
--
-- In plain words: every unit of cost "occupies" the limiter for one emission
-- interval (period / rate). The key stores the theoretical arrival time (TAT):
-- the instant at which everything admitted so far will have been paid off. A
-- request of cost c is admitted when, after adding c intervals to the TAT, the
-- TAT lies no further ahead of now than the tolerance (burst intervals). So a
-- fresh key admits exactly `burst` units back to back, then one unit per
-- interval.
--
-- Units: every time here is an integer number of microseconds, which Lua's
-- doubles hold exactly until the year 2255. The emission interval comes in
-- already rounded to a whole microsecond, so no sum ever rounds and the Rust
-- reference model can reproduce every figure exactly.

-- Decides one rule without writing anything.
--   key       the Redis key holding the TAT (may be absent)
--   now       current time, microseconds
--   cost      units this request asks for (0 = peek)
--   interval  emission interval, microseconds (>= 1)
--   burst     units admitted back to back from a fresh key (>= 1)
-- Returns the six reply fields: allowed (1/0), limit, remaining,
-- reset_after, retry_after (milliseconds, rounded up; -1: never) and window
-- (always 1); then the TAT to store if the whole request is admitted (nil:
-- nothing to write).
local function gcra_check(key, now, cost, interval, burst)
  local tolerance = interval * burst
  local tat = now
  local stored = redis.call('GET', key)
  -- A value of any other length (an older format, a stray write) is no state.
  if stored and #stored == 8 then
    tat = unpack_number(NUMBER, stored)
    if tat < now then
      tat = now
    end
  end
  local ahead = tat + cost * interval - now
  if ahead <= tolerance then
    local write
    if cost > 0 then
      write = now + ahead
    end
    return 1, burst, floor((tolerance - ahead) / interval), ceil(ahead / 1000), 0, 1, write
  end
  local retry_after = -1 -- more than a fresh key could ever admit: no wait helps
  if cost <= burst then
    -- The earliest instant at which the request fits the tolerance.
    retry_after = ceil((ahead - tolerance) / 1000)
  end
  ahead = tat - now
  return 0, burst, floor((tolerance - ahead) / interval), ceil(ahead / 1000), retry_after, 1, nil
end

-- Stores an admitted request's TAT. The key lives exactly until the TAT has
-- passed: by then a fresh key would behave the same, and the expiry can
-- never outlast the debt, so nobody is locked out by it.
local function gcra_commit(key, now, tat)
  redis.call('SET', key, pack(NUMBER, tat), 'PX', string.format('%d', ceil((tat - now) / 1000)))
end
