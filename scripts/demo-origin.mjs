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
// through in every interval.
import { createHash } from "node:crypto";
import http from "node:http";

const port = Number(process.env.ORIGIN_PORT ?? process.argv[2] ?? 8081);
const hits = { total: 0, paths: {} };
const arrivals = {};

// Real origins behind a CDN take large headers; node's 16 KB default would
// answer 431 mid-request and leave the forwarding fetch racing a closed socket.
const server = http.createServer({ maxHeaderSize: 256 * 1024 }, (req, res) => {
  const path = req.url.split("?")[0];
  if (path === "/__origin/hits") {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(hits));
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
    res.writeHead(status, { "content-type": "text/plain", "x-demo-origin": "1", ...body });
    res.end(`hello from the demo origin: ${req.method} ${req.url} (${status})\n`);
  }, delay));
});

server.listen(port, "127.0.0.1", () => {
  console.log(`listening on http://127.0.0.1:${server.address().port}`);
});
