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
-- ARGV[1]   how many clients to keep per rule and minute
-- ARGV[2]   this write's number in its isolate's sequence
-- ARGV[3]   how long the isolate's key lives, ms
-- ARGV[4]   how long the counters live after the last write, ms
-- ARGV[5]   n, then n x (field, figures): what this write adds to the
--           counters, its minutes' figures summed
-- then      per day key, in KEYS order: when it expires (ms since the epoch),
--           n, and n x (field, value):
--             '<minute of the day>'   figures, decimal integers separated
--                                     by spaces: added figure by figure
--             '<minute of the day>c'  clients, 'client count' pairs
--                                     separated by spaces: added client by
--                                     client, the ARGV[1] most counted kept
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

-- `old` and `new` clients added, the `kept` most counted first (ties by
-- name, so that every isolate's writes read alike). A client is one word:
-- an identifier as a key shows it, or its hash.
local function add_clients(old, new)
  local count, order = {}, {}
  for _, text in ipairs({ old or '', new }) do
    for client, n in string.gmatch(text, '(%S+) (%d+)') do
      if not count[client] then
        order[#order + 1] = client
        count[client] = 0
      end
      count[client] = count[client] + tonumber(n)
    end
  end
  table.sort(order, function(a, b)
    if count[a] ~= count[b] then
      return count[a] > count[b]
    end
    return a < b
  end)
  local out = {}
  for i = 1, math.min(#order, kept) do
    out[i] = order[i] .. ' ' .. string.format('%d', count[order[i]])
  end
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
    if string.sub(field, -1) == 'c' then
      value = add_clients(old, value)
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
