// Conformance of the local endpoint (`upstash-local`) with the official @upstash/redis
// client: if this passes, code written against hosted Upstash runs against it unchanged.
//
// Spawns its own redis-server and endpoint. The endpoint binary comes from
// $UPSTASH_LOCAL_BIN, else ${CARGO_TARGET_DIR:-target}/debug/upstash-local; build it first
// with `cargo build -p edge-limiter-local --bin upstash-local`.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";

import { Redis } from "@upstash/redis";

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const binary =
  process.env.UPSTASH_LOCAL_BIN ??
  path.join(path.resolve(repoRoot, process.env.CARGO_TARGET_DIR ?? "target"), "debug", "upstash-local");
const TOKEN = "node-test-token";
const STARTUP_MS = 10_000;

const children = [];
// A crashed test run must not leave servers behind either.
process.on("exit", () => children.forEach((c) => c.kill("SIGKILL")));

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

// One RESP command on a fresh connection; resolves with the raw reply text, enough for
// the simple replies this file needs.
function redisRaw(port, args) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1");
    const wire = [`*${args.length}`, ...args.flatMap((a) => [`$${Buffer.byteLength(a)}`, a])];
    socket.once("error", reject);
    socket.once("connect", () => socket.write(wire.join("\r\n") + "\r\n"));
    socket.once("data", (data) => {
      socket.destroy();
      resolve(data.toString());
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function startRedis() {
  let lastError;
  // The probed port can be taken again before redis-server binds it: try another.
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = await freePort();
    const child = spawn(
      "redis-server",
      ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
      { stdio: "ignore" },
    );
    children.push(child);
    let exited = false;
    child.once("exit", () => (exited = true));
    const deadline = Date.now() + STARTUP_MS;
    while (!exited && Date.now() < deadline) {
      // The pid check tells our server from another one that already held the port.
      const info = await redisRaw(port, ["INFO", "server"]).catch(() => "");
      if (info.includes(`process_id:${child.pid}\r\n`)) return { port, child };
      await sleep(20);
    }
    child.kill("SIGKILL");
    lastError = new Error(`redis-server on port ${port} did not come up`);
  }
  throw lastError;
}

function startEndpoint(redisPort) {
  assert.ok(existsSync(binary), `${binary} is missing: run cargo build -p edge-limiter-local first`);
  const child = spawn(
    binary,
    ["--listen", "127.0.0.1:0", "--redis", `127.0.0.1:${redisPort}`, "--token", TOKEN],
    { stdio: ["ignore", "pipe", "inherit"] },
  );
  children.push(child);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("endpoint printed no listening line")), STARTUP_MS);
    let seen = "";
    child.stdout.on("data", (chunk) => {
      seen += chunk;
      const match = /^listening on (http:\/\/\S+)\n/.exec(seen);
      if (match) {
        clearTimeout(timer);
        resolve({ url: match[1], child });
      }
    });
    child.once("exit", (code) => reject(new Error(`endpoint exited early with ${code}`)));
  });
}

const sha1 = (s) => createHash("sha1").update(s, "utf8").digest("hex");

let redisPort;
let url;

before(async () => {
  ({ port: redisPort } = await startRedis());
  ({ url } = await startEndpoint(redisPort));
});

after(() => {
  for (const child of children) child.kill("SIGKILL");
});

// Every test runs with the client's default base64 responses and without them, and with
// and without auto-pipelining (which turns single commands into /pipeline requests).
const variants = [
  { name: "base64, auto-pipelined", options: {} },
  { name: "base64, one request per command", options: { enableAutoPipelining: false } },
  { name: "plain JSON, auto-pipelined", options: { responseEncoding: false } },
  { name: "plain JSON, one request per command", options: { responseEncoding: false, enableAutoPipelining: false } },
];

function client(options, token = TOKEN) {
  return new Redis({
    url,
    token,
    automaticDeserialization: false,
    enableTelemetry: false,
    retry: false,
    ...options,
  });
}

const tricky = [
  "plain",
  "emoji 😀👍🏽 and 漢字",
  "nul \u0000 ctrl \u0001\u001f del \u007f",
  "latin1 \u00e9\u00ff and replacement \ufffd",
  'quotes " \' \\ and newline\r\n',
  "OK",
  "dGVzdA==",
  "",
];

for (const { name, options } of variants) {
  describe(name, () => {
    const tag = name.replace(/\W+/g, "-");

    test("SET then GET", async () => {
      const redis = client(options);
      assert.equal(await redis.set(`${tag}:k`, "v"), "OK");
      assert.equal(await redis.get(`${tag}:k`), "v");
      assert.equal(await redis.get(`${tag}:missing`), null);
      assert.equal(await redis.incr(`${tag}:n`), 1);
    });

    test("emoji and binary-ish strings round-trip as keys, values and array items", async () => {
      const redis = client(options);
      for (const [i, value] of tricky.entries()) {
        const key = `${tag}:${value}:${i}`;
        assert.equal(await redis.set(key, value), "OK");
        assert.equal(await redis.get(key), value, JSON.stringify(value));
      }
      const list = `${tag}:list`;
      await redis.rpush(list, ...tricky);
      assert.deepEqual(await redis.lrange(list, 0, -1), tricky);
    });

    test("pipeline with an unknown EVALSHA: that entry errors, the others succeed", async () => {
      const redis = client(options);
      const unknown = "0".repeat(40);
      const build = () =>
        redis.pipeline().set(`${tag}:p`, "1").evalsha(unknown, [], []).incr(`${tag}:p`).get(`${tag}:p`);
      const results = await build().exec({ keepErrors: true });
      assert.equal(results[0].result, "OK");
      assert.equal(results[1].error, "NOSCRIPT No matching script. Please use EVAL.");
      assert.equal(results[2].result, 2);
      assert.equal(results[3].result, "2");
      await assert.rejects(build().exec(), /Command 2 \[ evalsha \] failed: NOSCRIPT/);
    });

    test("eval then evalsha, with and without the allow-key-locking shebang", async () => {
      const redis = client(options);
      const scripts = [
        "return {KEYS[1], ARGV[1], 7}",
        "#!lua flags=allow-key-locking\nreturn {KEYS[1], ARGV[1], 7}",
        "#!lua flags=no-writes,allow-key-locking\nreturn {KEYS[1], ARGV[1], 7}",
      ];
      for (const source of scripts) {
        const expected = [`${tag}:key`, "arg 😀", 7];
        assert.deepEqual(await redis.eval(source, [`${tag}:key`], ["arg 😀"]), expected);
        assert.deepEqual(await redis.evalsha(sha1(source), [`${tag}:key`], ["arg 😀"]), expected);
        assert.deepEqual(await redis.scriptExists(sha1(source)), [1]);
      }
    });

    test("allow-key-locking holds scripts to KEYS and refuses database-wide commands, as Upstash does", async () => {
      const redis = client(options);
      const flagged = (body) => `#!lua flags=allow-key-locking\n${body}`;
      const declared = [`${tag}:mine`];
      // Within the rule: every key it touches is in KEYS.
      assert.equal(
        await redis.eval(flagged("redis.call('SET', KEYS[1], ARGV[1])\nreturn redis.call('GET', KEYS[1])"), declared, ["v"]),
        "v",
      );
      // A write, a read or a multi-key command naming a key outside KEYS.
      for (const body of [
        `return redis.call('SET', '${tag}:undeclared', 1)`,
        `return redis.call('GET', '${tag}:undeclared')`,
        `return redis.call('MSET', KEYS[1], 1, '${tag}:undeclared', 2)`,
        `return redis.call('ZUNIONSTORE', KEYS[1], 2, KEYS[1], '${tag}:undeclared')`,
      ]) {
        await assert.rejects(redis.eval(flagged(body), declared, []), /may only touch keys given in KEYS/, body);
      }
      assert.equal(await redis.get(`${tag}:undeclared`), null, "nothing was written");
      // Commands that need the whole database.
      for (const command of ["FLUSHDB", "FLUSHALL", "KEYS', '*", "SCAN', '0", "RANDOMKEY", "DBSIZE"]) {
        await assert.rejects(
          redis.eval(flagged(`return redis.call('${command}')`), declared, []),
          /needs the whole database/,
          command,
        );
      }
      assert.equal(await redis.get(`${tag}:mine`), "v", "FLUSHDB did not run");
      // Without the flag, stock Redis's rules apply, as on Upstash.
      assert.equal(await redis.eval(`return redis.call('SET', '${tag}:free', 1)`, [], []), "OK");
    });

    test("Script.exec falls back to EVAL after SCRIPT FLUSH", async () => {
      const redis = client(options);
      const source = `#!lua flags=allow-key-locking\nreturn redis.call('INCR', KEYS[1]) -- ${tag}`;
      const script = redis.createScript(source);
      assert.equal(await script.exec([`${tag}:s`], []), 1);
      assert.equal(await script.evalsha([`${tag}:s`], []), 2);
      assert.equal(await redisRaw(redisPort, ["SCRIPT", "FLUSH"]), "+OK\r\n");
      await assert.rejects(script.evalsha([`${tag}:s`], []), /NOSCRIPT No matching script\. Please use EVAL\./);
      assert.equal(await script.exec([`${tag}:s`], []), 3);
      assert.equal(await script.evalsha([`${tag}:s`], []), 4);
    });

    test("SCRIPT LOAD returns the SHA1 of the source as sent", async () => {
      const redis = client(options);
      const source = `#!lua flags=allow-key-locking\nreturn 'loaded ${tag}'`;
      assert.equal(await redis.scriptLoad(source), sha1(source));
      assert.equal(await redis.evalsha(sha1(source), [], []), `loaded ${tag}`);
    });

    test("multi() runs atomically and returns every result", async () => {
      const redis = client(options);
      const results = await redis.multi().incr(`${tag}:m`).set(`${tag}:mv`, "😀").get(`${tag}:mv`).incr(`${tag}:m`).exec();
      assert.deepEqual(results, [1, "OK", "😀", 2]);
      await redis.set(`${tag}:str`, "x");
      await assert.rejects(
        redis.multi().incr(`${tag}:str`).exec(),
        /ERR value is not an integer or out of range/,
      );
    });

    test("wrong token is rejected with WRONGPASS", async () => {
      await assert.rejects(client(options, "wrong-token").get("k"), /WRONGPASS invalid or missing auth token/);
    });
  });
}

test("the endpoint itself base64-encodes when asked, and sends a sync token", async () => {
  await client({}).set("raw:k", "bar");
  const request = (headers) =>
    fetch(`${url}/`, {
      method: "POST",
      headers: { authorization: `Bearer ${TOKEN}`, ...headers },
      body: JSON.stringify(["GET", "raw:k"]),
    });
  const encoded = await request({ "Upstash-Encoding": "base64" });
  assert.equal(encoded.status, 200);
  assert.match(encoded.headers.get("upstash-sync-token") ?? "", /^\d+$/);
  assert.deepEqual(await encoded.json(), { result: "YmFy" });
  assert.deepEqual(await (await request({})).json(), { result: "bar" });
  const unauthorized = await fetch(`${url}/`, { method: "POST", body: '["PING"]' });
  assert.equal(unauthorized.status, 401);
});
