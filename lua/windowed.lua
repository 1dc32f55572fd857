-- Windowed limiter: several sliding windows over one hash per key.
--
-- Each window [duration, limit, precision] (milliseconds, precision divides
-- duration) splits time into buckets of `precision` and counts the cost
-- admitted in each. A request is admitted when, in every window, the cost in
-- the buckets that still overlap the window plus this request's cost fits the
-- limit. precision == duration is a plain fixed window.
--
-- Times here are on the key's shifted clock: Redis's milliseconds plus
-- `offset`, chosen per key by the caller, which shifts every bucket edge so
-- that clients' windows do not all roll over at the same instant.
--
-- The hash holds, as decimal text, with P = "<duration>:<precision>" for
-- a window and S = "<duration>/<limit>/<precision>" for every window in
-- order, joined by '/' (no field name with ':' can take that form):
--   e        when the key expires (shifted): its newest bucket then leaves
--            the longest window. On Redis's clock, now = e - PTTL, so a key
--            that exists tells the time without TIME.
--   t        when an admission last moved a window's newest bucket: every
--            window's newest bucket is the one t lies in.
--   S        e minus the first bucket edge after t in any window: while
--            PTTL > it, no bucket has moved since t, which is all a request
--            in the same buckets needs to know. Named after the windows and
--            limits it was written for, so that a call with others never
--            reads it; s names it, so that such a call's admission drops it.
--   a        the room at t: the fewest units any window had left.
--   u        the cost admitted since t, minus a. All of that cost lies in
--            every window's newest bucket, so a request in the same buckets
--            as the last admission changes this one field (HINCRBY),
--            whatever the number of windows: it fits while u stays <= 0,
--            and -u is then what is left.
--   b        the window with the fewest units left at t (the first such),
--            which binds while only u grows.
--   P        the window's total at t (the cost in its counted buckets).
--   P:n      the cost in its newest bucket at t.
--   P:<id>   the cost in an older bucket <id>.
-- So a window counts P + u + a, of which P:n + u + a in its newest bucket.
-- Bucket fields lie in [newest - buckets + 1, newest - 1], so trimming
-- never scans more than one window. Only admitted requests are counted, so
-- a flood of rejected calls can grow neither the hash nor its lifetime.

-- A rule of windows that governs a request alone, on Redis's clock, in the
-- same buckets as the last admission: the commonest windowed call, decided
-- before any function of this script is built.
--   KEYS  the rule's hash, then the client's override key when the rule
--         takes overrides (common.lua: with one stored, the general
--         decision decides the call instead)
--   ARGV  'window', cost, offset (ms), n, then n x (duration, limit,
--         precision) (ms): the rule's arguments as a general decision has
--         them
-- Replies like the general path below: for a lone window admitted at a
-- cost, one integer (remaining x precision + how far into its bucket now
-- lies); otherwise the six fields of the binding window. Anything else (a
-- fresh key, a bucket that moved, other windows or limits, a denial) falls
-- through to the end of this file. One window reads one field and adds the
-- cost as the text it came as: conversions and redis.calls are what a call
-- pays most for.
local one_window = op == 'window' and not overridden
if one_window then
  -- The windows' figures stay text: they are joined into field names.
  local key, cost, n = KEYS[1], argv[2], argv[4]
  local pttl = call('PTTL', key)
  if pttl > 0 and cost ~= '0' then
    -- A value that is no integer (not ours) makes HINCRBY fail: pcall.
    if n == '1' then
      local duration_ms, limit, precision_ms = argv[5], argv[6], argv[7]
      local v = tonumber(call('HGET', key, duration_ms .. '/' .. limit .. '/' .. precision_ms))
      local u = v and pttl > v and redis.pcall('HINCRBY', key, 'u', cost)
      if type(u) == 'number' then
        if u <= 0 then
          -- Its bucket ends `pttl - v` from now.
          local into = precision_ms - pttl + v
          local packed = -u * precision_ms + into
          if packed < 9007199254740992 then
            return packed
          end
          return { 1, limit + 0, -u, duration_ms - into, 0, 1 }
        end
        -- Undone, and decided again below, which knows how long to wait.
        call('HINCRBY', key, 'u', -cost)
      end
    else
      local state = call('HMGET', key, table.concat(argv, '/', 5, 4 + 3 * n), 'e', 'b')
      local v, e, b = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
      local u = v and e and b and pttl > v and redis.pcall('HINCRBY', key, 'u', cost)
      if type(u) == 'number' then
        if u <= 0 then
          -- now = e - PTTL; window b binds, its figures from ARGV[3b + 2].
          local duration_ms, limit, precision_ms = argv[3 * b + 2], argv[3 * b + 3], argv[3 * b + 4]
          local into = (e - pttl) % precision_ms
          return { 1, limit + 0, -u, duration_ms - into, 0, b }
        end
        call('HINCRBY', key, 'u', -cost)
      end
    end
  end
end

-- Decides one rule without writing anything, on the call's clock (now_ms,
-- common.lua: nil for Redis's).
--   rule    the rule's figures: offset_ms, its bucket edges' shift, and
--           windows, each window's duration, limit and precision (ms, as
--           text), one window after another
--   key     the hash (may be absent)
--   cost    units this request asks for (0 = peek)
-- Returns the six reply fields of the binding window: allowed (1/0), limit,
-- remaining, reset_after, retry_after (milliseconds; -1: never) and its
-- 1-based index; then what windowed_commit needs if the whole request is
-- admitted (nil: nothing to write).
local function windowed_check(rule, key, cost, owed)
  -- e, t and the previous release's c, each window's two fields, then u,
  -- a, s and the previous release's v (k is where they start).
  local windows, offset, pinned = rule.windows, rule.offset_ms, now_ms
  local n = #windows / 3
  local fields, k = { 'e', 't', 'c' }, 2 * n + 3
  for j = 1, n do
    local p = windows[3 * j - 2] .. ':' .. windows[3 * j]
    fields[2 * j + 2], fields[2 * j + 3] = p, p .. ':n'
  end
  fields[k + 1], fields[k + 2], fields[k + 3], fields[k + 4] = 'u', 'a', 's', 'v'
  local spec = table.concat(windows, '/')
  local pttl = -2
  if not pinned then
    pttl = redis.call('PTTL', key)
  end
  local stored = redis.call('HMGET', key, unpack(fields))
  local e, t, a = tonumber(stored[1]), tonumber(stored[2]), tonumber(stored[k + 2])
  local since
  if a then
    since = tonumber(stored[k + 1] or '')
    since = since and since + a
  else
    -- The previous release counted c up from 0; its hash is rewritten
    -- whole at the next admission.
    since = tonumber(stored[3] or 0)
  end
  local now
  if pinned then
    now = pinned + offset
  elseif pttl > 0 and e then
    now = e - pttl
  else
    local time = redis.call('TIME')
    now = time[1] * 1000 + math.floor(time[2] / 1000) + offset
  end
  -- No state, or not ours (an older release's format, a stray write):
  -- counted as none, and replaced whole by the next admission.
  local valid = t and since
  for i = 4, k, 2 do
    if stored[i] and not tonumber(stored[i]) then
      valid = false
    end
  end
  local wipe = not valid and (pttl ~= -2 or stored[1] or stored[2] or stored[3] or stored[4])

  -- The binding window so far, and its fields.
  local allowed, bound, b_limit, b_remaining, b_reset, b_retry = 1, 0, 0, 0, 0, 0
  -- Each window's total and newest bucket after the request, and the
  -- fields of the buckets it moved or forgot.
  -- Written under other windows or by the previous release, the fields
  -- the lone-rule path reads are all written anew at this admission.
  local totals, newests, moves, stale, moved, expire_at = {}, {}, nil, nil, stored[k + 3] ~= spec, 0
  -- The first bucket edge after now, in any window.
  local edge = math.huge
  for j = 1, n do
    local limit, precision = windows[3 * j - 1] + 0, windows[3 * j] + 0
    local buckets = windows[3 * j - 2] / precision
    local cur = math.floor(now / precision)
    local prefix = fields[2 * j + 2]
    -- last: the newest bucket holding cost; older: the cost before it
    -- still counted; newest: its own cost.
    local last, older, newest = cur, 0, 0
    local base = valid and tonumber(stored[2 * j + 2])
    if base then
      local newest_at_t = tonumber(stored[2 * j + 3]) or 0
      last, older, newest = math.floor(t / precision), base - newest_at_t, newest_at_t + since
    else
      moved = true -- a window new to this key
    end
    if last < cur then
      -- The buckets up to cur - buckets have slid out of the window since
      -- the last admission: forget them. The newest becomes an older one.
      moved = true
      stale = stale or {}
      local from = #stale + 1
      for id = last - buckets + 1, math.min(cur - buckets, last - 1) do
        stale[#stale + 1] = string.format('%s:%d', prefix, id)
      end
      if last <= cur - buckets then
        older = 0 -- every bucket, the newest too
      else
        for _, c in ipairs(redis.call('HMGET', key, unpack(stale, from))) do
          older = older - (tonumber(c) or 0)
        end
        if newest > 0 then
          moves = moves or {}
          moves[#moves + 1], moves[#moves + 2] = string.format('%s:%d', prefix, last), newest
        end
        older = older + newest
      end
      newest = 0
    end

    local total = older + newest
    -- A debt is counted whatever the limit: the client is then denied
    -- until it has left the windows.
    local fits = owed or total + cost <= limit
    local retry_after, newest_id = 0, last
    if fits then
      if cost > 0 then
        total, newest, newest_id = total + cost, newest + cost, cur
      end
    elseif cost > limit then
      retry_after = -1
    else
      -- Walk the counted buckets oldest first until enough cost has left;
      -- the last one walked is the newest (its cost is what is left).
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
      retry_after = (id + buckets) * precision - now
    end
    local reset_after = 0
    if total > 0 then
      reset_after = (newest_id + buckets) * precision - now
    end
    local remaining = limit - total
    totals[j], newests[j] = total, newest
    expire_at = math.max(expire_at, (cur + buckets) * precision)
    edge = math.min(edge, (cur + 1) * precision)

    -- When denied, the first denying window that frees up last binds; when
    -- admitted, the first with the fewest units left.
    if not fits then
      if allowed == 1 or (b_retry >= 0 and (retry_after < 0 or retry_after > b_retry)) then
        bound, b_limit, b_remaining, b_reset, b_retry = j, limit, remaining, reset_after, retry_after
      end
      allowed = 0
    elseif allowed == 1 and (bound == 0 or remaining < b_remaining) then
      bound, b_limit, b_remaining, b_reset = j, limit, remaining, reset_after
    end
  end

  if allowed == 0 or cost == 0 then
    return allowed, b_limit, b_remaining, b_reset, b_retry, bound, nil
  end
  local plan = { cost = string.format('%d', cost), now = now, edge = edge }
  if moved or wipe then
    -- Every window's newest bucket is now the one `now` lies in: the
    -- totals and newest buckets are written whole, and u starts again.
    -- A new hash keeps this order, and Redis finds a field in a small hash
    -- by scanning from the front: first what the lone-rule path reads.
    local set = { spec, expire_at - edge, 'u', string.format('%d', -b_remaining), 'e', expire_at, 'b', bound }
    for j = 1, n do
      set[2 * j + 7], set[2 * j + 8] = fields[2 * j + 2], totals[j]
    end
    set[2 * n + 9], set[2 * n + 10], set[2 * n + 11], set[2 * n + 12] = 'a', b_remaining, 's', spec
    set[2 * n + 13], set[2 * n + 14] = 't', now
    for j = 1, n do
      set[2 * n + 13 + 2 * j], set[2 * n + 14 + 2 * j] = fields[2 * j + 3], newests[j]
    end
    for i = 1, #(moves or {}) do
      set[#set + 1] = moves[i]
    end
    plan.set, plan.wipe = set, wipe
    if not wipe then
      -- The lone-rule fields of other windows, and the previous release's.
      stale = stale or {}
      if stored[k + 3] and stored[k + 3] ~= spec then
        stale[#stale + 1] = stored[k + 3]
      end
      if stored[3] then
        stale[#stale + 1] = 'c'
      end
      if stored[k + 4] then
        stale[#stale + 1] = 'v'
      end
      plan.stale = stale
    end
    if pinned then
      plan.expire, plan.relative = expire_at - now + 86400000, true
    else
      plan.expire = expire_at - offset
    end
  end
  return allowed, b_limit, b_remaining, b_reset, b_retry, bound, plan
end

-- Records an admitted request: in the same buckets as the last admission,
-- only `u` grows; otherwise one HSET writes every window's fields, one HDEL
-- drops the buckets that left (and fields written for other windows or by
-- the previous release), and the expiry moves (an instant on Redis's clock;
-- a span with a pinned one). Only admissions reach here, so denied traffic
-- can never prolong a key.
local function windowed_commit(key, plan)
  if not plan.set then
    redis.call('HINCRBY', key, 'u', plan.cost)
    return
  end
  if plan.wipe then
    redis.call('DEL', key)
  end
  redis.call('HSET', key, unpack(plan.set))
  if plan.stale and #plan.stale > 0 then
    redis.call('HDEL', key, unpack(plan.stale))
  end
  if plan.relative then
    redis.call('PEXPIRE', key, plan.expire)
  else
    redis.call('PEXPIREAT', key, plan.expire)
  end
end

-- The windows' steps in the general path (limiter.lua, which lists the
-- algorithms' tables by their word), built only for the calls that reach
-- it. A rule is a table of its figures, its windows' as text; a write is
-- windowed_check's plan.
local windowed = nil
if general then
  -- Sized where it is made: each field then fills a slot, with no rehash.
  windowed = { decide = windowed_check, commit = windowed_commit, read = false, refund = false, mark = false,
    grant = false, apply = false, build = false }

  -- A rule of `cost`, its figures read after its word and cost: offset
  -- (ms), n, then n x (duration, limit, precision) (ms).
  function windowed.read(cost)
    local offset_ms, n = read(2)
    return { algorithm = windowed, cost = cost, offset_ms = offset_ms + 0, windows = { read(3 * n) } }
  end

  -- A debit, what a response reported past the charge made up front:
  -- counted now in every window, over the limit if it must be, as a
  -- charge of its units would be. Returns 1 if anything was counted.
  if op == 'debit' then
    function windowed.refund(rule, key)
      local plan = select(7, windowed_check(rule, key, rule.cost, true))
      if not plan then
        return 0
      end
      windowed_commit(key, plan)
      return 1
    end
  -- A refund needs only its own step; every other call, the decision's.
  elseif op == 'refund' then
    -- Gives back a refundable charge of rule.cost units, made at `mark_ms`
    -- on the key's shifted clock. Each window takes the cost out of the
    -- bucket it was counted in, while that bucket is still counted; a key
    -- that expired or holds no state of ours gives nothing back. Returns 1
    -- if anything was.
    function windowed.refund(rule, key, mark_ms)
      local pttl = -2
      if not now_ms then
        pttl = redis.call('PTTL', key)
        if pttl <= 0 then
          return 0
        end
      end
      local windows, cost = rule.windows, rule.cost
      local n = #windows / 3
      local fields = { 'e', 't', 'a', 'u' }
      for j = 1, n do
        local p = windows[3 * j - 2] .. ':' .. windows[3 * j]
        fields[2 * j + 3], fields[2 * j + 4] = p, p .. ':n'
      end
      local stored = redis.call('HMGET', key, unpack(fields))
      local e, t, a, u = tonumber(stored[1]), tonumber(stored[2]), tonumber(stored[3]), tonumber(stored[4])
      if not (e and t and a and u) then
        return 0
      end
      local now = e - pttl
      if now_ms then
        now = now_ms + rule.offset_ms
      end
      -- Which windows still count the charge's bucket.
      local counted, any = {}, false
      for j = 1, n do
        local precision = windows[3 * j] + 0
        local buckets = windows[3 * j - 2] / precision
        counted[j] = math.floor(mark_ms / precision) > math.floor(now / precision) - buckets
        any = any or counted[j]
      end
      if not any then
        return 0
      end
      -- Charged at or after the last move: in t's buckets in every window,
      -- each of which counts the cost since the move in its newest bucket.
      -- Taken from that cost as far as it holds (whether the charge was the
      -- move or came after it, the count is the same); an earlier refund
      -- may have taken from it for a charge counted at the move, and the
      -- rest then comes out of each window's newest bucket at t.
      local since_back = 0
      if t <= mark_ms then
        since_back = math.min(cost, math.max(u + a, 0))
        if since_back == cost then
          redis.call('HINCRBY', key, 'u', -cost)
          return 1
        end
      end
      cost = cost - since_back
      -- Out of each counting window's total at t and the charge's bucket,
      -- then the room at t and the cost since follow.
      local set, room, bound = {}, nil, 0
      for j = 1, n do
        local precision, limit = windows[3 * j] + 0, windows[3 * j - 1] + 0
        local total = tonumber(stored[2 * j + 3]) or 0
        if counted[j] then
          local id = math.floor(mark_ms / precision)
          local field = fields[2 * j + 4]
          if id < math.floor(t / precision) then
            field = string.format('%s:%d', fields[2 * j + 3], id)
          end
          local held = tonumber(redis.call('HGET', key, field) or '') or 0
          local back = math.min(cost, held)
          if back > 0 then
            total = total - back
            set[#set + 1], set[#set + 2] = fields[2 * j + 3], string.format('%d', total)
            set[#set + 1], set[#set + 2] = field, string.format('%d', held - back)
          end
        end
        if not room or limit - total < room then
          room, bound = limit - total, j
        end
      end
      if #set == 0 then
        if since_back == 0 then
          return 0
        end
        redis.call('HINCRBY', key, 'u', -since_back)
        return 1
      end
      set[#set + 1], set[#set + 2] = 'a', string.format('%d', room)
      set[#set + 1], set[#set + 2] = 'u', string.format('%d', u - since_back - (room - a))
      set[#set + 1], set[#set + 2] = 'b', bound
      redis.call('HSET', key, unpack(set))
      return 1
    end
  else
    -- The steps only some calls need, each built when limiter.lua asks
    -- for it (`build`): a charge's refund mark, a lease, an override.
    function windowed.build(step)
      if step == 'mark' then
        -- A charge's refund mark: its time on the key's shifted clock (ms).
        function windowed.mark(plan)
          return plan.now
        end
      elseif step == 'grant' then
        -- A lease of at most lease.units for the admitted request decided at
        -- `cost`, whose fields are `outcome`, of at most half of what is left:
        -- counted with the request, it ends with the earliest bucket its units
        -- were counted in (or lease.ms, if sooner), so every window counts them
        -- where they are spent. Returns the units, how long they may be spent
        -- (ms) and the write that charges them with the request.
        function windowed.grant(rule, key, outcome, cost, lease)
          local units = math.min(lease.units, math.floor(outcome.remaining / 2))
          if units <= 0 then
            return 0, 0, nil
          end
          local allowed, limit, remaining, reset_after, _, bound, plan =
            windowed_check(rule, key, cost + units)
          if allowed ~= 1 or not plan then
            return 0, 0, nil
          end
          outcome.limit, outcome.remaining, outcome.reset_after, outcome.window = limit, remaining, reset_after, bound
          return units, math.min(plan.edge - plan.now, lease.ms), plan
        end
      elseif step == 'apply' then
        -- Whether `text` is an override of the rule's windows ('v1 windows' and
        -- '<duration ms>:<limit>' per window, in the rule's order); if so, its
        -- limits replace the rule's. Written from the rule's own durations, the
        -- text must come out the same, so an override naming windows the rule
        -- no longer has is none. No more fields are read than the rule has
        -- windows, so that no stored value, of any length, can fail the call.
        function windowed.apply(rule, text)
          local windows, limits, written = rule.windows, {}, 'v1 windows'
          local n = #windows / 3
          for limit in string.gmatch(text, ':([1-9]%d*)') do
            if #limits == n or limit + 0 > 1000000000 then
              return false
            end
            limits[#limits + 1] = limit
            written = written .. ' ' .. windows[3 * #limits - 2] .. ':' .. limit
          end
          if #limits ~= n or text ~= written then
            return false
          end
          for w = 1, n do
            windows[3 * w - 1] = limits[w]
          end
          return true
        end
      end
    end
  end
end

-- A lone rule that the path at the top of this file did not decide.
if one_window then
  local key, cost, n = KEYS[1], argv[2] + 0, argv[4] + 0
  local rule = { offset_ms = argv[3] + 0, windows = { unpack(argv, 5, 4 + 3 * n) } }
  local windows = rule.windows
  local allowed, limit, remaining, reset_after_ms, retry_after_ms, binding, write =
    windowed_check(rule, key, cost)
  if write then
    windowed_commit(key, write)
    if n == 1 then
      -- remaining x precision + how far into its bucket now lies
      local packed = remaining * windows[3] + windows[1] - reset_after_ms
      if packed < 9007199254740992 then
        return packed
      end
    end
  end
  return { allowed, limit, remaining, reset_after_ms, retry_after_ms, binding }
end
