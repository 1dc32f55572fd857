// Times `new WebAssembly.Instance` of edge-limiter's wasm inside workerd, the
// runtime that pays it when an isolate starts. The bench copies this file
// next to a copy of build/index_bg.wasm. GET /?n=N instantiates N times and
// answers {n, ms}; workerd's clock is coarse (1 ms), so N should be large.
//
// Imports are stubs: instantiation links them without calling any, and no
// start function runs (wasm-bindgen's init is an export the shim calls later).
import limiter from "./index_bg.wasm";

function stubs(module) {
  const imports = {};
  for (const { module: from, name, kind } of WebAssembly.Module.imports(module)) {
    imports[from] ??= {};
    if (kind === "function") {
      imports[from][name] = () => {};
    } else if (kind === "tag") {
      imports[from][name] = WebAssembly.JSTag;
    } else {
      throw new Error(`no stub for import ${from}.${name} (${kind})`);
    }
  }
  return imports;
}

export default {
  async fetch(request) {
    const n = Number(new URL(request.url).searchParams.get("n") ?? 1);
    const imports = stubs(limiter);
    const start = performance.now();
    for (let i = 0; i < n; i++) {
      new WebAssembly.Instance(limiter, imports);
    }
    return Response.json({ n, ms: performance.now() - start });
  },
};
