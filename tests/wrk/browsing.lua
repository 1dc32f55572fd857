-- wrk script: every request from one of four clients, each on a path of
-- its own, so that a client's requests overlap and wait in its line behind
-- one another's calls (the grouping of simultaneous requests). Usage:
--   wrk ... -s browsing.lua URL -- PREFIX
local sent = 0
local prefix = "/group"

function init(args)
  prefix = args[1] or prefix
end

function request()
  sent = sent + 1
  -- 198.18.0.0/15 is reserved for benchmarks: never a real client.
  local ip = string.format("198.18.0.%d", sent % 4)
  return wrk.format("GET", string.format("%s/%d", prefix, sent), { ["CF-Connecting-IP"] = ip })
end
