// Prints, as JSON, the Lua scripts @upstash/ratelimit runs and the exact
// KEYS and ARGV it sends them, read at run time from the installed package
// (its scripts are never copied into this repository).
//
// Usage: node peer-scripts.mjs '{"label": ["slidingWindow", 10, "10 s"], ...}'
// Each entry names a Ratelimit factory and its arguments; the output has one
// {label, source, sha1, keys, args} per entry.
import { Ratelimit } from "@upstash/ratelimit";

// Stands in for @upstash/redis: it answers EVALSHA with NOSCRIPT, so that the
// library falls back to EVAL and hands over the script's full source. Nothing
// else is called with analytics and protection off.
class Recorder {
  calls = [];

  async evalsha(sha1, keys, args) {
    this.calls.push({ sha1, keys, args });
    throw new Error("NOSCRIPT No matching script. Please use EVAL.");
  }

  async eval(source, keys, args) {
    Object.assign(this.calls.at(-1), { source, evalKeys: keys, evalArgs: args });
    // Enough for every algorithm's reply destructuring; the value is unused.
    return [0, 0, 0];
  }
}

const wanted = JSON.parse(process.argv[2]);
const out = [];
for (const [label, [factory, ...params]] of Object.entries(wanted)) {
  const redis = new Recorder();
  const limiter = new Ratelimit({
    redis,
    limiter: Ratelimit[factory](...params),
    analytics: false,
    enableProtection: false,
    ephemeralCache: false,
  });
  await limiter.limit("bench-hot");
  if (redis.calls.length !== 1 || !redis.calls[0].source) {
    throw new Error(`${factory}: expected one EVALSHA then one EVAL, saw ${JSON.stringify(redis.calls)}`);
  }
  const { sha1, keys, args, source } = redis.calls[0];
  out.push({ label, source, sha1, keys: keys.map(String), args: args.map(String) });
}
process.stdout.write(JSON.stringify(out));
