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

local windowed = {}

-- Decides one rule without writing anything.
--   key      the hash (may be absent)
--   now      current time, milliseconds
--   cost     units this request asks for (0 = peek)
--   offset   bucket edge shift, milliseconds
--   windows  array of { duration, limit, precision }
-- Returns a result table (see limiter.lua); `write` holds what commit needs.
function windowed.check(key, now, cost, offset, windows)
  local shifted = now + offset
  local fields = {}
  for i, w in ipairs(windows) do
    local prefix = w[1] .. ':' .. w[3] .. ':'
    local cur = math.floor(shifted / w[3])
    w.prefix, w.cur, w.buckets = prefix, cur, w[1] / w[3]
    fields[3 * i - 2] = prefix .. 't'
    fields[3 * i - 1] = prefix .. 'l'
    fields[3 * i] = prefix .. cur
  end
  local stored = redis.call('HMGET', key, unpack(fields))

  local result = { allowed = 1, retry_after = 0, window = 1 }
  local best_remaining
  for i, w in ipairs(windows) do
    local total = tonumber(stored[3 * i - 2]) or 0
    -- A window added to a live key has no newest id yet: count it from now.
    local last = tonumber(stored[3 * i - 1]) or w.cur
    local first = w.cur - w.buckets + 1
    w.in_bucket = tonumber(stored[3 * i]) or 0
    w.stale = {}
    if last - w.buckets + 1 < first then
      -- Buckets that have slid out of the window since the last admission.
      local from = last - w.buckets + 1
      local to = math.min(first - 1, last)
      for id = from, to do
        w.stale[#w.stale + 1] = w.prefix .. id
      end
      local counts = redis.call('HMGET', key, unpack(w.stale))
      for _, c in ipairs(counts) do
        total = total - (tonumber(c) or 0)
      end
    end
    w.total = total

    local limit = w[2]
    local reset_after = 0
    local retry_after = 0
    local allowed = total + cost <= limit
    if allowed then
      if cost > 0 then
        w.total = total + cost
        last = w.cur
      end
    elseif cost > limit then
      retry_after = -1
    else
      -- Walk the counted buckets oldest first until enough cost has left.
      local need = total + cost - limit
      local ids = {}
      for id = math.max(first, last - w.buckets + 1), last do
        ids[#ids + 1] = w.prefix .. id
      end
      local counts = redis.call('HMGET', key, unpack(ids))
      local freed = 0
      local id = math.max(first, last - w.buckets + 1)
      for _, c in ipairs(counts) do
        freed = freed + (tonumber(c) or 0)
        if freed >= need then
          break
        end
        id = id + 1
      end
      retry_after = (id + w.buckets) * w[3] - shifted
    end
    if w.total > 0 then
      reset_after = (last + w.buckets) * w[3] - shifted
    end
    w.reset_after = reset_after

    local remaining = limit - w.total
    if not allowed then
      if result.allowed == 1 or later(retry_after, result.retry_after) then
        result.window, result.retry_after = i, retry_after
      end
      result.allowed = 0
    elseif result.allowed == 1 and (best_remaining == nil or remaining < best_remaining) then
      best_remaining = remaining
      result.window = i
    end
  end

  local bound = windows[result.window]
  result.limit = bound[2]
  result.remaining = bound[2] - bound.total
  result.reset_after = bound.reset_after
  if result.allowed == 1 and cost > 0 then
    result.write = { windows = windows, cost = cost, shifted = shifted }
  end
  return result
end

-- Records an admitted request: one HSET for every window's bucket, total and
-- newest id, one HDEL for the buckets that left, one PEXPIRE. The key lives
-- until its newest bucket has left the longest window, and only admissions
-- move that, so denied traffic can never prolong it.
function windowed.commit(key, result)
  local windows, cost, shifted = result.write.windows, result.write.cost, result.write.shifted
  local set, stale = {}, {}
  local expire_at = 0
  for _, w in ipairs(windows) do
    set[#set + 1] = w.prefix .. 't'
    set[#set + 1] = w.total
    set[#set + 1] = w.prefix .. 'l'
    set[#set + 1] = w.cur
    set[#set + 1] = w.prefix .. w.cur
    set[#set + 1] = w.in_bucket + cost
    for _, f in ipairs(w.stale) do
      stale[#stale + 1] = f
    end
    expire_at = math.max(expire_at, (w.cur + w.buckets) * w[3])
  end
  redis.call('HSET', key, unpack(set))
  if #stale > 0 then
    redis.call('HDEL', key, unpack(stale))
  end
  redis.call('PEXPIRE', key, expire_at - shifted)
end
