-- wrk script for the worker benchmarks. Usage:
--   wrk ... -s load.lua URL -- ROUND HOT_EVERY LABEL PREFIX SLOT SLICE
-- Every request but one in HOT_EVERY comes from a client never seen before,
-- so it is admitted and forwarded: that is the overhead under test. The rest
-- come from one hot client on a path of its own, driven past its limit, so the
-- origin's count for that path tells how exactly the limit held. PREFIX
-- (default /load) starts every path, to aim at a rule or at none. SLOT (0 to
-- 7) tells the workers of one run apart: two builds of ours share a Redis,
-- and must not share clients. SLICE numbers the runs of one round: each
-- starts its clients 4096 requests after the one before.

local threads = {}
local next_id = 1

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  round = tonumber(args[1]) or 0
  hot_every = tonumber(args[2]) or 10
  sent, hot = (tonumber(args[6]) or 0) * 4096, 0
  prefix = args[4] or "/load"
  slot = tonumber(args[5]) or 0
  -- Round and slot pick the second octet (32 rounds of 8 workers before any
  -- address repeats); thread and counter the last two.
  block = (round * 8 + slot) % 256
  -- Must match load.rs's hot_path: the origin counts hits per path.
  hot_path = string.format("%s/hot-%s-%d", prefix, args[3] or "x", round)
  -- 203.0.113.0/24 is reserved for documentation: never a real client.
  hot_ip = string.format("203.0.113.%d", block)
end

function request()
  sent = sent + 1
  if sent % hot_every == 0 then
    hot = hot + 1
    return wrk.format("GET", hot_path, { ["CF-Connecting-IP"] = hot_ip })
  end
  -- Distinct per round, slot, thread and request: 10.thread.block.hi.lo
  -- would not fit, so the thread (up to 4) shares the last two octets with
  -- the counter: 16384 fresh clients per thread and run.
  local n = (sent * 4 + id - 1) % 65536
  local ip = string.format("10.%d.%d.%d", block, math.floor(n / 256), n % 256)
  return wrk.format("GET", prefix .. "/page", { ["CF-Connecting-IP"] = ip })
end

-- Two lines the bench parses; latencies in microseconds. PCT holds the
-- latency at a grid of percentiles (p:us), finest in the tail, so that rounds
-- can be pooled before a percentile is taken. (wrk's latency(i) walks every
-- microsecond for each value, too slow to dump the whole histogram.)
function done(summary, latency, requests)
  local hot_sent = 0
  for _, t in ipairs(threads) do
    hot_sent = hot_sent + t:get("hot")
  end
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d hot_sent=%d non2xx=%d socket_errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    hot_sent, e.status, e.connect + e.read + e.write + e.timeout))
  local parts = {}
  local function add(p)
    parts[#parts + 1] = string.format("%g:%d", p, latency:percentile(p))
  end
  for p = 1, 98 do add(p) end
  for i = 1, 19 do add(98 + i / 10) end
  for i = 1, 9 do add(99.9 + i / 100) end
  -- percentile(100) answers 0.
  parts[#parts + 1] = string.format("100:%d", latency.max)
  io.write("PCT " .. table.concat(parts, " ") .. "\n")
end
