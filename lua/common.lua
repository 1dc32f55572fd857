-- Helpers both algorithms and the entry point share.

-- Whether a retry-after of `a` ms frees up strictly later than one of `b`;
-- -1 (never: the cost exceeds the limit) is the latest of all.
local function later(a, b)
  if a < 0 then
    return b >= 0
  end
  return b >= 0 and a > b
end
