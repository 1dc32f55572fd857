// Comparison (c): the same job as edge-limiter, written the way the
// @upstash/ratelimit README shows it, against the same REST endpoint.
//
// Rules come from the PEER_RULES var: [{prefix, limit, window}], the first
// whose prefix starts the path applies (edge-limiter decides every matching
// rule in one call; here each request matches one rule, so the two agree).
// Each rule is a sliding window keyed on CF-Connecting-IP.
import { Ratelimit } from "@upstash/ratelimit";
import { Redis } from "@upstash/redis/cloudflare";

import { forward } from "./passthrough.mjs";

// Module scope, as the README advises: the ephemeral cache of denied clients
// lives as long as the isolate, which is what spares a denied client's
// repeats a Redis call.
let rules;

function load(env) {
  const redis = new Redis({
    url: env.UPSTASH_REDIS_REST_URL,
    token: env.UPSTASH_REDIS_REST_TOKEN,
    // Telemetry only adds headers; off keeps the requests the same size as ours.
    enableTelemetry: false,
  });
  return JSON.parse(env.PEER_RULES).map((rule, i) => ({
    prefix: rule.prefix,
    limiter: new Ratelimit({
      redis,
      limiter: Ratelimit.slidingWindow(rule.limit, rule.window),
      // One prefix per rule, so that two rules never share a counter.
      prefix: `peer:${i}`,
      analytics: false,
      enableProtection: false,
    }),
  }));
}

export default {
  async fetch(request, env, ctx) {
    rules ??= load(env);
    const url = new URL(request.url);
    const rule = rules.find((r) => url.pathname.startsWith(r.prefix));
    if (!rule) {
      return forward(request, env.ORIGIN_URL);
    }
    const ip = request.headers.get("cf-connecting-ip") ?? "anonymous";
    const { success, limit, remaining, reset, pending } = await rule.limiter.limit(ip);
    ctx.waitUntil(pending);
    const resetSeconds = Math.max(0, Math.ceil((reset - Date.now()) / 1000));
    const headers = {
      "X-RateLimit-Limit": String(limit),
      "X-RateLimit-Remaining": String(remaining),
      "X-RateLimit-Reset": String(resetSeconds),
    };
    if (!success) {
      return Response.json(
        { type: "about:blank", title: "Too Many Requests", status: 429 },
        { status: 429, headers: { ...headers, "Retry-After": String(resetSeconds) } },
      );
    }
    const response = await forward(request, env.ORIGIN_URL);
    // A fetched response's headers are immutable: copy, then add ours.
    const limited = new Response(response.body, response);
    for (const [name, value] of Object.entries(headers)) {
      limited.headers.set(name, value);
    }
    return limited;
  },
};
