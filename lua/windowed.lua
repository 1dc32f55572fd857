-- Windowed limiter: several sliding windows over one hash per key.
--
-- Each window [duration, limit, precision] (milliseconds, precision divides
-- duration) splits time into buckets of `precision` and counts the cost
-- admitted in each. A request is admitted when, in every window, the cost in
-- the buckets that still overlap the window plus this request's cost fits the
-- limit. precision == duration is a plain fixed window.
--
-- The hash holds, per window, under the prefix "<duration>:<precision>:":
--   t        running total of the buckets still counted
--   l        id of the newest bucket written (every bucket field lies in
--            [l - buckets + 1, l], so trimming never scans more than one window)
--   <id>     cost admitted in bucket <id>
-- Only admitted requests are counted, so a flood of rejected calls can grow
-- neither the hash nor its lifetime.
--
-- `offset` (milliseconds, chosen per key by the caller) shifts every bucket
-- edge, so that clients' windows do not all roll over at the same instant.

-- Decides one rule without writing anything.
--   key     the hash (may be absent)
--   now     current time, milliseconds
--   cost    units this request asks for (0 = peek)
--   offset  bucket edge shift, milliseconds
--   at, n   the n windows' duration, limit, precision are ARGV[at], ARGV[at+1]...
-- Returns allowed (1/0), limit, remaining, reset_after, retry_after, window
-- (1-based) of the binding window (times in milliseconds; -1: never), then
-- the plan windowed_commit needs if the whole request is admitted (or nil).
local function windowed_check(key, now, cost, offset, at, n)
  local shifted = now + offset
  local fields = {}
  for j = 1, n do
    local base = at + 3 * j - 3
    -- The argument strings make the field names without a number conversion.
    local prefix = ARGV[base] .. ':' .. ARGV[base + 2] .. ':'
    fields[3 * j - 2], fields[3 * j - 1] = prefix .. 't', prefix .. 'l'
    fields[3 * j] = prefix .. floor(shifted / tonumber(ARGV[base + 2]))
  end
  local stored = redis.call('HMGET', key, unpack(fields))
  -- HSET's arguments for an admission, filled in as the windows are
  -- decided, so that windowed_commit needs no table of its own.
  local hash = {}

  local allowed, bound, bound_limit, bound_remaining, bound_reset, bound_retry = 1, 1, 0, nil, 0, 0
  local stale, moved, expire_at = nil, false, 0
  for j = 1, n do
    local base = at + 3 * j - 3
    local limit, precision = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
    local buckets = tonumber(ARGV[base]) / precision
    local cur = floor(shifted / precision)
    local first = cur - buckets + 1
    local total = tonumber(stored[3 * j - 2]) or 0
    local stored_last = tonumber(stored[3 * j - 1])
    -- A window new to this key has no newest id yet: count it from now.
    local last = stored_last or cur
    if stored_last ~= cur then
      moved = true
    end
    local prefix = string.sub(fields[3 * j - 2], 1, -2)
    if last - buckets + 1 < first then
      -- Buckets that have slid out of the window since the last admission.
      local old = {}
      for id = last - buckets + 1, math.min(first - 1, last) do
        old[#old + 1] = prefix .. id
      end
      for _, c in ipairs(redis.call('HMGET', key, unpack(old))) do
        total = total - (tonumber(c) or 0)
      end
      stale = stale or {}
      for _, f in ipairs(old) do
        stale[#stale + 1] = f
      end
    end

    local fits = total + cost <= limit
    local retry_after = 0
    if fits then
      if cost > 0 then
        total = total + cost
        last = cur
      end
    elseif cost > limit then
      retry_after = -1
    else
      -- Walk the counted buckets oldest first until enough cost has left.
      local from = math.max(first, last - buckets + 1)
      local names = {}
      for id = from, last do
        names[#names + 1] = prefix .. id
      end
      local need, freed, id = total + cost - limit, 0, from
      for _, c in ipairs(redis.call('HMGET', key, unpack(names))) do
        freed = freed + (tonumber(c) or 0)
        if freed >= need then
          break
        end
        id = id + 1
      end
      retry_after = (id + buckets) * precision - shifted
    end
    local reset_after = 0
    if total > 0 then
      reset_after = (last + buckets) * precision - shifted
    end
    local remaining = limit - total

    if not fits then
      if allowed == 1 or later(retry_after, bound_retry) then
        bound, bound_limit, bound_remaining, bound_reset, bound_retry = j, limit, remaining, reset_after, retry_after
      end
      allowed = 0
    elseif allowed == 1 and (bound_remaining == nil or remaining < bound_remaining) then
      bound, bound_limit, bound_remaining, bound_reset = j, limit, remaining, reset_after
    end
    local k = 6 * j
    hash[k - 5], hash[k - 4] = fields[3 * j - 2], total
    hash[k - 3], hash[k - 2] = fields[3 * j - 1], cur
    hash[k - 1], hash[k] = fields[3 * j], (tonumber(stored[3 * j]) or 0) + cost
    expire_at = math.max(expire_at, (cur + buckets) * precision)
  end

  local plan
  if allowed == 1 and cost > 0 then
    plan = hash
    plan.stale = stale
    -- The key lives until its newest bucket leaves the longest window; that
    -- instant only moves when some window's current bucket does.
    if moved then
      plan.expire = expire_at - shifted
    end
  end
  return allowed, bound_limit, bound_remaining, bound_reset, bound_retry, bound, plan
end

-- Records an admitted request: one HSET for every window's bucket, total and
-- newest id, one HDEL for the buckets that left, and a PEXPIRE when the
-- expiry moves. Only admissions reach here, so denied traffic can never
-- prolong a key.
local function windowed_commit(key, plan)
  redis.call('HSET', key, unpack(plan))
  if plan.stale then
    redis.call('HDEL', key, unpack(plan.stale))
  end
  if plan.expire then
    redis.call('PEXPIRE', key, plan.expire)
  end
end
