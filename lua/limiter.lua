-- The entry point: decides every rule that matches one request, all or
-- nothing, in one call. common.lua, gcra.lua and windowed.lua are joined in
-- front of this file at build time (see build.rs), behind the `#!lua` shebang.
--
-- KEYS[i]   state of rule i (all under one hash tag when run on a cluster)
-- ARGV[1]   operation: 'decide', or 'reset' to forget every key given
-- ARGV[2]   now in milliseconds, or '' to read Redis's own clock (TIME), so
--           that edge locations with skewed clocks still agree
-- ARGV[3]   one letter per rule: 'e' enforces, 's' is a shadow rule whose
--           denial is reported but blocks nothing (and it is then not charged)
-- ARGV[4..] per rule, in KEYS order:
--             'gcra',   cost, interval (us), burst
--             'window', cost, offset (ms), n, then n x (duration, limit, precision) (ms)
--
-- Reply, all integers, times in milliseconds (-1: never, the cost exceeds the
-- limit):
--   { allowed (1/0), retry_after, binding rule (1-based),
--     then per rule: allowed, limit, remaining, reset_after, retry_after, window }
-- The request is allowed when every enforced rule admits it; then every rule
-- that admits it is charged, and otherwise none is. The binding rule and
-- window are, when denied, the first enforced ones that free up last; when
-- admitted, the first with the fewest units left.

if ARGV[1] == 'reset' then
  return redis.call('DEL', unpack(KEYS))
end

local now_us
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now_us = tonumber(ARGV[2]) * 1000
end
local now_ms = floor(now_us / 1000)

-- Decides rule i from its arguments at ARGV[at], at its own cost or at
-- `cost` when given. Returns the rule's six reply fields, what to write if
-- the request is admitted, and where the next rule's arguments start.
local function check(i, at, cost)
  local kind = ARGV[at]
  cost = cost or tonumber(ARGV[at + 1])
  if kind == 'gcra' then
    local a, l, r, re, rt, w, write = gcra_check(KEYS[i], now_us, cost, tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]))
    return a, l, r, re, rt, w, write, at + 4
  elseif kind == 'window' then
    local n = tonumber(ARGV[at + 3])
    local a, l, r, re, rt, w, plan = windowed_check(KEYS[i], now_ms, cost, tonumber(ARGV[at + 2]), at + 4, n)
    return a, l, r, re, rt, w, plan, at + 4 + 3 * n
  end
  error('edge-limiter: unknown algorithm ' .. tostring(kind))
end

-- Rule i's fields are reply[6i-2] (allowed) to reply[6i+3] (window).
local reply = { 1, 0, 1, 0, 0, 0, 0, 0, 0 }
local starts, writes = {}, {}
local allowed, binding = 1, 1
local modes = ARGV[3]
local at = 4
for i = 1, #KEYS do
  starts[i] = at
  local k = 6 * i
  local ok, write
  ok, reply[k - 1], reply[k], reply[k + 1], reply[k + 2], reply[k + 3], write, at = check(i, at)
  reply[k - 2], writes[i] = ok, write
  if ok == 0 and string.sub(modes, i, i) ~= 's' then
    if allowed == 1 or later(reply[k + 2], reply[6 * binding + 2]) then
      binding = i
    end
    allowed = 0
  elseif allowed == 1 and reply[k] < reply[6 * binding] then
    binding = i
  end
end

if allowed == 1 then
  for i = 1, #KEYS do
    local write = writes[i]
    if write then
      if ARGV[starts[i]] == 'gcra' then
        gcra_commit(KEYS[i], now_us, write)
      else
        windowed_commit(KEYS[i], write)
      end
    end
  end
  reply[2] = 0
else
  -- Nothing is consumed anywhere: report the admitting rules as they stand.
  for i = 1, #KEYS do
    local k = 6 * i
    if reply[k - 2] == 1 then
      reply[k - 2], reply[k - 1], reply[k], reply[k + 1], reply[k + 2], reply[k + 3] = check(i, starts[i], 0)
    end
  end
  reply[2] = reply[6 * binding + 2]
end
reply[1], reply[3] = allowed, binding
return reply
