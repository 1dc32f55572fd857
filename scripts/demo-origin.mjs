// A stand-in origin for local runs and tests: answers every request with a
// small page and counts what reached it, so tests can prove that denied
// requests never did. GET /__origin/hits returns the counts as JSON;
// /__origin/redirect answers 302 to /landed; `?status=401` (any 200-599)
// answers that status, to try rules that count only failed requests,
// `?delay=300` answers that many milliseconds late (at most 10 s), and
// `?hangup=1` closes the connection unanswered, so that the fetch fails. Every
// answer says how many body bytes arrived and their SHA-1
// (x-body-bytes, x-body-sha1), so tests can prove a body went through intact.
// Paths under /timed/ also keep each arrival's time (epoch ms, fractional):
// GET /__origin/arrivals?path=/timed/x returns them, for checks of what got
// through in every interval. `?drip=500` sends the headers at once and the
// body that many milliseconds later (at most 30 s), `?trickle=2000` sends a
// byte of body every 100 ms for that long (at most 30 s) after the
// headers, as a streamed answer does, `?header=Name:Value`
// (repeatable) adds that response header. Paths under /held/ count the
// requests the origin holds at once, from arrival to the response's end:
// GET /__origin/held?path=/held/x returns the most it ever held at once and
// how many it holds now, for checks of in-flight limits.
import { createHash } from "node:crypto";
import http from "node:http";

const port = Number(process.env.ORIGIN_PORT ?? process.argv[2] ?? 8081);
const hits = { total: 0, paths: {} };
const arrivals = {};
const held = {};

// Real origins behind a CDN take large headers; node's 16 KB default would
// answer 431 mid-request and leave the forwarding fetch racing a closed socket.
const server = http.createServer({ maxHeaderSize: 256 * 1024 }, (req, res) => {
  const path = req.url.split("?")[0];
  if (path === "/__origin/hits") {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(hits));
    return;
  }
  if (path === "/__origin/held") {
    const asked = new URL(req.url, "http://origin").searchParams.get("path") ?? "";
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(held[asked] ?? { most: 0, now: 0 }));
    return;
  }
  if (path === "/__origin/arrivals") {
    const asked = new URL(req.url, "http://origin").searchParams.get("path") ?? "";
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(arrivals[asked] ?? []));
    return;
  }
  hits.total += 1;
  hits.paths[path] = (hits.paths[path] ?? 0) + 1;
  if (path.startsWith("/timed/")) {
    (arrivals[path] ??= []).push(performance.timeOrigin + performance.now());
  }
  if (path.startsWith("/held/")) {
    const count = (held[path] ??= { most: 0, now: 0 });
    count.now += 1;
    count.most = Math.max(count.most, count.now);
    // The response's end, delivered or cut short: once either way.
    res.once("close", () => {
      count.now -= 1;
    });
  }
  let params;
  try {
    params = new URL(req.url, "http://origin").searchParams;
  } catch {
    // A target URL cannot parse (`//..%zz`) reaches real origins too: they
    // answer it, and so does this one, rather than exit.
    req.resume();
    res.writeHead(400, { "content-type": "text/plain", "x-demo-origin": "1" });
    res.end("bad request target\n");
    return;
  }
  if (params.get("hangup") === "1") {
    req.socket.destroy();
    return;
  }
  const asked = Number(params.get("status"));
  const status = Number.isInteger(asked) && asked >= 200 && asked <= 599 ? asked : 200;
  const delay = Math.min(Math.max(Number(params.get("delay")) || 0, 0), 10_000);
  const drip = Math.min(Math.max(Number(params.get("drip")) || 0, 0), 30_000);
  const trickle = Math.min(Math.max(Number(params.get("trickle")) || 0, 0), 30_000);
  const extra = {};
  for (const line of params.getAll("header")) {
    const colon = line.indexOf(":");
    if (colon > 0) {
      extra[line.slice(0, colon).trim()] = line.slice(colon + 1).trim();
    }
  }
  // Read the body through (keep-alive connections stay usable) into a hash.
  const sha = createHash("sha1");
  let bytes = 0;
  req.on("data", (chunk) => {
    bytes += chunk.length;
    sha.update(chunk);
  });
  req.on("end", () => setTimeout(() => {
    const body = { "x-body-bytes": String(bytes), "x-body-sha1": sha.digest("hex") };
    // A redirect, for tests that the limiter passes it on rather than following it.
    if (path === "/__origin/redirect") {
      res.writeHead(302, { location: "/landed", "x-demo-origin": "1", ...body });
      res.end();
      return;
    }
    res.writeHead(status, { "content-type": "text/plain", "x-demo-origin": "1", ...body, ...extra });
    const text = `hello from the demo origin: ${req.method} ${req.url} (${status})\n`;
    if (trickle > 0) {
      res.flushHeaders();
      const until = Date.now() + trickle;
      const beat = setInterval(() => {
        if (Date.now() >= until) {
          clearInterval(beat);
          res.end(text);
        } else {
          res.write(".");
        }
      }, 100);
      res.once("close", () => clearInterval(beat));
      return;
    }
    if (drip === 0) {
      res.end(text);
      return;
    }
    // The headers now, the body later: a response still in flight.
    res.flushHeaders();
    const timer = setTimeout(() => res.end(text), drip);
    res.once("close", () => clearTimeout(timer));
  }, delay));
});

server.listen(port, "127.0.0.1", () => {
  console.log(`listening on http://127.0.0.1:${server.address().port}`);
});
