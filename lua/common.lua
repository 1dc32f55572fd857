-- Conventions every part of the script follows, and the aliases the
-- one-rule paths read globals through.
--
-- Portable Lua only: Lua 5.1's base, string, math and table libraries,
-- redis.call, KEYS and ARGV. Hosted Upstash runs its own Lua, without the
-- modules stock Redis bundles (tests/lua_portable.rs refuses them).
--
-- Stored numbers are decimal integer text (string.format '%d'), read back
-- with tonumber: anything else, an older release's state or a stray write,
-- reads as no state. Integers up to 2^53 are exact in Lua's doubles, and
-- the configuration keeps every figure below that.
--
-- Redis builds every function of the script anew on each call, so the
-- script keeps few functions and few captured locals, sizes its tables
-- where they are made, and leaves to the caller what needs no stored state
-- (which rule binds, the request's retry-after). bench/SCRIPTS.md has the
-- measurements behind these choices.
--
-- With a pinned clock (tests, simulations) real time is not the timeline,
-- so an expiry cannot be state: the state says when it is worthless, and
-- keys live one day (86400000 ms) longer than that, so a replay slower
-- than its log never loses state to an expiry.
--
-- Every call names its operation in ARGV[1]. The two lone-rule operations
-- are the rule's own arguments (a rule's word, 'gcra' or 'window', then
-- its cost and figures, as in a general decision), decided at the top of
-- gcra.lua or windowed.lua before any function is built; they read ARGV
-- and redis.call through these aliases, which no function captures.
local argv, call, op = ARGV, redis.call, ARGV[1]
-- The operations: the one list of them in the script
-- (src/decision/transport/protocol/script.rs's Entry owns the names, and a
-- test there holds these two lines to it).
local lone = op == 'gcra' or op == 'window'
local known = lone or op == 'decide' or op == 'group' or op == 'reset' or op == 'refund' or op == 'debit' or op == 'pool' or op == 'credit'
if not known then
  return redis.error_reply('edge-limiter: the call names no operation of this script')
end

-- A lone rule that takes overrides sends its client's override key as
-- KEYS[2]. With one stored, the general decision (limiter.lua) decides the
-- rule, reading and applying the override. `general` says whether this
-- call reads rules the general way (a decision, a group, a refund), so
-- that only such calls build its functions (Redis builds every function
-- of a script anew on each call).
local overridden = lone and KEYS[2] ~= nil and call('EXISTS', KEYS[2]) == 1
local general = overridden or not (lone or op == 'reset')

-- The general path reads ARGV in order, from ARGV[at]: read(n) gives the
-- next n arguments, as text. A lone rule's call is its rule's arguments
-- from ARGV[1]; every other call names its clock in ARGV[2]: now in
-- milliseconds, or '' for Redis's own (key expiries, TIME), so that edge
-- locations with skewed clocks agree. now_us and now_ms are nil on
-- Redis's clock.
local at, read, now_us, now_ms = 1, nil, nil, nil
if general then
  function read(n)
    at = at + n
    return unpack(ARGV, at - n, at - 1)
  end
  if not lone then
    at = 2
    local pinned_ms = read(1)
    if pinned_ms ~= '' then
      now_us, now_ms = pinned_ms * 1000, pinned_ms + 0
    end
  end
end
