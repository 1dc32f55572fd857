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
--   ARGV  'gcra', cost, interval (us), burst, max delay (ms, 0: none):
--         the rule's arguments as a general decision has them
-- Replies with one integer, cheaper than a table: how far the TAT lay ahead
-- before the request (us), or -1 minus that when the request is denied;
-- the caller derives every header from it, and a delay: an admitted
-- request whose TAT then lies past the burst is served that much later. Numbers go to redis.call as
-- '%d' text, which Redis converts for less than a Lua number.
if op == 'gcra' and not overridden then
  local key, cost, interval_us, burst = KEYS[1], argv[2] + 0, argv[3] + 0, argv[4] + 0
  local delay_us = argv[5] * 1000
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
  -- Within the delay, the request is reserved at the instant it conforms:
  -- charged now, so that no later request can take that instant.
  local tolerance = interval_us * burst
  if after > tolerance and (after > tolerance + delay_us or cost > burst or cost == 0) then
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

-- GCRA's steps in the general path (limiter.lua, which lists the
-- algorithms' tables by their word), built only for the calls that reach
-- it: Redis builds every function of a script anew on each call. A rule
-- is a table of its figures; a write is how far ahead of now its TAT is to
-- be stored (us).
local gcra = nil
if general then
  -- Sized where it is made: each field then fills a slot, with no rehash.
  gcra = { read = false, commit = false, refund = false, decide = false, build = false, mark = false,
    grant = false, apply = false, shift = false }
  -- The call's clock in microseconds: the pinned one, or TIME read once,
  -- when a mark or a refund first needs it.
  local clock_us = now_us
  local function clock()
    if not clock_us then
      local time = redis.call('TIME')
      clock_us = time[1] * 1000000 + time[2]
    end
    return clock_us
  end

  -- A rule of `cost`, its figures read after its word and cost: interval
  -- (us), burst, the longest delay (ms, 0: none); with how far its TAT lay
  -- ahead when last decided.
  function gcra.read(cost)
    local interval_us, burst, delay_ms = read(3)
    return { algorithm = gcra, cost = cost, interval_us = interval_us + 0, burst = burst + 0,
      delay_us = delay_ms * 1000, ahead_us = 0 }
  end

  -- How far the key's TAT lies ahead of now, microseconds (0: not at all).
  local function ahead_of(key, interval_us)
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

  -- Stores an admitted request's TAT, `ahead_us` from now. On Redis's
  -- clock the key lives exactly until the TAT has passed: by then a fresh
  -- key would behave the same, and the expiry can never outlast the debt,
  -- so nobody is locked out by it.
  function gcra.commit(key, ahead_us)
    local ttl = math.ceil(ahead_us / 1000)
    if now_us then
      redis.call('SET', key, now_us + ahead_us, 'PX', ttl + 86400000)
    elseif ttl * 1000 > ahead_us then
      redis.call('SET', key, ttl * 1000 - ahead_us, 'PX', ttl)
    else
      redis.call('SET', key, '', 'PX', ttl)
    end
  end

  -- A debit, what a response reported past the charge made up front: the
  -- TAT moves on by its units from now or from where it lies, past the
  -- burst if it must, so the client is denied until the debt is paid off.
  -- At most one burst past it, so no run of debts locks a client out for
  -- longer than two bursts take to pay off. Returns 1 if the TAT moved.
  if op == 'debit' then
    function gcra.refund(rule, key)
      local interval_us = rule.interval_us
      local ahead_us = ahead_of(key, interval_us)
      local owed_us = math.min(ahead_us + rule.cost * interval_us, 2 * interval_us * rule.burst)
      if owed_us <= ahead_us then
        return 0
      end
      gcra.commit(key, owed_us)
      return 1
    end
  -- A refund needs only its own step; every other call, the decision's.
  elseif op == 'refund' then
    -- Gives back what a charge of rule.cost units still holds, the charge
    -- having left the TAT at `mark_us` (the call's clock, microseconds): at
    -- most its cost, and none of what time has paid off since, so that no
    -- refund can undo another request's charge. Returns 1 if anything was
    -- given back.
    function gcra.refund(rule, key, mark_us)
      local ahead_us = ahead_of(key, rule.interval_us)
      if ahead_us <= 0 then
        return 0 -- paid off, or expired: nothing left to give back
      end
      local back_us = math.min(rule.cost * rule.interval_us, mark_us - clock())
      if back_us <= 0 then
        return 0
      end
      if ahead_us <= back_us then
        redis.call('DEL', key)
      else
        gcra.commit(key, ahead_us - back_us)
      end
      return 1
    end
  else
    -- Decides the rule at `cost` (0 = peek) without writing anything, and
    -- keeps how far its TAT lay ahead (rule.ahead_us) for a lease.
    -- Returns the six reply fields: allowed (1/0), limit, remaining,
    -- reset_after, retry_after (milliseconds, rounded up; -1: never) and window
    -- (always 1); then the write if the whole request is admitted (nil:
    -- nothing to write); then, for a denial that waiting would cure, how
    -- long the request must wait to conform (us).
    function gcra.decide(rule, key, cost)
      local interval_us, burst = rule.interval_us, rule.burst
      local ahead_us = ahead_of(key, interval_us)
      rule.ahead_us = ahead_us
      local tolerance = interval_us * burst
      local after = ahead_us + cost * interval_us
      if after <= tolerance then
        local write
        if cost > 0 then
          write = after
        end
        return 1, burst, math.floor((tolerance - after) / interval_us), math.ceil(after / 1000), 0, 1, write
      end
      local retry_after, wait_us = -1, nil -- more than a fresh key could ever admit: no wait helps
      if cost <= burst then
        -- The earliest instant at which the request fits the tolerance.
        retry_after = math.ceil((after - tolerance) / 1000)
        if cost > 0 then
          wait_us = after - tolerance
        end
      end
      return 0, burst, math.floor((tolerance - ahead_us) / interval_us), math.ceil(ahead_us / 1000), retry_after, 1,
        nil, wait_us
    end

    -- The steps only some calls need, each built when limiter.lua asks
    -- for it (`build`): a charge's refund mark, a lease, an override.
    function gcra.build(step)
      if step == 'mark' then
        -- A charge's refund mark: the TAT it left, on the call's clock (us).
        function gcra.mark(ahead_us)
          return clock() + ahead_us
        end
      elseif step == 'shift' then
        -- The request of `cost` decided into `o`, accounted as arriving
        -- `later_us` from now, where the worker forwards it; `wait_us` is
        -- how long this rule needs it to wait, if at all (past later_us
        -- only for a shadow rule's own delay). Returns the write that
        -- charges it; the reply's retry is the wait its own delay made.
        function gcra.shift(rule, o, cost, later_us, wait_us)
          local interval_us = rule.interval_us
          local write = math.max(rule.ahead_us, later_us) + cost * interval_us
          local arrives_us = math.max(later_us, wait_us or 0)
          local own_us = 0
          if rule.delay_us > 0 then
            own_us = wait_us or 0
          end
          o.allowed, o.retry_after = 1, math.ceil(own_us / 1000)
          o.remaining = math.floor((interval_us * rule.burst - write + arrives_us) / interval_us)
          o.reset_after = math.ceil(write / 1000)
          return write
        end
      elseif step == 'grant' then
        -- A lease of at most lease.units for the admitted request decided at
        -- `cost`, whose fields are `outcome`: accounted as arriving when it ends
        -- (lease.ms from now), and granted only if that conforms now, so any
        -- spend before then conforms whatever other callers do. Returns the
        -- units, how long they may be spent (ms) and the write that charges
        -- them with the request; 0 units for none.
        function gcra.grant(rule, _, outcome, cost, lease)
          local interval_us, burst = rule.interval_us, rule.burst
          local from_us = math.max(rule.ahead_us, lease.ms * 1000)
          local left = math.floor((interval_us * burst - from_us - cost * interval_us) / interval_us)
          local units = math.min(lease.units, math.floor(left / 2))
          if units <= 0 then
            return 0, 0, nil
          end
          local write = from_us + (cost + units) * interval_us
          outcome.remaining = math.floor((interval_us * burst - write) / interval_us)
          outcome.reset_after = math.ceil(write / 1000)
          return units, lease.ms, write
        end
      elseif step == 'apply' then
        -- Whether `text` is a GCRA override ('v1 gcra <rate> <period ms>
        -- <burst> <interval us>'); if so, its figures replace the rule's.
        -- Checked as the configuration checks them (src/rules/policy/gcra.rs).
        function gcra.apply(rule, text)
          local rate, period_ms, burst, interval_us =
            string.match(text, '^v1 gcra ([1-9]%d*) ([1-9]%d*) ([1-9]%d*) ([1-9]%d*)$')
          if not rate then
            return false
          end
          rate, period_ms = rate + 0, period_ms + 0
          local exact = interval_us + 0 == math.floor((period_ms * 1000 + math.floor(rate / 2)) / rate)
          if exact and rate <= period_ms * 1000 and period_ms <= 31622400000 and burst + 0 <= 1000000000
            and interval_us * burst <= 2251799813685248 then
            rule.interval_us, rule.burst = interval_us + 0, burst + 0
            return true
          end
          return false
        end
      end
    end
  end
end
