-- The entry point: decides every rule that matches one request, all or
-- nothing, in one call. common.lua, gcra.lua, windowed.lua and penalty.lua
-- are joined in front of this file at build time (see build.rs).
--
-- Which entry answers a call (src/decision/transport/protocol/script.rs's
-- Entry says the same); the two one-rule paths carry no operation name (`named`,
-- at the end of common.lua, lists the names), the cheapest encoding
-- measured:
--   #ARGV <= 3, no operation named   one GCRA rule on Redis's clock (gcra.lua)
--   #ARGV > 3, no operation named    one windowed rule on Redis's clock
--                                    (windowed.lua)
--   either, with KEYS[2]             its rule takes overrides: KEYS[2] is
--                                    the client's override key; when it
--                                    holds one, ARGV is rewritten as the
--                                    general decision's (common.lua)
--   ARGV[1] == 'reset'               forget every key in KEYS (below)
--   ARGV[1] == 'refund'              give back refundable charges (below)
--   ARGV[1] == 'decide'              the general decision (below)
--   ARGV[1] == 'group'               several requests of one client under
--                                    the same rules, each decided by the
--                                    general decision after the one before,
--                                    at the same instant (below)
--
-- The general decision:
-- KEYS[i]   state of rule i (all under one hash tag when run on a cluster);
--           after the rules' keys, one penalty key per rule with a penalty
-- ARGV[1]   'decide' ('group' for a group)
-- ARGV[2]   now in milliseconds, or '' to keep Redis's own time (key
--           expiries, TIME), so that edge locations with skewed clocks agree
-- ARGV[3]   one letter per rule: 'e' enforces, 's' is a shadow rule whose
--           denial is reported but blocks nothing (and it is then not
--           charged); 'r' and 'q' are the same with a refund mark in the
--           reply (rules that count only some responses: the caller gives
--           the charge back after a response they do not count)
--           after them, one override key per rule that takes overrides,
--           then the penalty keys
-- ARGV[4..] per rule, in KEYS order:
--             'gcra',   cost, interval (us), burst
--             'window', cost, offset (ms), n, then n x (duration, limit, precision) (ms)
--           then, for a group: 'costs', m, and m x (one cost per rule, in
--           KEYS order): each further request's, in the order they are
--           decided after the first (whose costs are the rules' own);
--           then, if any rule asks for a lease: 'lease', m, and m x (its
--           1-based index, the most units it wants, its longest length
--           (ms)); then, if any rule takes overrides:
--           'override', m, and m x (its 1-based index, the rule-wide
--           override's text ('' for none), its ms left (-1: no end));
--           then, if any rule has a penalty:
--           'penalty', and per such rule its 1-based index and the
--           penalty (ms), in penalty keys' order
--
-- Reply: six integers per rule, in KEYS order: allowed (1/0), limit,
-- remaining, reset_after, retry_after (milliseconds; -1: never, the cost
-- exceeds the limit) and the 1-based binding window. With penalties, one
-- more integer: the sum of 2^(i-1) over the rules i whose penalty this call
-- started. Then one refund mark per 'r' or 'q' rule, in KEYS order (0: it
-- was not charged): for GCRA the TAT the charge left (us, on the call's
-- clock); for windows the charge's time on the key's shifted clock (ms).
-- Then, per lease asked for, in order: the units granted (0: none) and
-- how long they may be spent (ms from now); a rule that granted one
-- reports what it has left after the grant. Then, per override read: whose
-- held (0: none, 1: the client's, 2: the rule's), 1 if the client's key
-- held something that is no override, and the text in force ('' for none).
-- An override (src/rules/overrides.rs writes them) is 'v1 block',
-- 'v1 gcra <rate> <period ms> <burst> <interval us>' or 'v1 windows' and
-- '<duration ms>:<limit>' per window; a block denies like a running
-- penalty, for the override key's time left (no Retry-After when it has
-- no end).
-- A group replies with each request's six integers per rule, penalties
-- mask and refund marks, one request after another, then the leases
-- (asked with the last request) and the overrides read, once.
--
-- A lease is charged with the request, only when it is admitted, and
-- takes at most half of what the rule has left after it. GCRA accounts
-- its units (and the request's) as arriving when it ends, and grants it
-- only if that conforms now, so any spend before then conforms whatever
-- other callers do. A window's lease ends with the earliest bucket its
-- units were counted in (or its length, if sooner), so every window
-- counts them where they are spent.
--
-- The refund call: ARGV[2] the clock as for a decision, then per rule the
-- same arguments as a decision's, then its refund mark. Replies with one
-- integer per rule: 1 if something was given back.
-- The request is allowed when every enforced rule admits it; then every rule
-- that admits it is charged. Otherwise none is, and the rules that would
-- have admitted it are reported as they stand. Either way, a rule with a
-- penalty that denied it on its own (a shadow rule too) starts its
-- penalty. A rule whose penalty runs denies, its retry-after being what
-- is left of the penalty.

if ARGV[1] == 'reset' then
  return redis.call('DEL', unpack(KEYS))
end

if ARGV[1] == 'refund' then
  local pinned_ms, given, at = ARGV[2], {}, 3
  local now_us, now_ms
  if pinned_ms ~= '' then
    now_us, now_ms = pinned_ms * 1000, pinned_ms + 0
  end
  for i = 1, #KEYS do
    local cost = ARGV[at + 1] + 0
    if ARGV[at] == 'gcra' then
      given[i] = gcra_refund(KEYS[i], now_us, ARGV[at + 2] + 0, cost, ARGV[at + 4] + 0)
      at = at + 5
    else
      local n = ARGV[at + 3] + 0
      local mark = ARGV[at + 4 + 3 * n] + 0
      given[i] = windowed_refund(KEYS[i], now_ms, cost, ARGV[at + 2] + 0, at + 4, n, mark)
      at = at + 5 + 3 * n
    end
  end
  return given
end

-- nil on Redis's clock: GCRA then needs no clock (its state is the key's
-- expiry), and a windowed rule reads its key's (or TIME for a fresh key).
local pinned_ms, modes = ARGV[2], ARGV[3]
local now_us, now_ms
if pinned_ms ~= '' then
  now_us = pinned_ms * 1000
  now_ms = pinned_ms + 0
end

local rules = #modes
-- The mode letters as string.byte gives them: 'e', 'r', 'q'.
local ENFORCE, REFUNDABLE, REFUNDABLE_SHADOW = 101, 114, 113
local reply, writes, first, aheads = { 0, 0, 0, 0, 0, 0 }, { nil }, { nil }, {}

-- Where each rule's arguments start, and the sections after them.
local at = 4
for i = 1, rules do
  first[i] = at
  if ARGV[at] == 'window' then
    at = at + 4 + 3 * ARGV[at + 3]
  else
    at = at + 4
  end
end
-- A group's further requests, and where their costs start.
local further, costs_at = 0, 0
if ARGV[at] == 'costs' then
  further, costs_at = ARGV[at + 1] + 0, at + 2
  at = at + 2 + further * rules
end
local leases = nil
if ARGV[at] == 'lease' then
  leases = {}
  for j = 1, ARGV[at + 1] do
    local b = at + 3 * j - 1
    leases[j] = { rule = ARGV[b] + 0, units = ARGV[b + 1] + 0, ms = ARGV[b + 2] + 0 }
  end
  at = at + 2 + 3 * ARGV[at + 1]
end
local overrides, shown = nil, 0
if ARGV[at] == 'override' then
  overrides = {}
  shown = ARGV[at + 1] + 0
  for j = 1, shown do
    local b = at + 3 * j - 1
    overrides[j] = { rule = ARGV[b] + 0, wide = ARGV[b + 1], wide_ms = ARGV[b + 2] + 0, key = KEYS[rules + j] }
  end
  at = at + 2 + 3 * shown
end
local penalties = nil
if ARGV[at] == 'penalty' then
  penalties = {}
  for j = at + 1, #ARGV, 2 do
    penalties[ARGV[j] + 0] = { key = KEYS[rules + shown + (j - at + 1) / 2], ms = ARGV[j + 1] + 0 }
  end
end

-- Overrides: the figures in force replace the rule's own in ARGV, so that
-- everything after reads them as if configured; a block denies the rule
-- like a running penalty. A client's override goes before its rule's; text
-- that is not an override of this release for this rule is none.
local blocked, override_reply = {}, {}
if overrides then
  -- Whether `text` is an override of rule i; if so, applied. Only the
  -- forms this release writes are read, a bounded number of fields each,
  -- so that no stored value, of any length, can fail the call. The
  -- figures stay text, as ARGV holds them: windowed.lua joins them into names.
  local function apply(i, text, left_ms)
    local at = first[i]
    if text == 'v1 block' then
      blocked[i] = left_ms
      return true
    end
    if ARGV[at] == 'gcra' then
      local rate, period_ms, burst, interval_us =
        string.match(text, '^v1 gcra ([1-9]%d*) ([1-9]%d*) ([1-9]%d*) ([1-9]%d*)$')
      if not rate then
        return false
      end
      -- Checked as the configuration checks them (src/rules/policy.rs).
      rate, period_ms = rate + 0, period_ms + 0
      local exact = interval_us + 0 == math.floor((period_ms * 1000 + math.floor(rate / 2)) / rate)
      if exact and rate <= period_ms * 1000 and period_ms <= 31622400000 and burst + 0 <= 1000000000
        and interval_us * burst <= 2251799813685248 then
        ARGV[at + 2], ARGV[at + 3] = interval_us, burst
        return true
      end
      return false
    end
    -- 'v1 windows' and '<duration ms>:<limit>' per window, in the rule's
    -- order: written from the rule's own durations, the text must come out
    -- the same, so an override naming windows the rule no longer has is
    -- none. No more fields are read than the rule has windows.
    local n, limits, written = ARGV[at + 3] + 0, {}, 'v1 windows'
    for limit in string.gmatch(text, ':([1-9]%d*)') do
      if #limits == n or limit + 0 > 1000000000 then
        return false
      end
      limits[#limits + 1] = limit
      written = written .. ' ' .. ARGV[at + 1 + 3 * #limits] .. ':' .. limit
    end
    if #limits ~= n or text ~= written then
      return false
    end
    for w = 1, n do
      ARGV[at + 3 + 3 * w - 1] = limits[w]
    end
    return true
  end
  for j, o in ipairs(overrides) do
    -- A key of another type (a stray write) errs on GET: none, noted.
    local got, source, ignored = redis.pcall('GET', o.key), 0, 0
    local text = type(got) == 'string' and got or nil
    if type(got) == 'table' then
      ignored = 1
    end
    if text then
      local left = redis.call('PTTL', o.key)
      if apply(o.rule, text, left) then
        source = 1
      else
        ignored = 1
      end
    end
    if source == 0 and o.wide ~= '' and apply(o.rule, o.wide, o.wide_ms) then
      source, text = 2, o.wide
    end
    if source == 0 then
      text = ''
    end
    override_reply[3 * j - 2], override_reply[3 * j - 1], override_reply[3 * j] = source, ignored, text
  end
end

-- Decides every rule into reply[base + 6i - 5 .. base + 6i] and
-- writes[i]: at its own cost or, when peeking, at cost 0 and only for the
-- rules that admitted the request. Returns whether an enforced rule
-- denies it.
local function decide(peek, base)
  local denied = false
  for i = 1, rules do
    local k, at, mode = base + 6 * i, first[i], string.byte(modes, i)
    if not peek or reply[k - 5] == 1 then
      -- A running penalty denies whatever the rate says: the rule is then
      -- reported as it stands (at cost 0), with the penalty's time left.
      local penalty, left = penalties and penalties[i], 0
      if penalty then
        left = penalty_left(penalty.key, now_ms)
        penalty.running = left > 0
      end
      -- A block is a penalty set by hand: -1 for one without end.
      local block = blocked[i]
      if block then
        left = math.max(left, block)
        if block < 0 then
          left = -1
        end
      end
      local cost = 0
      if not peek and left == 0 then
        cost = ARGV[at + 1] + 0
      end
      if ARGV[at] == 'gcra' then
        local interval_us, burst = ARGV[at + 2] + 0, ARGV[at + 3] + 0
        aheads[i] = gcra_ahead(KEYS[i], now_us, interval_us)
        reply[k - 5], reply[k - 4], reply[k - 3], reply[k - 2], reply[k - 1], reply[k], writes[i] =
          gcra_check(aheads[i], cost, interval_us, burst)
      else
        local offset_ms, windows = ARGV[at + 2] + 0, ARGV[at + 3] + 0
        reply[k - 5], reply[k - 4], reply[k - 3], reply[k - 2], reply[k - 1], reply[k], writes[i] =
          windowed_check(KEYS[i], now_ms, cost, offset_ms, at + 4, windows)
      end
      if left > 0 then
        reply[k - 5], reply[k - 1], writes[i] = 0, left, nil
        reply[k - 2] = math.max(reply[k - 2], left)
      elseif left < 0 then
        reply[k - 5], reply[k - 3], reply[k - 1], writes[i] = 0, 0, -1, nil
      end
      if reply[k - 5] == 0 and (mode == ENFORCE or mode == REFUNDABLE) then
        denied = true
      end
    end
  end
  return denied
end

-- The lease granted to one lease asked for, charged with the request
-- whose fields start after reply[base] into writes[i]: units and how long
-- they may be spent (ms). Built only for calls that ask for one.
local grant
if leases then
  function grant(lease, base)
    local i = lease.rule
    local k, at = base + 6 * i, first[i]
    if reply[k - 5] ~= 1 then
      return 0, 0
    end
    local cost = ARGV[at + 1] + 0
    if ARGV[at] == 'gcra' then
      local interval_us, burst = ARGV[at + 2] + 0, ARGV[at + 3] + 0
      local from_us = math.max(aheads[i], lease.ms * 1000)
      local left = math.floor((interval_us * burst - from_us - cost * interval_us) / interval_us)
      local units = math.min(lease.units, math.floor(left / 2))
      if units <= 0 then
        return 0, 0
      end
      local write = from_us + (cost + units) * interval_us
      writes[i] = write
      reply[k - 3], reply[k - 2] = math.floor((interval_us * burst - write) / interval_us), math.ceil(write / 1000)
      return units, lease.ms
    end
    local units = math.min(lease.units, math.floor(reply[k - 3] / 2))
    if units <= 0 then
      return 0, 0
    end
    local allowed, limit, remaining, reset_after, _, bound, plan =
      windowed_check(KEYS[i], now_ms, cost + units, ARGV[at + 2] + 0, at + 4, ARGV[at + 3] + 0)
    if allowed ~= 1 or not plan then
      return 0, 0
    end
    writes[i] = plan
    reply[k - 4], reply[k - 3], reply[k - 2], reply[k] = limit, remaining, reset_after, bound
    return units, math.min(plan.edge - plan.now, lease.ms)
  end
end

-- Each request in turn, its fields from reply[base + 1] on: one, or a
-- group's, each decided as if it came after the one before at the same
-- instant, so that each sees what those before it charged.
local granted, clock_us, base = {}, now_us, 0
for request = 0, further do
  if request > 0 then
    -- This request's costs go where every step reads the rule's cost.
    for i = 1, rules do
      ARGV[first[i] + 1] = ARGV[costs_at + (request - 1) * rules + i - 1]
    end
    base = #reply
  end
  local denied = decide(false, base)
  if denied then
    -- Nothing is consumed anywhere: report the admitting rules as they stand.
    decide(true, base)
  else
    -- A group asks for its leases with its last request.
    if request == further then
      for j, lease in ipairs(leases or {}) do
        granted[2 * j - 1], granted[2 * j] = grant(lease, base)
      end
    end
    for i = 1, rules do
      local write = writes[i]
      if type(write) == 'number' then
        gcra_commit(KEYS[i], now_us, write)
      elseif write then
        windowed_commit(KEYS[i], write)
      end
    end
  end
  if penalties then
    -- Every rule that denied on its own starts its penalty, a shadow rule's
    -- too: it then reports the denials enforcing it would have made. A call
    -- at cost 0 (a lease refresh, a look) denies no request, and starts none.
    local started = 0
    for i, penalty in pairs(penalties) do
      local k = base + 6 * i
      if reply[k - 5] == 0 and not penalty.running and not blocked[i] and ARGV[first[i] + 1] ~= '0' then
        penalty_start(penalty.key, now_ms, penalty.ms)
        started = started + 2 ^ (i - 1)
        reply[k - 1] = math.max(reply[k - 1], penalty.ms)
        reply[k - 2] = math.max(reply[k - 2], penalty.ms)
      end
    end
    reply[#reply + 1] = started
  end
  -- Refund marks, when the request was charged.
  for i = 1, rules do
    local mode = string.byte(modes, i)
    if mode == REFUNDABLE or mode == REFUNDABLE_SHADOW then
      local write, mark = writes[i], 0
      if not denied and type(write) == 'number' then
        if not clock_us then
          local time = redis.call('TIME')
          clock_us = time[1] * 1000000 + time[2]
        end
        mark = clock_us + write
      elseif not denied and write then
        mark = write.now
      end
      reply[#reply + 1] = mark
    end
  end
end
for j = 1, 2 * #(leases or {}) do
  reply[#reply + 1] = granted[j] or 0
end
for j = 1, #override_reply do
  reply[#reply + 1] = override_reply[j]
end
return reply
