// Baseline (a): forwards every request to the origin and limits nothing, so
// that the limiters' overhead is what they add on top of this.

export default {
  async fetch(request, env) {
    return forward(request, env.ORIGIN_URL);
  },
};

/** Sends `request` to `origin`, keeping method, path, query, headers and body. */
export function forward(request, origin) {
  const url = new URL(request.url);
  return fetch(origin + url.pathname + url.search, {
    method: request.method,
    headers: request.headers,
    body: request.body,
  });
}
