// Where the worker's wasm goes: each function's body, raw and deflated on
// its own (a rough share of the gzip budget), summed per module path and
// listed largest first, with the data section and the embedded scripts.
// Reads a build made with its names: `KEEP_WASM_NAMES=1 scripts/build-worker`
// (then `scripts/build-worker` again for the stripped one).
// Usage: node scripts/wasm-sizes.mjs build/index_bg.wasm [ROWS]
import { leb as readLeb } from "./wasm-leb.mjs";
import { readFileSync } from "node:fs";
import { deflateRawSync } from "node:zlib";

const wasm = readFileSync(process.argv[2]);
const rows = Number(process.argv[3] ?? 30);

const leb = (at) => readLeb(wasm, at);

// An import's kind decides how much follows its two names.
function skipImport(at) {
  for (let i = 0; i < 2; i++) {
    const [length, from] = leb(at);
    at = from + length;
  }
  const kind = wasm[at++];
  if (kind === 0) return [true, leb(at)[1]];
  if (kind === 1) at++; // a table's element type, then its limits
  if (kind === 1 || kind === 2) {
    const flags = wasm[at++];
    at = leb(at)[1];
    if (flags & 1) at = leb(at)[1];
    return [false, at];
  }
  return [false, at + 2]; // a global: its type and mutability
}

let imported = 0;
let dataBytes = 0;
const bodies = [];
const names = new Map();
let at = 8;
while (at < wasm.length) {
  const id = wasm[at];
  const [size, start] = leb(at + 1);
  const end = start + size;
  let [count, next] = id === 2 || id === 10 ? leb(start) : [0, start];
  for (let i = 0; i < count; i++) {
    if (id === 2) {
      const [isFunction, after] = skipImport(next);
      if (isFunction) imported++;
      next = after;
    } else {
      const [length, body] = leb(next);
      bodies.push([imported + i, wasm.subarray(body, body + length)]);
      next = body + length;
    }
  }
  if (id === 11) dataBytes = size;
  if (id === 0) {
    const [length, name] = leb(start);
    if (wasm.subarray(name, name + length).toString() === "name") {
      let sub = name + length;
      while (sub < end) {
        const kind = wasm[sub];
        const [subSize, subStart] = leb(sub + 1);
        if (kind === 1) {
          let [n, p] = leb(subStart);
          for (let i = 0; i < n; i++) {
            const [index, q] = leb(p);
            const [nameLength, text] = leb(q);
            names.set(index, wasm.subarray(text, text + nameLength).toString());
            p = text + nameLength;
          }
        }
        sub = subStart + subSize;
      }
    }
  }
  at = end;
}

// Legacy Rust mangling (_ZN 3foo 3bar 17h... E) back to foo::bar.
function demangle(name) {
  const body = /^_ZN(.*)E$/.exec(name);
  if (!body) return name;
  const parts = [];
  let s = body[1];
  while (/^\d/.test(s)) {
    const digits = /^\d+/.exec(s)[0];
    parts.push(s.slice(digits.length, digits.length + Number(digits)));
    s = s.slice(digits.length + Number(digits));
  }
  return parts
    .filter((p) => !/^h[0-9a-f]{16}$/.test(p))
    .join("::")
    .replaceAll("$LT$", "<")
    .replaceAll("$GT$", ">")
    .replaceAll("$u20$", " ")
    .replaceAll("$C$", ",")
    .replaceAll("..", "::");
}

if (names.size === 0) {
  console.error("no name section: build with KEEP_WASM_NAMES=1 scripts/build-worker");
  process.exit(1);
}
const byModule = new Map();
const functions = [];
for (const [index, body] of bodies) {
  const name = demangle(names.get(index) ?? `#${index}`)
    .replace(/\[[0-9a-f]+\]/g, "")
    .replace(/::h[0-9a-f]{16}$/, "");
  const deflated = deflateRawSync(body, { level: 9 }).length;
  functions.push([body.length, deflated, name]);
  const path = name.replace(/^<+/, "").split("::");
  const key = path[0] === "edge_limiter" ? path.slice(0, 3).join("::") : path[0];
  const [raw, small] = byModule.get(key) ?? [0, 0];
  byModule.set(key, [raw + body.length, small + deflated]);
}
const code = functions.reduce((sum, [raw]) => sum + raw, 0);
console.log(`code ${code} bytes in ${functions.length} functions; data ${dataBytes} bytes`);
console.log("\nper module: raw, deflated alone");
for (const [key, [raw, small]] of [...byModule].sort((a, b) => b[1][1] - a[1][1]).slice(0, rows)) {
  console.log(`${String(raw).padStart(8)} ${String(small).padStart(7)}  ${key}`);
}
console.log("\nlargest functions: raw, deflated alone");
for (const [raw, small, name] of functions.sort((a, b) => b[1] - a[1]).slice(0, rows)) {
  console.log(`${String(raw).padStart(8)} ${String(small).padStart(7)}  ${name.slice(0, 140)}`);
}
