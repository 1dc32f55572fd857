-- The entry point: decides every rule that matches one request, all or
-- nothing, in one call. common.lua, gcra.lua, windowed.lua and penalty.lua
-- are joined in front of this file at build time (see build.rs).
--
-- Which entry answers a call (src/decision/protocol.rs's Entry says the
-- same); the two one-rule paths carry no operation name, the cheapest
-- encoding measured:
--   #ARGV <= 3, ARGV[1] ~= 'reset'   one GCRA rule on Redis's clock (gcra.lua)
--   #ARGV > 3, ARGV[1] not 'decide'  one windowed rule on Redis's clock
--            'reset' nor 'refund'     (windowed.lua)
--   ARGV[1] == 'reset'               forget every key in KEYS (below)
--   ARGV[1] == 'refund'              give back refundable charges (below)
--   ARGV[1] == 'decide'              the general decision (below)
--
-- The general decision:
-- KEYS[i]   state of rule i (all under one hash tag when run on a cluster);
--           after the rules' keys, one penalty key per rule with a penalty
-- ARGV[1]   'decide'
-- ARGV[2]   now in milliseconds, or '' to keep Redis's own time (key
--           expiries, TIME), so that edge locations with skewed clocks agree
-- ARGV[3]   one letter per rule: 'e' enforces, 's' is a shadow rule whose
--           denial is reported but blocks nothing (and it is then not
--           charged); 'r' and 'q' are the same with a refund mark in the
--           reply (rules that count only some responses: the caller gives
--           the charge back after a response they do not count)
-- ARGV[4..] per rule, in KEYS order:
--             'gcra',   cost, interval (us), burst
--             'window', cost, offset (ms), n, then n x (duration, limit, precision) (ms)
--           then, if any rule asks for a lease: 'lease', m, and m x (its
--           1-based index, the most units it wants, its length (ms; GCRA
--           only, 0 for windows)); then, if any rule has a penalty:
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
-- how long they may be spent (ms from now).
--
-- A lease is charged with the request, only when it is admitted, and
-- takes at most half of what the rule has left after it. GCRA accounts
-- its units (and the request's) as arriving when it ends, and grants it
-- only if that conforms now, so any spend before then conforms whatever
-- other callers do. A window's lease ends with the earliest bucket its
-- units were counted in, so every window counts them where they are spent.
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

-- Where each rule's arguments start, and the penalties after them.
local at = 4
for i = 1, rules do
  first[i] = at
  if ARGV[at] == 'window' then
    at = at + 4 + 3 * ARGV[at + 3]
  else
    at = at + 4
  end
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
local penalties = nil
if ARGV[at] == 'penalty' then
  penalties = {}
  for j = at + 1, #ARGV, 2 do
    penalties[ARGV[j] + 0] = { key = KEYS[rules + (j - at + 1) / 2], ms = ARGV[j + 1] + 0 }
  end
end

-- Decides every rule into reply[6i - 5 .. 6i] and writes[i]: at its own
-- cost or, when peeking, at cost 0 and only for the rules that admitted the
-- request. Returns whether an enforced rule denies it.
local function decide(peek)
  local denied = false
  for i = 1, rules do
    local k, at, mode = 6 * i, first[i], string.byte(modes, i)
    if not peek or reply[k - 5] == 1 then
      -- A running penalty denies whatever the rate says: the rule is then
      -- reported as it stands (at cost 0), with the penalty's time left.
      local penalty, left = penalties and penalties[i], 0
      if penalty then
        left = penalty_left(penalty.key, now_ms)
        penalty.running = left > 0
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
      end
      if reply[k - 5] == 0 and (mode == ENFORCE or mode == REFUNDABLE) then
        denied = true
      end
    end
  end
  return denied
end

-- The lease granted to one lease asked for, charged with the request
-- into writes[i]: units and how long they may be spent (ms). Built only
-- for calls that ask for one.
local grant
if leases then
  function grant(lease)
    local i = lease.rule
    local k, at = 6 * i, first[i]
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
      writes[i] = from_us + (cost + units) * interval_us
      return units, lease.ms
    end
    local units = math.min(lease.units, math.floor(reply[k - 3] / 2))
    if units <= 0 then
      return 0, 0
    end
    local allowed, _, _, _, _, _, plan =
      windowed_check(KEYS[i], now_ms, cost + units, ARGV[at + 2] + 0, at + 4, ARGV[at + 3] + 0)
    if allowed ~= 1 or not plan then
      return 0, 0
    end
    writes[i] = plan
    return units, plan.edge - plan.now
  end
end

local denied = decide(false)
local granted = {}
if denied then
  -- Nothing is consumed anywhere: report the admitting rules as they stand.
  decide(true)
else
  for j, lease in ipairs(leases or {}) do
    granted[2 * j - 1], granted[2 * j] = grant(lease)
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
  -- too: it then reports the denials enforcing it would have made.
  local started = 0
  for i, penalty in pairs(penalties) do
    local k = 6 * i
    if reply[k - 5] == 0 and not penalty.running then
      penalty_start(penalty.key, now_ms, penalty.ms)
      started = started + 2 ^ (i - 1)
      reply[k - 1] = math.max(reply[k - 1], penalty.ms)
      reply[k - 2] = math.max(reply[k - 2], penalty.ms)
    end
  end
  reply[#reply + 1] = started
end
-- Refund marks, when the request was charged.
local clock_us = now_us
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
for j = 1, 2 * #(leases or {}) do
  reply[#reply + 1] = granted[j] or 0
end
return reply
