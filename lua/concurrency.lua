-- The in-flight limit: at most `limit` requests of a key in flight at once.
--
-- A request takes a slot (one per unit of its cost) when it is admitted,
-- with every other rule it matches, and gives it back when its response
-- has ended: the caller's refund call, by the mark the decision replied
-- (the first slot's number). A slot whose release never comes (an isolate
-- evicted mid-request) is free `hold` milliseconds after it was taken.
--
-- The key is a sorted set: each slot a member, its number as decimal text,
-- scored by when it expires (ms, on the call's clock), so slots past
-- their time are left out of the count by score alone and dropped at the
-- next admission. The member '#' holds the last number handed out, as the
-- negative of its score, below every expiry: numbers never repeat within
-- the key's life, and start past every earlier life's (the clock times
-- 1024), so a late release can never free another request's slot.
--
-- Only the general path decides it: there is no lone-rule operation.
-- A rule's arguments: 'concurrency', cost, limit, hold (ms).
local concurrency = nil
if general then
  -- One function on every call; the steps are built the first time a
  -- rule of this algorithm is read: Redis builds every function of the
  -- script anew on each call, and calls without such a rule need none.
  concurrency = {}
  function concurrency.read(cost)
    if not concurrency.decide then
      -- The call's clock in milliseconds: the pinned one, or TIME read once.
      local clock_ms = now_ms
      local function clock()
        if not clock_ms then
          local time = redis.call('TIME')
          clock_ms = time[1] * 1000 + math.floor(time[2] / 1000)
        end
        return clock_ms
      end
      -- What a retry may wait at most, ms: slots free when responses end,
      -- which the script cannot foresee (docs/rules.md says the same).
      local RETRY_MS = 1000

      -- Decides the rule at `cost` slots (0 peeks) without writing: the six
      -- reply fields, then the write (the slots to take) if admitted.
      -- remaining counts free slots; a full key's reset and retry are when
      -- its first slot expires, at most RETRY_MS.
      function concurrency.decide(rule, key, cost)
        local now = clock()
        local held = redis.call('ZCOUNT', key, '(' .. string.format('%d', now), '+inf')
        local free = rule.limit - held
        if cost <= free then
          local write = nil
          if cost > 0 then
            write = { slots = cost, hold_ms = rule.hold_ms, first = 0 }
          end
          local reset = 0
          if free - cost <= 0 then
            reset = RETRY_MS
          end
          return 1, rule.limit, free - cost, reset, 0, 1, write
        end
        local retry = -1 -- more slots than the limit: no wait helps
        if cost <= rule.limit then
          retry = RETRY_MS
          local first = redis.call('ZRANGEBYSCORE', key, '(' .. string.format('%d', now), '+inf', 'WITHSCORES',
            'LIMIT', 0, 1)
          if first[2] then
            retry = math.max(1, math.min(RETRY_MS, first[2] - now))
          end
        end
        return 0, rule.limit, math.max(free, 0), math.max(retry, 0), retry, 1, nil
      end

      -- Takes the slots of an admitted request, numbered from write.first on,
      -- each expiring write.hold_ms from now; the key lives as long as its
      -- newest slot (a day longer on a pinned clock, see common.lua).
      function concurrency.commit(key, write)
        local now = clock()
        redis.call('ZREMRANGEBYSCORE', key, 0, string.format('%d', now))
        local last = -(tonumber(redis.call('ZSCORE', key, '#') or '') or 0)
        local first = math.max(last + 1, now * 1024)
        local expiry = string.format('%d', now + write.hold_ms)
        for n = first, first + write.slots - 1 do
          redis.call('ZADD', key, expiry, string.format('%d', n))
        end
        redis.call('ZADD', key, string.format('%d', -(first + write.slots - 1)), '#')
        write.first = first
        local ttl = write.hold_ms
        if now_ms then
          ttl = ttl + 86400000
        end
        if redis.call('PTTL', key) < ttl then
          redis.call('PEXPIRE', key, string.format('%d', ttl))
        end
      end

      -- Gives back the rule.cost slots numbered from `first` (the decision's
      -- mark): 1 if any was still held. Each number is one slot, so a release
      -- can free no more than its request took.
      function concurrency.refund(rule, key, first)
        local freed = 0
        for n = first, first + rule.cost - 1 do
          freed = freed + redis.call('ZREM', key, string.format('%d', n))
        end
        if freed > 0 then
          return 1
        end
        return 0
      end

      function concurrency.build(step)
        if step == 'mark' then
          -- The release mark: the first slot's number.
          function concurrency.mark(write)
            return write.first
          end
        elseif step == 'shift' then
          -- A delayed request holds its slot while it waits: the slot
          -- taken now stands.
          function concurrency.shift()
            return nil
          end
        elseif step == 'grant' then
          -- Never asked: the configuration refuses leases on in-flight limits.
          function concurrency.grant()
            return 0, 0, nil
          end
        elseif step == 'apply' then
          -- Whether `text` is an in-flight override ('v1 concurrency
          -- <limit>'); if so, its limit replaces the rule's. Checked as the
          -- configuration checks it (src/rules/policy/concurrency.rs).
          function concurrency.apply(rule, text)
            local limit = string.match(text, '^v1 concurrency ([1-9]%d*)$')
            if limit and limit + 0 <= 1000000 then
              rule.limit = limit + 0
              return true
            end
            return false
          end
        end
      end
    end
    local limit, hold_ms = read(2)
    return { algorithm = concurrency, cost = cost, limit = limit + 0, hold_ms = hold_ms + 0 }
  end
end
