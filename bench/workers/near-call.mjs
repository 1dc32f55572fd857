// Part 10's floor: what one call to the near Redis costs a worker. Each
// request makes one REST call (PING) to NEAR_URL, then is forwarded as the
// passthrough forwards it; its latency less the passthrough's is the near
// round trip as a worker pays it, workerd's own subrequest included.
import { forward } from "./passthrough.mjs";

export default {
  async fetch(request, env) {
    const ping = await fetch(env.NEAR_URL, {
      method: "POST",
      headers: { authorization: `Bearer ${env.UPSTASH_REDIS_REST_TOKEN}` },
      body: '["PING"]',
    });
    await ping.text();
    return forward(request, env.ORIGIN_URL);
  },
};
