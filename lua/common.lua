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
local known = lone or op == 'decide' or op == 'group' or op == 'reset' or op == 'refund'
if not known then
  return redis.error_reply('edge-limiter: the call names no operation of this script')
end

-- A lone rule that takes overrides sends its client's override key as
-- KEYS[2]. With one stored, the general decision (limiter.lua) decides the
-- rule, reading and applying the override; `general` says whether this
-- call goes that way, so that only such calls build its functions (Redis
-- builds every function of a script anew on each call).
local overridden = lone and KEYS[2] ~= nil and call('EXISTS', KEYS[2]) == 1
local general = overridden or not lone
