-- Locals both algorithms and the entry point share.
--
-- A note on cost, since every decision runs this script. Redis runs the
-- whole file as one function per call, so each local function is built
-- anew on every call and every table is a fresh allocation. Measured inside
-- Redis 7.0 on a 2-core machine: an empty script costs about 1 us and each
-- redis.call about 1 us more; turning a number into decimal text about
-- 0.45 us (0.15 with string.format '%d'); tonumber about 0.13 us, where
-- Lua's own coercion (`s + 0`) takes half that; a table grown field by field
-- about 0.08 us per growth step, unless its constructor sized it. Hence the
-- state is stored as packed doubles rather than text, the reply and the
-- argument tables are sized where they are made, and the choices that need
-- no stored state (which rule binds, the request's retry-after) are left to
-- the caller.

local floor, ceil = math.floor, math.ceil

-- Every stored number is one little-endian double: exact for the integers
-- used here (up to 2^53), and free of any text formatting.
local pack, unpack_number = struct.pack, struct.unpack
local NUMBER = '<d'
