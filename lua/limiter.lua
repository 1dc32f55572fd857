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
local now_ms = math.floor(now_us / 1000)

-- Parses rule i's arguments starting at ARGV[at]; returns the checker, its
-- arguments after the key, and the next position.
local function parse(at)
  local kind, cost = ARGV[at], tonumber(ARGV[at + 1])
  if kind == 'gcra' then
    local interval, burst = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
    return function(key, c)
      return gcra.check(key, now_us, c, interval, burst)
    end, gcra.commit, cost, at + 4
  elseif kind == 'window' then
    local offset, n = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
    local windows = {}
    for j = 1, n do
      local base = at + 1 + 3 * j
      windows[j] = { tonumber(ARGV[base]), tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]) }
    end
    return function(key, c)
      return windowed.check(key, now_ms, c, offset, windows)
    end, windowed.commit, cost, at + 4 + 3 * n
  end
  return redis.error_reply('ERR edge-limiter: unknown algorithm ' .. tostring(kind))
end

local rules, results = {}, {}
local allowed, binding = 1, 1
local modes = ARGV[3]
local at = 4
for i = 1, #KEYS do
  local check, commit, cost, next_at = parse(at)
  if type(check) ~= 'function' then
    return check
  end
  at = next_at
  rules[i] = { check = check, commit = commit }
  local r = check(KEYS[i], cost)
  results[i] = r
  if r.allowed == 0 and string.sub(modes, i, i) ~= 's' then
    if allowed == 1 or later(r.retry_after, results[binding].retry_after) then
      binding = i
    end
    allowed = 0
  elseif allowed == 1 and r.remaining < results[binding].remaining then
    binding = i
  end
end

if allowed == 1 then
  for i, r in ipairs(results) do
    if r.write then
      rules[i].commit(KEYS[i], r)
    end
  end
else
  -- Nothing is consumed anywhere: report the admitting rules as they stand.
  for i, r in ipairs(results) do
    if r.allowed == 1 then
      results[i] = rules[i].check(KEYS[i], 0)
    end
  end
end

local reply = { allowed, allowed == 1 and 0 or results[binding].retry_after, binding }
for _, r in ipairs(results) do
  local n = #reply
  reply[n + 1] = r.allowed
  reply[n + 2] = r.limit
  reply[n + 3] = r.remaining
  reply[n + 4] = r.reset_after
  reply[n + 5] = r.retry_after
  reply[n + 6] = r.window
end
return reply
