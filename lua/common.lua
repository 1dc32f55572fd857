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
-- The one-rule paths at the top of gcra.lua and windowed.lua run before any
-- function is built and read ARGV and redis.call through these aliases; no
-- function uses them, so no closure captures them.
local argv, call, args = ARGV, redis.call, #ARGV
-- A lone windowed rule's ARGV (more than 3): its offset, n x (duration,
-- limit, precision), then its cost when it is not 1. Its n, and its cost
-- as text.
local lone_n, lone_cost = 0, '1'
if args > 3 then
  lone_n = (args - 1 - (args - 1) % 3) / 3
  if (args - 1) % 3 == 1 then
    lone_cost = argv[args]
  end
end

-- A lone rule that takes overrides sends its override key as KEYS[2].
-- With none stored its one-rule path decides it; with one, ARGV becomes
-- the general decision's with an override read, which applies it.
if #KEYS == 2 and tonumber(argv[1]) and call('EXISTS', KEYS[2]) == 1 then
  local rule = { 'gcra', argv[3] or '1', argv[1], argv[2] }
  if args > 3 then
    rule = { 'window', lone_cost, argv[1], tostring(lone_n), unpack(argv, 2, 1 + 3 * lone_n) }
  end
  local general = { 'decide', '', 'e', unpack(rule) }
  for _, word in ipairs({ 'override', '1', '1', '', '-1' }) do
    general[#general + 1] = word
  end
  for i, word in ipairs(general) do
    argv[i] = word
  end
  args = #argv
end

-- Whether ARGV[1] names an operation: the one list of them in the script
-- (src/decision/transport/protocol/script.rs's Entry owns the names, and a
-- test there holds this line to it). A one-rule path's first argument is a
-- number, so its guard takes any call that names none: a new operation
-- added here cannot be taken for a lone rule.
local op = argv[1]
local named = op == 'decide' or op == 'group' or op == 'reset' or op == 'refund'
