// A downstream system for the adapters' tests: an HTTP server on 127.0.0.1
// that keeps every request it is sent -- each one an external effect, a
// payment or an e-mail -- so that a test counts what really happened, in the
// test's own process, across a worker's SIGKILL.  Like a real provider it can
// be asked what it did under an idempotency key (what a person checks before
// resolving a paused effect); unlike one it never deduplicates: a second
// request with the same key is a second effect, and the tests catch it.
//
//   const effects = await startEffectsServer();
//   POST `${effects.url}/pay` (JSON body; header idempotency-key) -> {id, op, key, body}
//   effects.calls('pay')          every request of that operation, in order
//   effects.hold('pay')           the next such request is kept (the effect happened)
//                                 and never answered: resolves when it has arrived
//   effects.lookup(key)           the requests made under an idempotency key
//   await effects.close()
import http from 'node:http';

/**
 * @typedef {object} EffectCall
 * @property {string} id  the provider's id of the effect ("pay-1")
 * @property {string} op  the operation (the request's path, "pay")
 * @property {string|null} key  the idempotency key the request carried
 * @property {unknown} body  its JSON body
 */

/** @returns {Promise<{url: string, calls: (op?: string) => EffectCall[], lookup: (key: string) => EffectCall[], hold: (op: string) => Promise<EffectCall>, close: () => Promise<void>}>} */
export async function startEffectsServer() {
  /** @type {EffectCall[]} */
  const made = [];
  /** @type {Map<string, (call: EffectCall) => void>} */
  const holds = new Map();
  /** @type {Set<import('node:http').ServerResponse>} */
  const held = new Set();
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const op = (req.url ?? '/').replace(/^\//, '').replace(/\?.*$/, '');
      const text = Buffer.concat(chunks).toString('utf8');
      const key = /** @type {string|undefined} */ (req.headers['idempotency-key']) ?? null;
      const call = {
        id: `${op}-${made.filter((m) => m.op === op).length + 1}`,
        op, key, body: text ? JSON.parse(text) : null,
      };
      made.push(call);
      const hold = holds.get(op);
      if (hold) {
        holds.delete(op);
        held.add(res); // the effect happened; its answer never comes
        hold(call);
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(call));
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(undefined)));
  const { port } = /** @type {import('node:net').AddressInfo} */ (server.address());
  return {
    url: `http://127.0.0.1:${port}`,
    calls: (op) => made.filter((m) => op === undefined || m.op === op),
    lookup: (key) => made.filter((m) => m.key === key),
    hold: (op) => new Promise((resolve) => holds.set(op, resolve)),
    close: () => {
      for (const res of held) res.destroy();
      server.closeAllConnections();
      return new Promise((resolve) => server.close(() => resolve(undefined)));
    },
  };
}

/**
 * Makes an effect: POSTs `body` to the server's operation `op` with the idempotency key.
 * @param {string} url
 * @param {string} op
 * @param {unknown} body
 * @param {string} key
 * @returns {Promise<EffectCall>}
 */
export async function makeEffect(url, op, body, key) {
  const res = await fetch(`${url}/${op}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: JSON.stringify(body),
  });
  if (!res.ok) throw new Error(`${op}: HTTP ${res.status}`);
  return /** @type {Promise<EffectCall>} */ (res.json());
}
