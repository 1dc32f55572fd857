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
-- Units: every time here is an integer number of microseconds. The emission
-- interval comes in already rounded to a whole microsecond, so no sum ever
-- rounds and the Rust reference model can reproduce every figure exactly.
--
-- Where the TAT lives. On Redis's clock the key's own expiry is the state:
-- the key is written to expire at the TAT, so its remaining time to live
-- (PTTL) is how far the TAT lies ahead of now, and no clock is read at all.
-- That saves the TIME call, and a key can never outlive its debt because the
-- two are one number. Expiries are whole milliseconds; when the interval is
-- not, the value holds what rounding the expiry up added (microseconds), so
-- no precision is lost over many admissions. With a pinned clock (tests,
-- simulations) Redis's clock is not the timeline, so the value holds the TAT
-- itself.

-- How far the key's TAT lies ahead of now, microseconds (0: not at all).
--   now       the pinned clock, microseconds, or nil for Redis's clock
local function gcra_ahead(key, now, interval)
  local ahead
  if now then
    ahead = 0
    local stored = redis.call('GET', key)
    -- A value of any other length (an older format, a stray write) is no state.
    if stored and #stored == 8 then
      ahead = struct.unpack('<d', stored) - now
    end
  else
    -- -2 (no key) and -1 (a key without expiry, which this script never
    -- writes) both come out negative: no state.
    ahead = redis.call('PTTL', key) * 1000
    if ahead > 0 and interval % 1000 ~= 0 then
      local stored = redis.call('GET', key)
      if stored and #stored == 8 then
        -- Anything outside a millisecond is no remainder: a TAT written by
        -- an older release, whose expiry alone then tells the debt.
        local slack = struct.unpack('<d', stored)
        if slack >= 0 and slack < 1000 then
          ahead = ahead - slack
        end
      end
    end
  end
  if ahead < 0 then
    return 0
  end
  return ahead
end

-- Decides one rule without writing anything.
--   ahead     how far the TAT lies ahead of now (gcra_ahead)
--   cost      units this request asks for (0 = peek)
--   interval  emission interval, microseconds (>= 1)
--   burst     units admitted back to back from a fresh key (>= 1)
-- Returns the six reply fields: allowed (1/0), limit, remaining,
-- reset_after, retry_after (milliseconds, rounded up; -1: never) and window
-- (always 1); then how far ahead the TAT is to be stored if the whole
-- request is admitted (nil: nothing to write).
local function gcra_check(ahead, cost, interval, burst)
  local tolerance = interval * burst
  local after = ahead + cost * interval
  if after <= tolerance then
    local write
    if cost > 0 then
      write = after
    end
    return 1, burst, math.floor((tolerance - after) / interval), math.ceil(after / 1000), 0, 1, write
  end
  local retry_after = -1 -- more than a fresh key could ever admit: no wait helps
  if cost <= burst then
    -- The earliest instant at which the request fits the tolerance.
    retry_after = math.ceil((after - tolerance) / 1000)
  end
  return 0, burst, math.floor((tolerance - ahead) / interval), math.ceil(ahead / 1000), retry_after, 1, nil
end

-- Stores an admitted request's TAT, `ahead` microseconds from now. The key
-- lives exactly until the TAT has passed: by then a fresh key would behave
-- the same, and the expiry can never outlast the debt, so nobody is locked
-- out by it.
local function gcra_commit(key, now, ahead)
  local ttl = math.ceil(ahead / 1000)
  local value = ''
  if now then
    value = struct.pack('<d', now + ahead)
    -- Stand-in until main's pinned-mode expiry lands (issue 14 branch):
    -- on a pinned clock the key must outlive a replay slower than its log.
    ttl = ttl + 86400000
  elseif ttl * 1000 > ahead then
    value = struct.pack('<d', ttl * 1000 - ahead)
  end
  redis.call('SET', key, value, 'PX', string.format('%d', ttl))
end

-- Decides a request that only this rule governs, and writes if it is
-- admitted. The reply is one integer instead of the six fields: how far the
-- TAT lay ahead before the request (microseconds), or -1 minus that when
-- the request is denied. The caller knows cost, interval and burst, so every
-- field follows from it (gcra_check's arithmetic, done in Rust), and Redis
-- turns a number into its reply for about 1 us less than a table.
local function gcra_decide(key, now, cost, interval, burst)
  local ahead = gcra_ahead(key, now, interval)
  local after = ahead + cost * interval
  if after > interval * burst then
    return -1 - ahead
  end
  if cost > 0 then
    gcra_commit(key, now, after)
  end
  return ahead
end
