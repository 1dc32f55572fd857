// A stand-in origin for local runs and tests: answers every request with a
// small page and counts what reached it, so tests can prove that denied
// requests never did. GET /__origin/hits returns the counts as JSON;
// /__origin/redirect answers 302 to /landed.
import http from "node:http";

const port = Number(process.env.ORIGIN_PORT ?? process.argv[2] ?? 8081);
const hits = { total: 0, paths: {} };

// Real origins behind a CDN take large headers; node's 16 KB default would
// answer 431 mid-request and leave the forwarding fetch racing a closed socket.
const server = http.createServer({ maxHeaderSize: 256 * 1024 }, (req, res) => {
  const path = req.url.split("?")[0];
  if (path === "/__origin/hits") {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(hits));
    return;
  }
  hits.total += 1;
  hits.paths[path] = (hits.paths[path] ?? 0) + 1;
  // Drain the body so keep-alive connections stay usable.
  req.resume();
  req.on("end", () => {
    // A redirect, for tests that the limiter passes it on rather than following it.
    if (path === "/__origin/redirect") {
      res.writeHead(302, { location: "/landed", "x-demo-origin": "1" });
      res.end();
      return;
    }
    res.writeHead(200, { "content-type": "text/plain", "x-demo-origin": "1" });
    res.end(`hello from the demo origin: ${req.method} ${req.url}\n`);
  });
});

server.listen(port, "127.0.0.1", () => {
  console.log(`listening on http://127.0.0.1:${server.address().port}`);
});
