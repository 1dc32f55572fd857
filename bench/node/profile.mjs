// Samples a worker's CPU in workerd through wrangler dev's inspector while
// load runs elsewhere, saves the profile (open it in Chrome DevTools'
// Performance panel) and prints where the busy time went.
//
// Usage: node profile.mjs WS_URL SECONDS OUT.cpuprofile
import fs from "node:fs";
import WebSocket from "ws";

const [url, seconds, out] = process.argv.slice(2);
if (!url || !seconds || !out) {
  console.error("usage: node profile.mjs WS_URL SECONDS OUT.cpuprofile");
  process.exit(2);
}

// Frames that are the runtime waiting or collecting, not the worker working.
const NOT_BUSY = new Set(["(idle)", "(program)", "(garbage collector)"]);

function connect(address) {
  const ws = new WebSocket(address);
  const waiting = new Map();
  let last = 0;
  ws.on("message", (data) => {
    const message = JSON.parse(data);
    const pending = waiting.get(message.id);
    if (!pending) return;
    waiting.delete(message.id);
    if (message.error) pending.reject(new Error(JSON.stringify(message.error)));
    else pending.resolve(message.result);
  });
  const send = (method, params = {}) =>
    new Promise((resolve, reject) => {
      last += 1;
      waiting.set(last, { resolve, reject });
      ws.send(JSON.stringify({ id: last, method, params }));
    });
  return new Promise((resolve, reject) => {
    ws.on("open", () => resolve({ send, close: () => ws.close() }));
    ws.on("error", reject);
  });
}

// A Rust frame's name without its hash, so that one function is one row.
const frameName = (node) =>
  (node.callFrame.functionName || "(anonymous JS)").replace(/::h[0-9a-f]{16}\b/, "");

// Each function's share of the busy samples, counting a sample once for
// every distinct function on its stack (inclusive time).
function inclusive(profile) {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const hits = new Map();
  for (const id of profile.samples) hits.set(id, (hits.get(id) ?? 0) + 1);
  const share = new Map();
  let busy = 0;
  for (const [id, count] of hits) {
    if (NOT_BUSY.has(frameName(byId.get(id)))) continue;
    busy += count;
    const seen = new Set();
    for (let at = id; at !== undefined; at = parent.get(at)) {
      const name = frameName(byId.get(at));
      if (seen.has(name)) continue;
      seen.add(name);
      share.set(name, (share.get(name) ?? 0) + count);
    }
  }
  return { busy, share };
}

const inspector = await connect(url);
await inspector.send("Profiler.enable");
await inspector.send("Profiler.setSamplingInterval", { interval: 100 });
await inspector.send("Profiler.start");
await new Promise((done) => setTimeout(done, Number(seconds) * 1000));
const { profile } = await inspector.send("Profiler.stop");
inspector.close();
fs.writeFileSync(out, JSON.stringify(profile));

const { busy, share } = inclusive(profile);
// The worker's own code, its REST client and the runtime's calls it makes,
// each with its callees: the rows overlap, they do not add up.
const interesting = /edge_limiter|reqwest|url::|serde_json|^fetch$|^console|log$/;
const rows = [...share.entries()]
  .filter(([name]) => interesting.test(name))
  .sort((a, b) => b[1] - a[1])
  .slice(0, 40);
console.log(`${busy} busy samples of ${profile.samples.length} (100 us apart); inclusive shares:`);
for (const [name, count] of rows) {
  console.log(`${((100 * count) / busy).toFixed(1).padStart(6)} %  ${name.slice(0, 140)}`);
}
