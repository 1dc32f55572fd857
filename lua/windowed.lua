-- Windowed limiter: several sliding windows over one hash per key.
--
-- Each window [duration, limit, precision] (milliseconds, precision divides
-- duration) splits time into buckets of `precision` and counts the cost
-- admitted in each. A request is admitted when, in every window, the cost in
-- the buckets that still overlap the window plus this request's cost fits the
-- limit. precision == duration is a plain fixed window.
--
-- The hash holds, per window, with P = "<duration>:<precision>":
--   P          "<total> <newest> <cost>": the running total of the buckets
--              still counted, the id of the newest bucket holding cost, and
--              that bucket's cost. So a request in the same bucket as the
--              last one reads and writes this one field per window.
--   P:<id>     cost admitted in an older bucket <id>, written when a newer
--              bucket takes its place in P (its two colons keep it apart
--              from every P).
-- Every bucket field lies in [newest - buckets + 1, newest - 1], so trimming
-- never scans more than one window. Only admitted requests are counted, so a
-- flood of rejected calls can grow neither the hash nor its lifetime.
--
-- `offset` (milliseconds, chosen per key by the caller) shifts every bucket
-- edge, so that clients' windows do not all roll over at the same instant.

-- Decides one rule without writing anything.
--   key     the hash (may be absent)
--   now     current time, milliseconds
--   pinned  true when `now` is a pinned clock rather than Redis's
--   cost    units this request asks for (0 = peek)
--   offset  bucket edge shift, milliseconds
--   at, n   the n windows' duration, limit, precision are ARGV[at], ARGV[at+1]...
--   wipe    true to ignore whatever the hash holds and replace it whole
-- Returns the six reply fields of the binding window: allowed (1/0), limit,
-- remaining, reset_after, retry_after (milliseconds; -1: never) and its
-- 1-based index; then the arguments windowed_commit needs if the whole
-- request is admitted (nil: nothing to write).
local function windowed_check(key, now, pinned, cost, offset, at, n, wipe)
  local shifted = now + offset
  local fields = { nil }
  for j = 1, n do
    local b = at + 3 * j - 3
    fields[j] = ARGV[b] .. ':' .. ARGV[b + 2]
  end
  local stored
  if wipe then
    stored = {}
  else
    stored = redis.call('HMGET', key, unpack(fields))
  end
  -- HSET's arguments, filled in while every window admits the request.
  local plan, np = { nil, nil }, 0

  -- The binding window so far, and its fields.
  local allowed, bound, b_limit, b_remaining, b_reset, b_retry = 1, 0, 0, 0, 0, 0
  local stale, moved, expire_at = nil, false, 0
  for j = 1, n do
    local b = at + 3 * j - 3
    local limit, precision = ARGV[b + 1] + 0, ARGV[b + 2] + 0
    local buckets = ARGV[b] / precision
    local cur = math.floor(shifted / precision)
    local prefix = fields[j]
    -- last: the newest bucket holding cost, last_cost: its cost.
    local total, last, last_cost = 0, cur, 0
    local state = stored[j]
    if state then
      local t, l, c = string.match(state, '^(%d+) (%-?%d+) (%d+)$')
      if not t then
        -- Not three integers (an older release's format, a stray write):
        -- the whole hash is no state, and is replaced before the next write
        -- so that none of its fields can linger or be counted.
        return windowed_check(key, now, pinned, cost, offset, at, n, true)
      end
      total, last, last_cost = t + 0, l + 0, c + 0
    else
      moved = true -- a window new to this key
    end
    if last < cur then
      -- The older buckets up to cur - buckets have slid out of the window
      -- since the last admission: forget them.
      moved = true
      stale = stale or {}
      local from = #stale + 1
      for id = last - buckets + 1, math.min(cur - buckets, last - 1) do
        stale[#stale + 1] = string.format('%s:%d', prefix, id)
      end
      if last <= cur - buckets then
        total = 0 -- every bucket, the newest too
      else
        for _, c in ipairs(redis.call('HMGET', key, unpack(stale, from))) do
          total = total - (tonumber(c) or 0)
        end
      end
    end

    local fits = total + cost <= limit
    local retry_after, newest = 0, last
    if fits then
      if cost > 0 then
        total, newest = total + cost, cur
      end
    elseif cost > limit then
      retry_after = -1
    else
      -- Walk the counted buckets oldest first until enough cost has left;
      -- the newest one's cost is in the state.
      local from = math.max(cur, last) - buckets + 1
      local need, freed, id = total + cost - limit, 0, from
      if from < last then
        local names = {}
        for i = from, last - 1 do
          names[#names + 1] = string.format('%s:%d', prefix, i)
        end
        for _, c in ipairs(redis.call('HMGET', key, unpack(names))) do
          freed = freed + (tonumber(c) or 0)
          if freed >= need then
            break
          end
          id = id + 1
        end
      end
      retry_after = (id + buckets) * precision - shifted
    end
    local reset_after = 0
    if total > 0 then
      reset_after = (newest + buckets) * precision - shifted
    end
    local remaining = limit - total

    -- When denied, the first denying window that frees up last binds; when
    -- admitted, the first with the fewest units left.
    if not fits then
      if allowed == 1 or (b_retry >= 0 and (retry_after < 0 or retry_after > b_retry)) then
        bound, b_limit, b_remaining, b_reset, b_retry = j, limit, remaining, reset_after, retry_after
      end
      allowed = 0
    elseif allowed == 1 then
      if bound == 0 or remaining < b_remaining then
        bound, b_limit, b_remaining, b_reset = j, limit, remaining, reset_after
      end
      if cost > 0 then
        if last == cur then
          last_cost = last_cost + cost
        else
          if last > cur - buckets then
            -- The newest bucket is still counted: it moves to a field of its own.
            plan[np + 1], plan[np + 2], np = string.format('%s:%d', prefix, last), string.format('%d', last_cost), np + 2
          end
          last_cost = cost
        end
        plan[np + 1], plan[np + 2], np = prefix, string.format('%d %d %d', total, cur, last_cost), np + 2
        expire_at = math.max(expire_at, (cur + buckets) * precision)
      end
    end
  end

  if allowed == 0 or cost == 0 then
    plan = nil
  else
    if wipe then
      plan.wipe = true
    elseif stale and #stale > 0 then
      plan.stale = stale
    end
    -- The key lives until its newest bucket leaves the longest window; that
    -- instant only moves when some window's current bucket does.
    if moved then
      local ttl = expire_at - shifted
      if pinned then
        ttl = ttl + 86400000
      end
      plan.expire = string.format('%d', ttl)
    end
  end
  return allowed, b_limit, b_remaining, b_reset, b_retry, bound, plan
end

-- Records an admitted request: one HSET for every window's state (and a
-- bucket that left it), one HDEL for the buckets that left, and a PEXPIRE
-- when the expiry moves. Only admissions reach here, so denied traffic can
-- never prolong a key.
local function windowed_commit(key, plan)
  if plan.wipe then
    redis.call('DEL', key)
  end
  redis.call('HSET', key, unpack(plan))
  if plan.stale then
    redis.call('HDEL', key, unpack(plan.stale))
  end
  if plan.expire then
    redis.call('PEXPIRE', key, plan.expire)
  end
end
