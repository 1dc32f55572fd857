//! Holds scripts flagged `allow-key-locking` to the rule hosted Upstash
//! enforces for them: every key a `redis.call` touches must be one of the
//! call's `KEYS`, and commands that need the whole database (`FLUSHDB`,
//! `KEYS`, `SCAN`...) are refused. Stock Redis checks neither, so a script
//! breaking the rule would pass every local test and fail in production.
//!
//! Which arguments of a command are keys comes from Redis itself: the key
//! specifications in its `COMMAND` reply, encoded here into a compact text
//! that a guard, placed in front of the script, reads for each call. Lua
//! errors keep their line numbers; an error a Redis command raises is
//! placed on line 2, where the guard makes the call. Commands whose keys
//! Redis cannot locate ahead of time (`SORT ... STORE`) are left unchecked.

use crate::resp::Value;

/// Encodes the key specifications of every command in a `COMMAND` reply as
/// `;NAME=SPECS;...`, NAME upper-case (`OBJECT|ENCODING` for a
/// subcommand), SPECS one of:
/// - `c`: a container; the subcommand's entry decides;
/// - `db`: touches the database as a whole, with no key to lock;
/// - a `/`-separated list of `BEGIN:FIND`, BEGIN `i:INDEX` or
///   `k:KEYWORD:STARTFROM`, FIND `r:LASTKEY:STEP:LIMIT` or
///   `n:NUMIDX:FIRST:STEP`, or `u` where Redis cannot say (left unchecked);
/// - empty: the command takes no keys.
pub fn encode(command_reply: &Value) -> String {
    let mut out = String::from(";");
    if let Value::Array(commands) = command_reply {
        for command in commands {
            encode_command(command, &mut out);
        }
    }
    out
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::Bulk(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::Simple(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn items(v: Option<&Value>) -> &[Value] {
    match v {
        Some(Value::Array(items)) => items,
        _ => &[],
    }
}

/// A flat `[name, value, name, value...]` array's value for `name`.
fn field<'a>(pairs: &'a [Value], name: &str) -> Option<&'a Value> {
    pairs
        .chunks(2)
        .find(|kv| text(&kv[0]).as_deref() == Some(name))
        .and_then(|kv| kv.get(1))
}

fn number(pairs: &[Value], name: &str) -> String {
    field(pairs, name)
        .and_then(text)
        .unwrap_or_else(|| "0".into())
}

fn encode_command(entry: &Value, out: &mut String) {
    // [name, arity, flags, first, last, step, categories, tips, key specs, subcommands]
    let parts = items(Some(entry));
    let Some(name) = parts.first().and_then(text) else {
        return;
    };
    let categories: Vec<String> = items(parts.get(6)).iter().filter_map(text).collect();
    let key_specs = items(parts.get(8));
    let subcommands = items(parts.get(9));
    let specs = if !subcommands.is_empty() && key_specs.is_empty() {
        "c".to_owned()
    } else if key_specs.is_empty() {
        let whole_db = categories.iter().any(|c| c == "@keyspace") && !name.ends_with("|help");
        if whole_db { "db" } else { "" }.to_owned()
    } else {
        key_specs
            .iter()
            .map(|spec| encode_spec(items(Some(spec))))
            .collect::<Vec<_>>()
            .join("/")
    };
    out.push_str(&name.to_ascii_uppercase());
    out.push('=');
    out.push_str(&specs);
    out.push(';');
    for sub in subcommands {
        encode_command(sub, out);
    }
}

fn encode_spec(spec: &[Value]) -> String {
    let begin = items(field(spec, "begin_search"));
    let find = items(field(spec, "find_keys"));
    let kind = |pairs: &[Value]| field(pairs, "type").and_then(text).unwrap_or_default();
    let begin_spec = items(field(begin, "spec"));
    let find_spec = items(field(find, "spec"));
    let begin = match kind(begin).as_str() {
        "index" => format!("i:{}", number(begin_spec, "index")),
        "keyword" => format!(
            "k:{}:{}",
            field(begin_spec, "keyword")
                .and_then(text)
                .unwrap_or_default()
                .to_ascii_uppercase(),
            number(begin_spec, "startfrom")
        ),
        _ => return "u".into(),
    };
    let find = match kind(find).as_str() {
        "range" => format!(
            "r:{}:{}:{}",
            number(find_spec, "lastkey"),
            number(find_spec, "keystep"),
            number(find_spec, "limit")
        ),
        "keynum" => format!(
            "n:{}:{}:{}",
            number(find_spec, "keynumidx"),
            number(find_spec, "firstkey"),
            number(find_spec, "keystep")
        ),
        _ => return "u".into(),
    };
    format!("{begin}:{find}")
}

/// Lua, on one line (so the script's own line numbers stay as written),
/// that puts a guard in front of `redis.call` and `redis.pcall` for the
/// rest of the script: a local `redis` whose calls first check their keys
/// against `KEYS` and their command against the database-wide ones. SPECS
/// is [`encode`]'s text. Placed after the shebang line, before the body.
pub fn guard(specs: &str) -> String {
    const GUARD: &str = r#"
local redis = (function(real, keys)
  local declared = {}
  for _, k in ipairs(keys) do declared[k] = true end
  local specs = SPECS
  local function spec_of(name)
    local _, to = string.find(specs, ';' .. name .. '=', 1, true)
    if not to then return nil end
    return string.sub(specs, to + 1, string.find(specs, ';', to + 1, true) - 1)
  end
  local function refuse(text)
    error({ err = 'ERR upstash-local: a script flagged allow-key-locking ' .. text }, 0)
  end
  local function keys_of(args, spec, each)
    local p = {}
    for t in string.gmatch(spec, '[^:]+') do p[#p + 1] = t end
    local argc, start, f = #args, nil, 3
    if p[1] == 'i' then
      start = p[2] + 0
    else
      f = 4
      local from, step, stop = p[3] + 0, 1, argc - 1
      if from < 0 then from, step, stop = argc + from, -1, 1 end
      for i = from, stop, step do
        if string.upper(tostring(args[i + 1])) == p[2] then start = i + 1 break end
      end
      if not start then return end
    end
    if p[f] == 'r' then
      local last, step, limit = p[f + 1] + 0, p[f + 2] + 0, p[f + 3] + 0
      if last >= 0 then last = start + last
      elseif limit > 1 then last = start + math.floor((argc - start) / limit) - 1
      else last = argc + last end
      for i = start, last, step do each(args[i + 1]) end
    else
      local count = tonumber(args[start + p[f + 1] + 1]) or 0
      local first, step = start + p[f + 2], p[f + 3] + 0
      for i = 0, count - 1 do each(args[first + i * step + 1]) end
    end
  end
  local function check(...)
    local args = { ... }
    local name = string.upper(tostring(args[1]))
    local spec = spec_of(name)
    if spec == 'c' then
      name = name .. '|' .. string.upper(tostring(args[2]))
      spec = spec_of(name)
    end
    if spec == 'db' then
      refuse('cannot run ' .. name .. ', which needs the whole database')
    end
    if not spec or spec == '' then return end
    for one in string.gmatch(spec, '[^/]+') do
      if one ~= 'u' then
        keys_of(args, one, function(key)
          if key ~= nil and not declared[tostring(key)] then
            refuse('may only touch keys given in KEYS; ' .. name .. ' touched ' .. tostring(key))
          end
        end)
      end
    end
  end
  local guarded = setmetatable({}, { __index = real })
  guarded.call = function(...) check(...) return real.call(...) end
  guarded.pcall = function(...)
    local ok, e = pcall(check, ...)
    if not ok then
      if type(e) == 'table' then return e end
      return { err = tostring(e) }
    end
    return real.pcall(...)
  end
  return guarded
end)(redis, KEYS);"#;
    let quoted = format!("{specs:?}");
    GUARD
        .replace("SPECS", &quoted)
        .split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
        + " "
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::Bulk(s.as_bytes().to_vec())
    }

    fn arr(items: Vec<Value>) -> Value {
        Value::Array(items)
    }

    fn command(name: &str, categories: &[&str], specs: Vec<Value>, subs: Vec<Value>) -> Value {
        arr(vec![
            bulk(name),
            Value::Int(-2),
            arr(vec![]),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
            arr(categories.iter().map(|c| bulk(c)).collect()),
            arr(vec![]),
            arr(specs),
            arr(subs),
        ])
    }

    fn spec(begin: Vec<Value>, find: Vec<Value>) -> Value {
        arr(vec![
            bulk("begin_search"),
            arr(begin),
            bulk("find_keys"),
            arr(find),
        ])
    }

    #[test]
    fn specs_encode_ranges_keynums_keywords_containers_and_whole_db() {
        let get = command(
            "get",
            &["@read"],
            vec![spec(
                vec![
                    bulk("type"),
                    bulk("index"),
                    bulk("spec"),
                    arr(vec![bulk("index"), Value::Int(1)]),
                ],
                vec![
                    bulk("type"),
                    bulk("range"),
                    bulk("spec"),
                    arr(vec![
                        bulk("lastkey"),
                        Value::Int(0),
                        bulk("keystep"),
                        Value::Int(1),
                        bulk("limit"),
                        Value::Int(0),
                    ]),
                ],
            )],
            vec![],
        );
        let eval = command(
            "eval",
            &["@scripting"],
            vec![spec(
                vec![
                    bulk("type"),
                    bulk("index"),
                    bulk("spec"),
                    arr(vec![bulk("index"), Value::Int(2)]),
                ],
                vec![
                    bulk("type"),
                    bulk("keynum"),
                    bulk("spec"),
                    arr(vec![
                        bulk("keynumidx"),
                        Value::Int(0),
                        bulk("firstkey"),
                        Value::Int(1),
                        bulk("keystep"),
                        Value::Int(1),
                    ]),
                ],
            )],
            vec![],
        );
        let xread = command(
            "xread",
            &["@read"],
            vec![spec(
                vec![
                    bulk("type"),
                    bulk("keyword"),
                    bulk("spec"),
                    arr(vec![
                        bulk("keyword"),
                        bulk("STREAMS"),
                        bulk("startfrom"),
                        Value::Int(1),
                    ]),
                ],
                vec![
                    bulk("type"),
                    bulk("range"),
                    bulk("spec"),
                    arr(vec![
                        bulk("lastkey"),
                        Value::Int(-1),
                        bulk("keystep"),
                        Value::Int(1),
                        bulk("limit"),
                        Value::Int(2),
                    ]),
                ],
            )],
            vec![],
        );
        let object = command(
            "object",
            &[],
            vec![],
            vec![command("object|help", &["@keyspace"], vec![], vec![])],
        );
        let flushdb = command("flushdb", &["@keyspace", "@write"], vec![], vec![]);
        let time = command("time", &["@fast"], vec![], vec![]);
        let encoded = encode(&arr(vec![get, eval, xread, object, flushdb, time]));
        assert_eq!(
            encoded,
            ";GET=i:1:r:0:1:0;EVAL=i:2:n:0:1:1;XREAD=k:STREAMS:1:r:-1:1:2;OBJECT=c;OBJECT|HELP=;FLUSHDB=db;TIME=;"
        );
        assert!(
            !guard(&encoded).contains('\n'),
            "one line keeps line numbers"
        );
    }
}
