// Part 10's peer: @upstash/ratelimit's MultiRegionRatelimit over two Redis
// servers, the worker's near one first, as its README writes it. Each
// request is sent to both, the first answer decides, and the other region
// is brought up to date in the background (`pending`).
//
// NEAR_URL and FAR_URL name the two REST endpoints; PEER_LIMIT and
// PEER_WINDOW the sliding window. Paths under /timed/ are limited, keyed
// on CF-Connecting-IP; the rest pass through.
import { MultiRegionRatelimit } from "@upstash/ratelimit";
import { Redis } from "@upstash/redis/cloudflare";

import { forward } from "./passthrough.mjs";

let limiter;

function load(env) {
  const redis = (url) =>
    new Redis({ url, token: env.UPSTASH_REDIS_REST_TOKEN, enableTelemetry: false });
  return new MultiRegionRatelimit({
    redis: [redis(env.NEAR_URL), redis(env.FAR_URL)],
    limiter: MultiRegionRatelimit.slidingWindow(Number(env.PEER_LIMIT), env.PEER_WINDOW),
    prefix: "peer-regions",
    analytics: false,
  });
}

export default {
  async fetch(request, env, ctx) {
    limiter ??= load(env);
    const url = new URL(request.url);
    if (!url.pathname.startsWith("/timed/")) {
      return forward(request, env.ORIGIN_URL);
    }
    const ip = request.headers.get("cf-connecting-ip") ?? "anonymous";
    const { success, pending } = await limiter.limit(ip);
    ctx.waitUntil(pending);
    if (!success) {
      return Response.json(
        { type: "about:blank", title: "Too Many Requests", status: 429 },
        { status: 429 },
      );
    }
    return forward(request, env.ORIGIN_URL);
  },
};
