-- Pools: quota the home region granted this region's Redis for a rule kept
-- across regions (`regions = "shared"`), spent here without asking the home.
--
-- The home charges a pool as leases are charged (gcra.lua, windowed.lua's
-- grant): its units count as arriving at its deadline, r + ms on the home's
-- clock, r being when the home granted it. So every unit must be spent
-- before r + ms in real time. The region cannot read the home's clock, and
-- trusting the write's delay would over-admit by that delay; instead the
-- deadline is counted on this Redis's own clock, from an instant known to
-- come before r: the call that asked for the pool records its own time c0
-- as the pending top-up, and only its reply sends the isolate to the home.
-- The credit then sets the deadline to c0 + ms. Since c0 came before r, and
-- one clock is compared only with itself, every spend falls before r + ms.
--
-- A pool key holds eleven numbers, decimal text: units and deadline (us)
-- of the tranche spent first, the same of the next (a top-up lands while
-- the last one lasts), the pending top-up's c0 (0: none), units spent
-- since the demand span began, units spent in the span before, when it
-- began, the TAT (us) of the region's own share of the client's limit, a
-- GCRA on this clock that the home's figures leave room for
-- (src/rules/shared.rs): what a fresh client spends before any pool is
-- granted; then the units the home had left when it last granted (the
-- pool's own aside) and when it would be full again (us, this clock), for
-- the headers. A key of nine, as written before those two, reads as none.
--
-- ARGV[1] == 'pool': spend from every pool in KEYS, all or nothing.
--   ARGV[2]   the clock (common.lua)
--   ARGV[3..] per key: the request's cost, the pool's length (ms: the
--             longest the home grants, and the demand span), the most
--             units one top-up may ask for, the share's units at once (0:
--             none) and its interval (us), how long a call to the home
--             takes the isolate there and back (ms; 0: not known yet), and
--             the units the isolate asks to hold itself (0: none) and for
--             how long at most (ms)
--   Reply: ten integers per key: 1 if the pools (else the shares)
--   covered the request and it was spent, else 0 (then nothing was spent
--   anywhere: the home decides); the units left, pool and share; ms until
--   the last of the pool's lapses; units to ask the home for (0: no
--   top-up now); the top-up's c0 (us), which its credit must name; units
--   moved to the isolate, and the ms it may spend them for; ms until the
--   home and the share are both full again, as the last grant and this
--   clock tell; 1 if the home may not be full yet, then the units it had
--   left at that grant, else 0 and 0.
--
-- An isolate's units come from one tranche, after the request is spent
-- from the pool (never from the share), and last no longer than it: whole
-- ms to its deadline on this clock, counted down. The isolate counts them
-- from an instant before it sent the call, on its own clock, which ran no
-- less meanwhile, so it spends none past the tranche's deadline.
-- ARGV[1] == 'credit': a top-up's grant, written into each pool in KEYS.
--   ARGV[3..] per key: c0, units granted, their ms, the pool's length
--             (ms), the units the home had left, and ms until it is full
--   Reply: 1 per key if the units went into the pool, 0 if the pending
--   top-up was no longer c0's (lapsed, or asked again): its units lapse
--   unspent, as the home already charged them.
-- ARGV[1] == 'decide' may carry a 'pools' section (limiter.lua): the
--   request's other rules decided in the same call as its pools' spend,
--   all or nothing. Each pool's numbers are a spend's, its key is among
--   the last in KEYS, and the reply ends with its ten integers.
local pools_check, pools_settle
if op == 'pool' or op == 'credit' or op == 'decide' then
  local clock_us
  -- A pool's numbers, with every lapsed tranche gone and the next moved up.
  local function read_pool(key)
    local got = redis.pcall('GET', key)
    local f = {}
    if type(got) == 'string' then
      for n in string.gmatch(got, '%d+') do
        f[#f + 1] = n + 0
      end
    end
    if #f == 9 then
      f[10], f[11] = 0, 0
    elseif #f ~= 11 then
      f = { 0, 0, 0, 0, 0, 0, 0, clock_us, 0, 0, 0 }
    end
    if f[4] <= clock_us then
      f[3] = 0
    end
    if f[2] <= clock_us or f[1] == 0 then
      f[1], f[2], f[3], f[4] = f[3], f[4], 0, 0
    end
    if f[3] == 0 then
      f[4] = 0
    end
    return f
  end
  -- Kept until its last tranche, its pending top-up and its demand span
  -- have lapsed; a day longer on a pinned clock (common.lua).
  local function write_pool(key, f, hold_us)
    local last = math.max(f[2], f[4], f[5] + hold_us, f[8] + 2 * hold_us, f[9])
    local ttl = math.max(math.ceil((last - clock_us) / 1000), 1)
    if now_us then
      ttl = ttl + 86400000
    end
    call('SET', key, string.format('%d %d %d %d %d %d %d %d %d %d %d', unpack(f)), 'PX', string.format('%d', ttl))
  end

  -- The n pools whose keys start at KEYS[first], each read with its six
  -- numbers from ARGV; and whether the pools, else the shares, cover the
  -- request, every one of them.
  function pools_check(first, n)
    clock_us = clock_us or now_us
    if not clock_us then
      local time = call('TIME')
      clock_us = time[1] * 1000000 + time[2]
    end
    local pools, covered = {}, true
    for i = 1, n do
      local cost, hold, most, units, every, far, lease, lease_ms = read(8)
      local key = KEYS[first + i - 1]
      local f = read_pool(key)
      local p = { key = key, f = f, cost = cost + 0, hold_us = hold * 1000, most = most + 0,
        units = units + 0, every = every + 0, ahead = math.max(f[9] - clock_us, 0), far_us = far * 1000,
        lease = lease + 0, lease_ms = lease_ms + 0 }
      p.pooled = f[1] + f[3] >= p.cost
      p.shared = p.units > 0 and p.ahead + p.cost * p.every <= p.units * p.every
      if not (p.pooled or p.shared) then
        covered = false
      end
      pools[i] = p
    end
    return pools, covered
  end

  -- Units the pool and the share hold.
  local function held(p)
    local have = p.f[1] + p.f[3]
    if p.units > 0 then
      have = have + math.floor((p.units * p.every - p.ahead) / p.every)
    end
    return have
  end

  -- Settles the request on `pools`: spent from them when `spend`, else
  -- sent to the home, which a top-up asked now rides with; a request
  -- denied elsewhere (`denied`) changes nothing. Appends each pool's
  -- ten integers to `reply`.
  function pools_settle(pools, spend, denied, reply)
    for _, p in ipairs(pools) do
      local f, cost, hold_us = p.f, p.cost, p.hold_us
      local ask, c0, moved, moved_ms = 0, 0, 0, 0
      local ends = math.max(f[2], f[4])
      if not denied then
        if spend and p.pooled then
          local first = math.min(f[1], cost)
          f[1], f[3] = f[1] - first, f[3] - (cost - first)
          -- The isolate's units come from the tranche spent first, unless
          -- it is short of the ask and the next holds more; they count as
          -- demand now: the region never sees them spent.
          local from = (f[1] >= p.lease or f[1] >= f[3]) and 1 or 3
          moved_ms = math.min(p.lease_ms, math.floor((f[from + 1] - clock_us) / 1000))
          if p.lease > 0 and moved_ms > 0 then
            moved = math.min(p.lease, f[from])
            f[from] = f[from] - moved
          end
          cost = cost + moved
        elseif spend then
          p.ahead = p.ahead + cost * p.every
          f[9] = clock_us + p.ahead
        end
        -- Demand, spent here or sent to the home, over the last one to two
        -- spans, the one before counted only when it came right before.
        if clock_us - f[8] >= hold_us then
          local next = clock_us - f[8] < 2 * hold_us
          f[7] = next and f[6] or 0
          f[6], f[8] = 0, next and f[8] + hold_us or clock_us
        end
        f[6] = f[6] + cost
        -- At least one, for a refresh (cost 0) of a pool whose demand lapsed.
        local seen = math.max(f[6] + f[7], 1)
        local left, have = f[1] + f[3], held(p)
        -- A top-up asks for a pool's length at the rate seen, that rate
        -- taken over at least a quarter of a length: a burst asks for four
        -- times itself at most.
        local over = math.max(clock_us - f[8] + (f[7] > 0 and hold_us or 0), hold_us / 4)
        local want = math.min(math.max(math.ceil(seen * hold_us / over), cost, 1), p.most)
        -- Asked when the client's next request here, one gap on (or once
        -- the isolate has spent half of what it took, when it refreshes
        -- its units), would find too little left
        -- for the top-up's far trip, twice over (a sixteenth of a length
        -- while the trip is unknown): in units, share included, at the
        -- rate seen, or in time. A page load the share covers asks
        -- nothing: what is left need never be over a quarter of the units
        -- seen. Once per length for a steady client; a lost top-up lapses
        -- with the longest pool it could bring.
        local far_us = p.far_us > 0 and p.far_us or hold_us / 16
        local soon = over / seen * (1 + moved / 2) + 2 * far_us
        local low = have < math.min(math.ceil(seen / 4), math.ceil(seen * soon / over))
        local ending = left > 0 and f[3] == 0 and ends - clock_us < soon
        local pending = f[5] > 0 and clock_us < f[5] + hold_us
        if not pending and (not spend or low or ending) then
          ask, c0, f[5] = want, clock_us, clock_us
        end
        write_pool(p.key, f, hold_us)
      end
      local k = #reply
      reply[k + 1], reply[k + 2], reply[k + 3], reply[k + 4], reply[k + 5] =
        spend and 1 or 0, held(p), math.max(math.ceil((ends - clock_us) / 1000), 0), ask, c0
      reply[k + 6], reply[k + 7] = moved, moved > 0 and moved_ms or 0
      local filling = f[11] > clock_us
      reply[k + 8] = math.ceil(math.max(f[11] - clock_us, p.ahead, 0) / 1000)
      reply[k + 9], reply[k + 10] = filling and 1 or 0, filling and f[10] or 0
    end
    return reply
  end

  if op == 'pool' then
    local pools, covered = pools_check(1, #KEYS)
    return pools_settle(pools, covered, false, {})
  end
  if op == 'credit' then
    local reply = {}
    -- No pool to check: only the clock, which the credit reads.
    pools_check(1, 0)
    for i = 1, #KEYS do
      local c0, units, ms, hold, home_left, home_full_ms = read(6)
      c0, units = c0 + 0, units + 0
      local f = read_pool(KEYS[i])
      local credited = 0
      if f[5] == c0 and c0 > 0 then
        credited, f[5] = 1, 0
        f[10], f[11] = home_left + 0, clock_us + home_full_ms * 1000
        local deadline = c0 + ms * 1000
        if units > 0 and deadline > clock_us then
          if f[1] == 0 then
            f[1], f[2] = units, deadline
          else
            -- At most one top-up is pending, so a third tranche cannot be;
            -- should one, merged under the sooner deadline it is still safe.
            f[3], f[4] = f[3] + units, math.min(f[4] > 0 and f[4] or deadline, deadline)
          end
        end
      end
      write_pool(KEYS[i], f, hold * 1000)
      reply[i] = credited
    end
    return reply
  end
end
