-- The entry point: decides every rule that matches one request, all or
-- nothing, in one call. common.lua, gcra.lua and windowed.lua are joined in
-- front of this file at build time (see build.rs), behind the `#!lua` shebang.
--
-- KEYS[i]   state of rule i (all under one hash tag when run on a cluster)
-- ARGV[1]   operation: 'decide', or 'reset' to forget every key given
-- ARGV[2]   now in milliseconds, or '' to keep Redis's own time (key
--           expiries, TIME), so that edge locations with skewed clocks agree
-- ARGV[3]   one letter per rule: 'e' enforces, 's' is a shadow rule whose
--           denial is reported but blocks nothing (and it is then not charged)
-- ARGV[4..] per rule, in KEYS order:
--             'gcra',   cost, interval (us), burst
--             'window', cost, offset (ms), n, then n x (duration, limit, precision) (ms)
--
-- Reply: six integers per rule, in KEYS order: allowed (1/0), limit,
-- remaining, reset_after, retry_after (milliseconds; -1: never, the cost
-- exceeds the limit) and the 1-based binding window. A rule alone, in the
-- common cases, replies with one integer instead, from which the caller
-- derives the six (Redis turns a Lua table into its reply for about 1 us
-- more than a number):
--   GCRA          how far its TAT lay ahead before the request (us), or -1
--                 minus that when it is denied (see gcra_decide);
--   one window    when it admits at a cost and the figure stays exact below
--                 2^53: remaining x precision + (duration - reset_after). As
--                 the request lies in the newest bucket, reset_after is
--                 duration minus how far into its bucket now lies, so the
--                 second term is below precision.
-- The request is allowed when every enforced rule admits it; then every rule
-- that admits it is charged. Otherwise none is, and the rules that would
-- have admitted it are reported as they stand. Which rule binds, and the
-- request's retry-after, follow from the fields: the caller works them out.

if ARGV[1] == 'reset' then
  return redis.call('DEL', unpack(KEYS))
end

-- The pinned clock, microseconds; nil on Redis's clock. GCRA then needs no
-- clock (its state is the key's expiry); windowed rules read TIME, once.
local now_us, now_ms
if ARGV[2] ~= '' then
  now_us = ARGV[2] * 1000
  now_ms = ARGV[2] + 0
end
-- Stand-in until main's pinned-mode expiry lands (issue 14 branch): on a
-- pinned clock a windowed key must outlive a replay slower than its log.
local function pinned_expiry(write)
  if now_us and write.expire then
    write.expire = string.format('%d', write.expire + 86400000)
  end
  return write
end
local function clock_ms()
  if not now_ms then
    local t = redis.call('TIME')
    now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
  end
  return now_ms
end

if #KEYS == 1 then
  -- One rule, the common case: its own verdict is the request's, so none of
  -- the all-or-nothing bookkeeping below is needed. A shadow rule's denial
  -- writes nothing either way. The reply is one integer where it can be
  -- (see above). The windowed dispatch repeats decide()'s on purpose:
  -- a shared check/commit pair of functions measured about 0.5 us more per
  -- call (another call layer, and the clock captured by one more function).
  if ARGV[4] == 'gcra' then
    return gcra_decide(KEYS[1], now_us, ARGV[5] + 0, ARGV[6] + 0, ARGV[7] + 0)
  end
  local a, b, c, d, e, f, write = windowed_check(KEYS[1], clock_ms(), ARGV[5] + 0, ARGV[6] + 0, 8, ARGV[7] + 0)
  if write then
    windowed_commit(KEYS[1], pinned_expiry(write))
    if ARGV[7] == '1' then
      local packed = c * ARGV[10] + ARGV[8] - d
      if packed < 9007199254740992 then
        return packed
      end
    end
  end
  return { a, b, c, d, e, f }
end

local reply, writes, modes = { 0, 0, 0, 0, 0, 0 }, { nil }, ARGV[3]

-- Decides every rule into reply[6i - 5 .. 6i] and writes[i]: at its own
-- cost or, when peeking, at cost 0 and only for the rules that admitted the
-- request. Returns whether an enforced rule denies it.
local function decide(peek)
  local denied, at = false, 4
  for i = 1, #KEYS do
    local k, n = 6 * i, 0
    if ARGV[at] == 'window' then
      n = ARGV[at + 3] + 0
    end
    if not peek or reply[k - 5] == 1 then
      local cost = 0
      if not peek then
        cost = ARGV[at + 1] + 0
      end
      if n == 0 then
        local interval = ARGV[at + 2] + 0
        reply[k - 5], reply[k - 4], reply[k - 3], reply[k - 2], reply[k - 1], reply[k], writes[i] =
          gcra_check(gcra_ahead(KEYS[i], now_us, interval), cost, interval, ARGV[at + 3] + 0)
      else
        reply[k - 5], reply[k - 4], reply[k - 3], reply[k - 2], reply[k - 1], reply[k], writes[i] =
          windowed_check(KEYS[i], clock_ms(), cost, ARGV[at + 2] + 0, at + 4, n)
      end
      if reply[k - 5] == 0 and string.byte(modes, i) ~= 115 then -- not 's'
        denied = true
      end
    end
    at = at + 4 + 3 * n
  end
  return denied
end

if decide(false) then
  -- Nothing is consumed anywhere: report the admitting rules as they stand.
  decide(true)
else
  for i = 1, #KEYS do
    local write = writes[i]
    if type(write) == 'number' then
      gcra_commit(KEYS[i], now_us, write)
    elseif write then
      windowed_commit(KEYS[i], pinned_expiry(write))
    end
  end
end
return reply
