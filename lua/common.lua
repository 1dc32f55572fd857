-- Helpers both algorithms and the entry point share.
--
-- A note on cost, since every decision runs this script: each redis.call is
-- by far the dearest step, then turning a number into a string (`..` on a
-- number, or a number handed to redis.call), then growing a table field by
-- field. The scripts therefore make as few calls as the algorithm allows,
-- reuse the argument strings as they came, and hand results back as plain
-- return values rather than tables.

local floor, ceil = math.floor, math.ceil

-- Whether a retry-after of `a` ms frees up strictly later than one of `b`;
-- -1 (never: the cost exceeds the limit) is the latest of all.
local function later(a, b)
  if a < 0 then
    return b >= 0
  end
  return b >= 0 and a > b
end
