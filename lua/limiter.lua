-- The entry point: decides every rule that matches one request, all or
-- nothing, in one call. common.lua, pool.lua, gcra.lua, windowed.lua and
-- penalty.lua are joined in front of this file at build time (see build.rs).
--
-- ARGV[1] names the operation (src/decision/transport/protocol/script.rs's
-- Entry says the same; `known`, in common.lua, lists the names):
--   ARGV[1] == 'gcra'     one GCRA rule alone, on the Redis clock (gcra.lua)
--   ARGV[1] == 'window'   one windowed rule alone, on the Redis clock
--                         (windowed.lua); either, with KEYS[2], is a rule
--                         that takes overrides: KEYS[2] is the client's
--                         override key, and when it holds one the general
--                         decision below decides the rule
--   ARGV[1] == 'reset'    forget every key in KEYS (below)
--   ARGV[1] == 'refund'   give back refundable charges (below)
--   ARGV[1] == 'debit'    charge more than a decision charged (below)
--   ARGV[1] == 'decide'   the general decision (below)
--   ARGV[1] == 'group'    several requests of one client under the same
--                         rules, each decided by the general decision
--                         after the one before, at the same instant (below)
--   ARGV[1] == 'pool'     spend from the pools a region holds of rules
--                         kept across regions (pool.lua)
--   ARGV[1] == 'credit'   a top-up of those pools from the home (pool.lua)
--
-- A rule's arguments, the same in every call that carries rules: its
-- algorithm's word, its cost, then its figures, which the algorithm reads:
--   'gcra',   cost, interval (us), burst, max delay (ms, 0: none)
--   'window', cost, offset (ms), n, then n x (duration, limit, precision) (ms)
--   'concurrency', cost, limit, hold (ms)
-- A lone rule's call is its arguments alone.
--
-- Each algorithm's script builds, for the general path, a table of its
-- steps, and `algorithms` below lists them by word, once. Every step
-- takes the rule (a table of its figures) and its key where it needs them:
--   read(cost)                    a rule of cost: a table of its figures,
--                                 from the arguments (`read`), and of
--                                 `algorithm`, these steps
--   decide(rule, key, cost)       the six reply fields and the write an
--                                 admission makes (nil: none); cost 0 peeks;
--                                 for a denial that waiting would cure, the
--                                 wait (us) after which it would conform
--   commit(key, write)            that write
--   refund(rule, key, mark)       1 if a charge was given back
-- and, once build(step) has made them, for the calls that need them:
--   mark(write)                   the refund mark of a charge
--   grant(rule, key, outcome, cost, lease)
--                                 a lease charged with an admitted request:
--                                 units (0: none), ms, and the write then
--   apply(rule, text)             whether text is an override of the rule;
--                                 if so, its figures in force
--   shift(rule, o, cost, later, wait)
--                                 the request accounted as arriving later
--                                 (us) and its outcome o then: the write
--                                 that charges it (nil: decide's stands);
--                                 an algorithm without it cannot delay
--
-- The general decision:
-- KEYS[i]   state of rule i (all under one hash tag when run on a cluster);
--           after the rules' keys, one override key per rule that takes
--           overrides, then one penalty key per rule with a penalty
-- ARGV[1]   'decide' ('group' for a group)
-- ARGV[2]   the clock (common.lua)
-- ARGV[3]   one letter per rule: 'e' enforces, 's' is a shadow rule whose
--           denial is reported but blocks nothing (and it is then not
--           charged); 'r' and 'q' are the same with a refund mark in the
--           reply (rules that count only some responses: the caller gives
--           the charge back after a response they do not count)
-- ARGV[4..] each rule's arguments, in KEYS order; then sections, each a
--           word, a count m and m entries, in this order, each only when
--           it has entries:
--             'costs', for a group: each further request's cost per rule
--             (KEYS order), in the order they are decided after the first
--             (whose costs are the rules' own);
--             'lease': per lease asked for, its rule's 1-based index, the
--             most units it wants, its longest length (ms);
--             'override': per rule that takes overrides, its 1-based
--             index, the rule-wide override's text ('' for none), its ms
--             left (-1: no end);
--             'penalty': per rule with a penalty, its 1-based index and
--             the penalty (ms), in penalty keys' order;
--             'pools', in a region away from the home, for one request
--             (no group): per pool of the request's shared rules, the eight
--             numbers a spend takes (pool.lua); the pool keys come last in
--             KEYS. The request is admitted only if the pools, else the
--             shares, cover it too, and then spent from them; a request
--             they cannot cover commits nothing here (the home decides
--             its shared rules first), and is reported as it would be.
--
-- Reply: six integers per rule, in KEYS order: allowed (1/0), limit,
-- remaining, reset_after, retry_after (milliseconds; -1: never, the cost
-- exceeds the limit; for an admitted rule, how long the request waits
-- before it conforms, 0 for not at all) and the 1-based binding window. With penalties, one
-- more integer: the sum of 2^(i-1) over the rules i whose penalty this call
-- started. Then one refund mark per 'r' or 'q' rule, in KEYS order (0: it
-- was not charged): for GCRA the TAT the charge left (us, on the call's
-- clock); for windows the charge's time on the key's shifted clock (ms).
-- Then, per lease asked for, in order: the units granted (0: none) and
-- how long they may be spent (ms from now); a rule that granted one
-- reports what it has left after the grant. Then, per override read: whose
-- held (0: none, 1: the client's, 2: the rule's), 1 if the client's key
-- held something that is no override, and the text in force ('' for none).
-- Then, per pool, a spend's ten integers (pool.lua).
-- An override (src/rules/overrides.rs writes them) is 'v1 block',
-- 'v1 gcra <rate> <period ms> <burst> <interval us>' or 'v1 windows' and
-- '<duration ms>:<limit>' per window; a block denies like a running
-- penalty, for the override key's time left (no Retry-After when it has
-- no end).
-- A group replies with each request's six integers per rule, penalties
-- mask and refund marks, one request after another, then the leases
-- (asked with the last request) and the overrides read, once.
--
-- A lease is charged with the request, only when it is admitted, and
-- takes at most half of what the rule has left after it. GCRA accounts
-- its units (and the request's) as arriving when it ends, and grants it
-- only if that conforms now, so any spend before then conforms whatever
-- other callers do. A window's lease ends with the earliest bucket its
-- units were counted in (or its length, if sooner), so every window
-- counts them where they are spent.
--
-- The refund call: ARGV[2] the clock as for a decision, then per rule its
-- arguments, then its refund mark. Replies with one integer per rule: 1 if
-- something was given back. A debit call ('debit') is laid out the same:
-- each rule is charged its cost more, past its limit if it must be (a
-- response that cost more than its estimate).
-- The request is allowed when every enforced rule admits it; then every rule
-- that admits it is charged. Otherwise none is, and the rules that would
-- have admitted it are reported as they stand. Either way, a rule with a
-- penalty that denied it on its own (a shadow rule too) starts its
-- penalty. A rule whose penalty runs denies, its retry-after being what
-- is left of the penalty.

if op == 'reset' then
  return redis.call('DEL', unpack(KEYS))
end

-- The algorithms' steps, by the word that starts a rule's arguments: the
-- one list of them in the script.
local algorithms = { gcra = gcra, window = windowed, concurrency = concurrency }

-- The next rule's arguments, named: a table its algorithm makes.
local function read_rule()
  local word, cost = read(2)
  return algorithms[word].read(cost + 0)
end

-- A debit has a refund's layout and reply: each algorithm's refund step
-- then charges rule.cost more instead (gcra.lua, windowed.lua).
if op == 'refund' or op == 'debit' then
  local given = {}
  for i = 1, #KEYS do
    local rule = read_rule()
    given[i] = rule.algorithm.refund(rule, KEYS[i], read(1) + 0)
  end
  return given
end

-- The general decision's arguments, named. A lone rule that reached here
-- is enforced and reads its client's override (common.lua).
local modes, rules = 'e', {}
if not lone then
  modes = read(1)
end
for i = 1, #modes do
  rules[i] = read_rule()
end
-- The mode letters as string.byte gives them: 'e', 'r', 'q'.
local ENFORCE, REFUNDABLE, REFUNDABLE_SHADOW = 101, 114, 113

-- Each request's cost per rule, in the order they are decided: the
-- first's are the rules' own.
local costs = { {} }
for i, rule in ipairs(rules) do
  costs[1][i] = rule.cost
end
local section, count = read(2)
if section == 'costs' then
  for request = 2, count + 1 do
    local each = { read(#rules) }
    for i = 1, #rules do
      each[i] = each[i] + 0
    end
    costs[request] = each
  end
  section, count = read(2)
end
local leases = {}
if section == 'lease' then
  for j = 1, count do
    local rule, units, ms = read(3)
    leases[j] = { rule = rule + 0, units = units + 0, ms = ms + 0 }
  end
  section, count = read(2)
end
local overrides = {}
if lone then
  overrides[1] = { rule = 1, wide = '', wide_ms = -1, key = KEYS[2] }
elseif section == 'override' then
  for j = 1, count do
    local rule, wide, wide_ms = read(3)
    overrides[j] = { rule = rule + 0, wide = wide, wide_ms = wide_ms + 0, key = KEYS[#rules + j] }
  end
  section, count = read(2)
end
local penalties, penalized = nil, 0
if section == 'penalty' then
  penalties, penalized = {}, count
  for j = 1, count do
    local rule, ms = read(2)
    penalties[rule + 0] = { key = KEYS[#rules + #overrides + j], ms = ms + 0 }
  end
  section, count = read(2)
end
local pools, covered = nil, true
if section == 'pools' then
  pools, covered = pools_check(#rules + #overrides + penalized + 1, count)
end

-- The steps only some calls need, built for those alone: Redis builds
-- every function of the script anew on each call.
local needs = {}
if #leases > 0 then
  needs[#needs + 1] = 'grant'
end
if #overrides > 0 then
  needs[#needs + 1] = 'apply'
end
if string.find(modes, '[rq]') then
  needs[#needs + 1] = 'mark'
end
-- Only for the algorithms the call's rules use: an algorithm may build
-- its steps when its first rule is read (concurrency.lua does).
if #needs > 0 then
  local used = {}
  for _, rule in ipairs(rules) do
    used[rule.algorithm] = true
  end
  for _, step in ipairs(needs) do
    for algorithm in pairs(used) do
      algorithm.build(step)
    end
  end
end

-- Overrides: the figures in force replace the rule's own, so that
-- everything after reads them as if configured; a block ('v1 block')
-- denies the rule like a running penalty. A client's override goes before
-- its rule's; text that is not an override of this release for this rule
-- is none.
local blocked, override_reply = {}, {}
if #overrides > 0 then
  -- Whether `text` is an override of rule i; if so, applied.
  local function apply(i, text, left_ms)
    if text == 'v1 block' then
      blocked[i] = left_ms
      return true
    end
    return rules[i].algorithm.apply(rules[i], text)
  end
  for j, o in ipairs(overrides) do
    -- A key of another type (a stray write) errs on GET: none, noted.
    local got, source, ignored = redis.pcall('GET', o.key), 0, 0
    local text = type(got) == 'string' and got or nil
    if type(got) == 'table' then
      ignored = 1
    end
    if text then
      local left = redis.call('PTTL', o.key)
      if apply(o.rule, text, left) then
        source = 1
      else
        ignored = 1
      end
    end
    if source == 0 and o.wide ~= '' and apply(o.rule, o.wide, o.wide_ms) then
      source, text = 2, o.wide
    end
    if source == 0 then
      text = ''
    end
    override_reply[3 * j - 2], override_reply[3 * j - 1], override_reply[3 * j] = source, ignored, text
  end
end

-- Per rule, from the last decision: its six reply fields, named, what
-- its admission writes, and the wait that would cure its denial (us,
-- nil: none).
local outcomes, writes, waits = {}, {}, {}

-- Decides every rule at the costs `cost_of` into outcomes[i] and
-- writes[i], or, when peeking, at cost 0 and only the rules that admitted
-- the request. Returns whether an enforced rule denies it.
local function decide(cost_of, peek)
  local denied = false
  for i, rule in ipairs(rules) do
    if not peek or outcomes[i].allowed == 1 then
      -- A running penalty denies whatever the rate says: the rule is then
      -- reported as it stands (at cost 0), with the penalty's time left.
      local penalty, left = penalties and penalties[i], 0
      if penalty then
        left = penalty_left(penalty.key, now_ms)
        penalty.running = left > 0
      end
      -- A block is a penalty set by hand: -1 for one without end.
      local block = blocked[i]
      if block then
        left = math.max(left, block)
        if block < 0 then
          left = -1
        end
      end
      local cost = 0
      if not peek and left == 0 then
        cost = cost_of[i]
      end
      local o = {}
      o.allowed, o.limit, o.remaining, o.reset_after, o.retry_after, o.window, writes[i], waits[i] =
        rule.algorithm.decide(rule, KEYS[i], cost)
      if left ~= 0 then
        waits[i] = nil
      end
      if left > 0 then
        o.allowed, o.retry_after, writes[i] = 0, left, nil
        o.reset_after = math.max(o.reset_after, left)
      elseif left < 0 then
        o.allowed, o.remaining, o.retry_after, writes[i] = 0, 0, -1, nil
      end
      outcomes[i] = o
      local mode = string.byte(modes, i)
      if o.allowed == 0 and (mode == ENFORCE or mode == REFUNDABLE) then
        denied = true
      end
    end
  end
  return denied
end

-- Whether rule i's wait is one its own delay covers.
local function delays(i)
  return waits[i] and waits[i] <= (rules[i].delay_us or 0)
end

-- The shift step of `rule`'s algorithm, built on first use; nil for an
-- algorithm that cannot count a request later.
local function shift_of(rule)
  if not rule.algorithm.shift then
    rule.algorithm.build('shift')
  end
  return rule.algorithm.shift
end

-- How long a denied request waits before it is forwarded (us): the
-- longest wait of the enforced denials a rule's own delay covers; 0 when
-- it cannot wait, because no delay covers a denial, an enforced rule
-- would still deny it then, or a rule cannot count it later (a window's
-- buckets).
local function delay()
  local later = 0
  for i in ipairs(rules) do
    local mode = string.byte(modes, i)
    if outcomes[i].allowed == 0 and (mode == ENFORCE or mode == REFUNDABLE) and delays(i) then
      later = math.max(later, waits[i])
    end
  end
  if later == 0 then
    return 0
  end
  for i, rule in ipairs(rules) do
    local mode = string.byte(modes, i)
    local enforced = mode == ENFORCE or mode == REFUNDABLE
    if enforced and outcomes[i].allowed == 0 and not (waits[i] and waits[i] <= later) then
      return 0
    end
    if not shift_of(rule) then
      return 0
    end
  end
  return later
end

-- Each request in turn: one, or a group's, each decided as if it came
-- after the one before at the same instant, so that each sees what those
-- before it charged.
local reply, granted, denied, held = {}, {}, false, false
for request, cost_of in ipairs(costs) do
  denied = decide(cost_of, false)
  -- A request that waits is reserved at the instant it is forwarded:
  -- every rule counts it arriving then. A shadow rule's own delay
  -- reserves its own instant.
  local later = 0
  if denied then
    later = delay()
    denied = later == 0
  end
  -- Admitted here but not covered by its pools: the home decides first.
  held = not denied and not covered
  if not denied and not held then
    for i, rule in ipairs(rules) do
      if (waits[i] and (waits[i] <= later or delays(i))) or (later > 0 and outcomes[i].allowed == 1) then
        writes[i] = shift_of(rule)(rule, outcomes[i], cost_of[i], later, waits[i]) or writes[i]
      end
    end
  end
  if denied or held then
    -- Nothing is consumed anywhere: report the admitting rules as they stand.
    decide(cost_of, true)
  else
    -- A group asks for its leases with its last request: each charged
    -- with it, only when it is admitted, at most half of what the rule
    -- has left after it.
    if request == #costs and later == 0 then
      for j, lease in ipairs(leases) do
        local i = lease.rule
        local units, ms, write = 0, 0, nil
        if outcomes[i].allowed == 1 then
          units, ms, write = rules[i].algorithm.grant(rules[i], KEYS[i], outcomes[i], cost_of[i], lease)
        end
        if units > 0 then
          writes[i] = write
        end
        granted[2 * j - 1], granted[2 * j] = units, ms
      end
    end
    for i, rule in ipairs(rules) do
      if writes[i] then
        rule.algorithm.commit(KEYS[i], writes[i])
      end
    end
  end
  -- Every rule that denied on its own starts its penalty, a shadow rule's
  -- too: it then reports the denials enforcing it would have made. A call
  -- at cost 0 (a lease refresh, a look) denies no request, and starts none.
  local started = 0
  for i, penalty in pairs(penalties or {}) do
    local o = outcomes[i]
    if o.allowed == 0 and not penalty.running and not blocked[i] and cost_of[i] ~= 0 then
      penalty_start(penalty.key, now_ms, penalty.ms)
      started = started + 2 ^ (i - 1)
      o.retry_after = math.max(o.retry_after, penalty.ms)
      o.reset_after = math.max(o.reset_after, penalty.ms)
    end
  end
  for i = 1, #rules do
    local o, k = outcomes[i], #reply
    reply[k + 1], reply[k + 2], reply[k + 3] = o.allowed, o.limit, o.remaining
    reply[k + 4], reply[k + 5], reply[k + 6] = o.reset_after, o.retry_after, o.window
  end
  if penalties then
    reply[#reply + 1] = started
  end
  -- Refund marks, when the request was charged.
  for i, rule in ipairs(rules) do
    local mode = string.byte(modes, i)
    if mode == REFUNDABLE or mode == REFUNDABLE_SHADOW then
      local mark = 0
      if not (denied or held) and writes[i] then
        mark = rule.algorithm.mark(writes[i])
      end
      reply[#reply + 1] = mark
    end
  end
end
for j = 1, 2 * #leases do
  reply[#reply + 1] = granted[j] or 0
end
for j = 1, #override_reply do
  reply[#reply + 1] = override_reply[j]
end
if pools then
  pools_settle(pools, covered and not denied, denied, reply)
end
return reply
