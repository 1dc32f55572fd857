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
-- not, the value holds what rounding the expiry up added (microseconds, as
-- decimal text), so no precision is lost over many admissions. With a
-- pinned clock (tests, simulations) Redis's clock is not the timeline, so
-- the value holds the TAT itself.

-- One GCRA rule governing a request alone, on Redis's clock: the commonest
-- call, decided before any function of the script is built.
--   KEYS  the rule's state, then the client's override key when the rule
--         takes overrides (common.lua: with one stored, the general
--         decision decides the call instead)
--   ARGV  'gcra', cost, interval (us), burst: the rule's arguments as a
--         general decision has them
-- Replies with one integer, cheaper than a table: how far the TAT lay ahead
-- before the request (us), or -1 minus that when the request is denied;
-- the caller derives every header from it. Numbers go to redis.call as
-- '%d' text, which Redis converts for less than a Lua number.
if op == 'gcra' and not overridden then
  local key, cost, interval_us, burst = KEYS[1], argv[2] + 0, argv[3] + 0, argv[4] + 0
  -- -2 (no key) and -1 (a key without expiry, which this script never
  -- writes) both come out negative: no state.
  local pttl = call('PTTL', key)
  local ahead = pttl * 1000
  if ahead > 0 and interval_us % 1000 ~= 0 then
    -- Anything but a number within a millisecond is no remainder (an
    -- older release's value): the expiry alone then tells the debt.
    local slack = tonumber(call('GET', key) or '')
    if slack and slack >= 0 and slack < 1000 then
      ahead = ahead - slack
    end
  end
  if ahead < 0 then
    ahead = 0
  end
  local after = ahead + cost * interval_us
  if after > interval_us * burst then
    return -1 - ahead
  end
  if cost > 0 then
    local ttl = math.ceil(after / 1000)
    if ttl * 1000 > after then
      call('SET', key, string.format('%d', ttl * 1000 - after), 'PX', string.format('%d', ttl))
    elseif pttl >= 0 and interval_us % 1000 == 0 then
      -- Whole milliseconds: the value stays empty, only the expiry moves.
      call('PEXPIRE', key, string.format('%d', ttl))
    else
      call('SET', key, '', 'PX', string.format('%d', ttl))
    end
  end
  return ahead
end

-- The general path's functions (limiter.lua), built only for the calls
-- that reach it: Redis builds every function of a script anew on each call.
local gcra_ahead, gcra_check, gcra_commit, gcra_refund
if general then
  -- How far the key's TAT lies ahead of now, microseconds (0: not at all).
  --   now_us    the pinned clock, or nil for Redis's clock
  function gcra_ahead(key, now_us, interval_us)
    local ahead
    if now_us then
      ahead = 0
      -- Text that is no number (an older format, a stray write) is no state.
      local tat = tonumber(redis.call('GET', key) or '')
      if tat then
        ahead = tat - now_us
      end
    else
      ahead = redis.call('PTTL', key) * 1000
      if ahead > 0 and interval_us % 1000 ~= 0 then
        local slack = tonumber(redis.call('GET', key) or '')
        if slack and slack >= 0 and slack < 1000 then
          ahead = ahead - slack
        end
      end
    end
    if ahead < 0 then
      return 0
    end
    return ahead
  end

  -- Decides one rule without writing anything.
  --   ahead_us     how far the TAT lies ahead of now (gcra_ahead)
  --   cost         units this request asks for (0 = peek)
  --   interval_us  emission interval (>= 1)
  --   burst        units admitted back to back from a fresh key (>= 1)
  -- Returns the six reply fields: allowed (1/0), limit, remaining,
  -- reset_after, retry_after (milliseconds, rounded up; -1: never) and window
  -- (always 1); then how far ahead the TAT is to be stored if the whole
  -- request is admitted (nil: nothing to write).
  function gcra_check(ahead_us, cost, interval_us, burst)
    local tolerance = interval_us * burst
    local after = ahead_us + cost * interval_us
    if after <= tolerance then
      local write
      if cost > 0 then
        write = after
      end
      return 1, burst, math.floor((tolerance - after) / interval_us), math.ceil(after / 1000), 0, 1, write
    end
    local retry_after = -1 -- more than a fresh key could ever admit: no wait helps
    if cost <= burst then
      -- The earliest instant at which the request fits the tolerance.
      retry_after = math.ceil((after - tolerance) / 1000)
    end
    return 0, burst, math.floor((tolerance - ahead_us) / interval_us), math.ceil(ahead_us / 1000), retry_after, 1, nil
  end

  -- Stores an admitted request's TAT, `ahead` microseconds from now. On
  -- Redis's clock the key lives exactly until the TAT has passed: by then a
  -- fresh key would behave the same, and the expiry can never outlast the
  -- debt, so nobody is locked out by it.
  function gcra_commit(key, now_us, ahead_us)
    local ttl = math.ceil(ahead_us / 1000)
    if now_us then
      redis.call('SET', key, now_us + ahead_us, 'PX', ttl + 86400000)
    elseif ttl * 1000 > ahead_us then
      redis.call('SET', key, ttl * 1000 - ahead_us, 'PX', ttl)
    else
      redis.call('SET', key, '', 'PX', ttl)
    end
  end

  -- Gives back what a charge of `cost` units still holds, the charge having
  -- left the TAT at `mark_us` (Redis's clock, microseconds): at most its
  -- cost, and none of what time has paid off since, so that no refund can
  -- undo another request's charge. Returns 1 if anything was given back.
  --   now_us  the pinned clock, or nil for Redis's clock
  function gcra_refund(key, now_us, interval_us, cost, mark_us)
    local ahead_us = gcra_ahead(key, now_us, interval_us)
    if ahead_us <= 0 then
      return 0 -- paid off, or expired: nothing left to give back
    end
    local clock_us = now_us
    if not clock_us then
      local time = redis.call('TIME')
      clock_us = time[1] * 1000000 + time[2]
    end
    local back_us = math.min(cost * interval_us, mark_us - clock_us)
    if back_us <= 0 then
      return 0
    end
    if ahead_us <= back_us then
      redis.call('DEL', key)
    else
      gcra_commit(key, now_us, ahead_us - back_us)
    end
    return 1
  end
end
