// Drops the wasm "name" custom section that worker-build keeps (function
// names for stack traces): it is about a sixth of the gzipped bundle, which
// has a size budget. The toolchain's producers and target features records
// go too: no runtime reads them. Usage: node scripts/strip-names.mjs FILE.wasm
import { leb as readLeb } from "./wasm-leb.mjs";
import { readFileSync, writeFileSync } from "node:fs";

const DROPPED = ["name", "producers", "target_features"];
const file = process.argv[2];
const wasm = readFileSync(file);

const leb = (at) => readLeb(wasm, at);

const kept = [wasm.subarray(0, 8)]; // magic and version
let at = 8;
while (at < wasm.length) {
  const id = wasm[at];
  const [size, body] = leb(at + 1);
  const end = body + size;
  let drop = false;
  if (id === 0) {
    const [nameLength, name] = leb(body);
    drop = DROPPED.includes(wasm.subarray(name, name + nameLength).toString());
  }
  if (!drop) kept.push(wasm.subarray(at, end));
  at = end;
}
writeFileSync(file, Buffer.concat(kept));
