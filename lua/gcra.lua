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

local gcra = {}

-- Decides one rule without writing anything.
--   key       the Redis key holding the TAT (may be absent)
--   now       current time, microseconds
--   cost      units this request asks for (0 = peek)
--   interval  emission interval, microseconds (>= 1)
--   burst     units admitted back to back from a fresh key (>= 1)
-- Returns a result table (see limiter.lua for the fields; its times are
-- milliseconds, rounded up) whose `write` member, when present, is the state
-- to store if the whole request is admitted.
function gcra.check(key, now, cost, interval, burst)
  local tolerance = interval * burst
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then
    tat = now
  end
  local new_tat = tat + cost * interval
  local result = { limit = burst, window = 1 }
  if new_tat - now <= tolerance then
    result.allowed = 1
    result.retry_after = 0
    if cost > 0 then
      result.write = { new_tat, now }
    end
  else
    result.allowed = 0
    if cost > burst then
      -- More than a fresh key could ever admit: no wait helps.
      result.retry_after = -1
    else
      -- The earliest instant at which new_tat - now fits the tolerance.
      result.retry_after = math.ceil((new_tat - now - tolerance) / 1000)
    end
    new_tat = tat
  end
  result.remaining = math.floor((tolerance - (new_tat - now)) / interval)
  result.reset_after = math.ceil((new_tat - now) / 1000)
  return result
end

-- Stores an admitted request's TAT. The key lives exactly until the TAT has
-- passed: by then a fresh key would behave the same, and the expiry can
-- never outlast the debt, so nobody is locked out by it.
function gcra.commit(key, result)
  local tat, now = result.write[1], result.write[2]
  local ttl_ms = math.ceil((tat - now) / 1000)
  redis.call('SET', key, string.format('%.0f', tat), 'PX', ttl_ms)
end
