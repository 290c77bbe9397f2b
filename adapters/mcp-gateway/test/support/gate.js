// A gate for the tests: an HTTP server in the test's process whose requests wait until
// the test opens their gate.  The upstream test server passes one after making its effect
// (GATE_URL), so that a test holds the upstream's answer -- the effect happened, nobody
// has heard of it yet -- while it kills a client, then lets the answer go.
//
//   const gate = await startGate();
//   await gate.arrived('pay');   a request for the gate "pay" is waiting
//   gate.open('pay');            it is answered, and so are later ones
import http from 'node:http';

export async function startGate() {
  /** @type {Map<string, Array<() => void>>} */
  const waiting = new Map();
  /** @type {Map<string, Array<() => void>>} */
  const arrivals = new Map();
  const opened = new Set();
  const server = http.createServer((req, res) => {
    const name = (req.url ?? '/').replace(/^\//, '');
    const answer = () => { res.writeHead(200).end('open'); };
    for (const wake of arrivals.get(name)?.splice(0) ?? []) wake();
    if (opened.has(name)) { answer(); return; }
    if (!waiting.has(name)) waiting.set(name, []);
    waiting.get(name).push(answer);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    /** Resolves once a request waits at the gate `name` (or has passed it). */
    arrived(name) {
      if ((waiting.get(name)?.length ?? 0) > 0) return Promise.resolve();
      return new Promise((resolve) => {
        if (!arrivals.has(name)) arrivals.set(name, []);
        arrivals.get(name).push(resolve);
      });
    },
    open(name) {
      opened.add(name);
      for (const answer of waiting.get(name)?.splice(0) ?? []) answer();
    },
    close() {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(resolve));
    },
  };
}
