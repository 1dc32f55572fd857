// Drives a headless Chromium through the DevTools protocol for the tests:
// the page at the debugging port's first tab, one command a line on stdin,
// one JSON line of answer on stdout each.
//
//   {"navigate": URL}   loads URL and answers once it has loaded
//   {"eval": EXPR}      evaluates EXPR in the page (promises awaited)
//   {"screenshot": PATH} writes the page as it looks to PATH (PNG)
//   {"viewport": [W, H]} shows the page at W x H CSS pixels (a phone's
//                        when W < 600) until told otherwise
//
// Usage: node cdp.mjs DEBUGGING_PORT
import fs from "node:fs";
import readline from "node:readline";
import WebSocket from "ws";

const port = process.argv[2];
const targets = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
const page = targets.find((t) => t.type === "page");
const ws = new WebSocket(page.webSocketDebuggerUrl);
await new Promise((resolve, reject) => {
  ws.on("open", resolve);
  ws.on("error", reject);
});

let last = 0;
const waiting = new Map();
const listeners = [];
ws.on("message", (data) => {
  const message = JSON.parse(data);
  if (message.id && waiting.has(message.id)) {
    const { resolve, reject } = waiting.get(message.id);
    waiting.delete(message.id);
    if (message.error) reject(new Error(JSON.stringify(message.error)));
    else resolve(message.result);
  } else if (message.method) {
    for (const l of listeners.splice(0)) l(message);
  }
});
const send = (method, params = {}) =>
  new Promise((resolve, reject) => {
    last += 1;
    waiting.set(last, { resolve, reject });
    ws.send(JSON.stringify({ id: last, method, params }));
  });
const event = (name) =>
  new Promise((resolve) => {
    const wait = (m) => (m.method === name ? resolve(m) : listeners.push(wait));
    listeners.push(wait);
  });

await send("Page.enable");
for await (const line of readline.createInterface({ input: process.stdin })) {
  const command = JSON.parse(line);
  try {
    if (command.navigate) {
      const loaded = event("Page.loadEventFired");
      await send("Page.navigate", { url: command.navigate });
      await loaded;
      console.log(JSON.stringify({ ok: true }));
    } else if (command.viewport) {
      const [width, height] = command.viewport;
      await send("Emulation.setDeviceMetricsOverride", { width, height, deviceScaleFactor: 1, mobile: width < 600 });
      console.log(JSON.stringify({ ok: true }));
    } else if (command.screenshot) {
      const shot = await send("Page.captureScreenshot", { format: "png", captureBeyondViewport: true });
      fs.writeFileSync(command.screenshot, Buffer.from(shot.data, "base64"));
      console.log(JSON.stringify({ ok: true }));
    } else {
      const r = await send("Runtime.evaluate", {
        expression: command.eval,
        returnByValue: true,
        awaitPromise: true,
      });
      console.log(JSON.stringify(r.exceptionDetails ? { error: r.exceptionDetails.text } : { ok: r.result.value }));
    }
  } catch (e) {
    console.log(JSON.stringify({ error: String(e) }));
  }
}
ws.close();
