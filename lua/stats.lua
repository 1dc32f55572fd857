-- The stats script: adds what one isolate counted since its last write to
-- the figures kept in Redis, in one call after a response, never on a
-- request's path. A script of its own (build.rs embeds it with its SHA1),
-- not an entry of the limiter's: the worker sends it once per isolate every
-- `stats_every`, and the limiter's script stays as it was.
--
-- Portable Lua only, as common.lua says; numbers are decimal integer text.
--
-- KEYS[1]   the writing isolate's key: the number of its last write added
-- KEYS[2]   the counters: every figure ever added, per rule (a field named
--           after it) and over every request ('*'), and when the last
--           write landed ('.written', ms on Redis's clock)
-- KEYS[3..] one hash per day (UTC) and rule, or the day's figures over every
--           request, all under the hash tag {#stats}: one slot, so the call
--           works on Redis Cluster (src/decision/stats/stored.rs names them)
-- ARGV[1]   how many names to keep per summary
-- ARGV[2]   this write's number in its isolate's sequence
-- ARGV[3]   how long the isolate's key lives, ms
-- ARGV[4]   how long the counters live after the last write, ms
-- ARGV[5]   n, then n x (field, figures): what this write adds to the
--           counters, its minutes' figures summed
-- then      per day key, in KEYS order: when it expires (ms since the epoch),
--           n, and n x (field, value):
--             '<minute of the day>'   figures, decimal integers separated
--                                     by spaces: added figure by figure
--             '<minute of the day>c'  the clients most denied, and with
--             '<minute of the day>g'  'g' the countries, with 'a' the
--             '<minute of the day>a'  networks (ASNs): summaries that
--                                     add_top adds, the ARGV[1] most
--                                     counted kept
--
-- Reply: the number of fields written; 0 for a write already added.
--
-- An isolate whose write timed out cannot tell whether it was added, so it
-- sends the same write again, under the same number: added once, a write
-- is skipped after, and a lost reply never counts a request twice. An
-- isolate writes one at a time and in order, so the last number is enough.
local kept = tonumber(ARGV[1])
local last = tonumber(redis.call('GET', KEYS[1]) or '')
if last and last >= tonumber(ARGV[2]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])

-- `text`'s decimal integers, in order.
local function numbers(text)
  local out = {}
  for n in string.gmatch(text or '', '%d+') do
    out[#out + 1] = tonumber(n)
  end
  return out
end

-- `old` and `new` figures added one by one; a record with fewer figures
-- (written by an older release) counts 0 for those it lacks.
local function add_figures(old, new)
  local sum, more = numbers(old), numbers(new)
  for i = 1, math.max(#sum, #more) do
    sum[i] = string.format('%d', (sum[i] or 0) + (more[i] or 0))
  end
  return table.concat(sum, ' ')
end

-- A summary of the names a rule denied most in a minute (clients,
-- countries, networks): '+floor', then 'name count over' triples, most
-- counted first. Each name's true number is within `over` below `count`;
-- a name not listed had at most `floor`. (Older releases wrote 'name
-- count' pairs: read as exact.)
local function read_top(text)
  local floor, entries = string.match(text or '', '^%+(%d+)(.*)$')
  local out = { floor = tonumber(floor) or 0, count = {}, over = {} }
  if floor then
    for name, n, over in string.gmatch(entries, '(%S+) (%d+) (%d+)') do
      out.count[name], out.over[name] = tonumber(n), tonumber(over)
    end
  else
    for name, n in string.gmatch(text or '', '(%S+) (%d+)') do
      out.count[name], out.over[name] = tonumber(n), 0
    end
  end
  return out
end

-- `old` and `new` summaries added, the `kept` most counted kept (ties by
-- name, so that every isolate's writes read alike). A name missing from
-- one side had at most that side's floor there: it is added to its count
-- and to its error. Dropping a name raises the floor to its count.
local function add_top(old, new)
  local a, b = read_top(old), read_top(new)
  local count, over, order = {}, {}, {}
  for _, pair in ipairs({ { a, b }, { b, a } }) do
    local side, other = pair[1], pair[2]
    for name, n in pairs(side.count) do
      if not count[name] then
        order[#order + 1] = name
        local theirs = other.count[name]
        count[name] = n + (theirs or other.floor)
        over[name] = side.over[name] + (theirs and other.over[name] or other.floor)
      end
    end
  end
  table.sort(order, function(x, y)
    if count[x] ~= count[y] then
      return count[x] > count[y]
    end
    return x < y
  end)
  local floor = a.floor + b.floor
  local out = {}
  for i, name in ipairs(order) do
    if i <= kept then
      out[#out + 1] = name .. ' ' .. string.format('%d %d', count[name], over[name])
    else
      floor = math.max(floor, count[name])
    end
  end
  table.insert(out, 1, string.format('+%d', floor))
  return table.concat(out, ' ')
end

-- Counters only grow, and only here, a write once: what Prometheus's
-- rate() needs, whichever isolates wrote and whenever.
local n_counters = tonumber(ARGV[5])
for i = 0, n_counters - 1 do
  local field = ARGV[6 + 2 * i]
  redis.call('HSET', KEYS[2], field, add_figures(redis.call('HGET', KEYS[2], field), ARGV[7 + 2 * i]))
end
local time = redis.call('TIME')
redis.call('HSET', KEYS[2], '.written', string.format('%d', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)))
redis.call('PEXPIRE', KEYS[2], ARGV[4])

local at, written = 6 + 2 * n_counters, 0
for i = 3, #KEYS do
  local key, expires, n = KEYS[i], ARGV[at], tonumber(ARGV[at + 1])
  at = at + 2
  for _ = 1, n do
    local field, value = ARGV[at], ARGV[at + 1]
    at = at + 2
    local old = redis.call('HGET', key, field)
    if string.find(field, '%a$') then
      value = add_top(old, value)
    else
      value = add_figures(old, value)
    end
    redis.call('HSET', key, field, value)
    written = written + 1
  end
  -- A day's figures go `stats_keep` after the day ends, whoever writes last.
  redis.call('PEXPIREAT', key, expires)
end
return written
