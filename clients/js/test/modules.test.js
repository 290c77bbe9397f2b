// Tests of the client's shape, without a database: its modules import only
// downwards (no cycle, each reached from an entry point of the package: index.js, and
// every module package.json's "exports" names), and its
// errors are named as the Python client's exceptions
// (clients/python/durable_ledger/errors.py), the names of 1.2 kept as the same
// classes.
//
//   node --test test/modules.test.js
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import * as api from '../src/index.js';

const src = fileURLToPath(new URL('../src/', import.meta.url));
const pythonErrors = fileURLToPath(new URL('../../python/durable_ledger/errors.py', import.meta.url));

/** The modules of src/ each module imports (or re-exports from) at run time. */
function importGraph() {
  /** @type {Map<string, string[]>} */
  const graph = new Map();
  for (const file of readdirSync(src).filter((f) => f.endsWith('.js'))) {
    const text = readFileSync(`${src}${file}`, 'utf8');
    const deps = [...text.matchAll(/^(?:import|export)\s[^;]*?\sfrom\s+'\.\/([^']+)'/gms)].map((m) => m[1]);
    graph.set(file, deps);
  }
  return graph;
}

/** The modules of src/ the package's "exports" name (index.js first): its entry points. */
function entryPoints() {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'));
  const targets = Object.values(pkg.exports ?? {}).map((e) => (typeof e === 'string' ? e : e.default));
  const entries = targets.filter((t) => t?.startsWith('./src/')).map((t) => t.slice('./src/'.length));
  assert.equal(entries[0], 'index.js', 'the package\'s main entry point is src/index.js');
  return entries;
}

test('src/: no module imports one that imports it back, and the entry points reach every module', () => {
  const graph = importGraph();
  const state = new Map();
  const visit = (file, path) => {
    assert.ok(graph.has(file), `${path.at(-1)} imports ./${file}, which is not in src/`);
    assert.notEqual(state.get(file), 'open', `an import cycle: ${[...path, file].join(' -> ')}`);
    if (state.get(file) === 'done') return;
    state.set(file, 'open');
    for (const dep of graph.get(file)) visit(dep, [...path, file]);
    state.set(file, 'done');
  };
  for (const entry of entryPoints()) visit(entry, []);
  // types.js holds only types: index.js reaches it through its JSDoc
  const unreached = [...graph.keys()].filter((f) => !state.has(f) && f !== 'types.js');
  assert.deepEqual(unreached, [], 'every module of src/ is part of the package');
  for (const file of graph.keys()) visit(file, []);
});

// What the clients throw differs here, not only the name (src/errors.js says how).
const PYTHON_ONLY = ['AttemptStopped', 'OutcomeNotRecorded', 'LedgerUsageError'];
const JS_ONLY = ['RunStopped'];
const DEPRECATED = {
  DivergencePausedError: 'DivergencePaused',
  RunAbandonedError: 'RunAbandoned',
  ToolRefusedError: 'ToolRefused',
  LeaseLostError: 'LeaseLost',
};

test("the errors are named as the Python client's exceptions; the names of 1.2 are the same classes",
  { skip: existsSync(pythonErrors) ? false : 'clients/python is not next to clients/js' }, () => {
    const text = readFileSync(pythonErrors, 'utf8');
    const list = text.match(/^__all__ = \[([^\]]*)\]/m);
    assert.ok(list, 'errors.py has an __all__ list');
    const python = [...list[1].matchAll(/"(\w+)"/g)].map((m) => m[1]).sort();
    const errors = Object.entries(api)
      .filter(([name, value]) => typeof value === 'function' && value.prototype instanceof Error && !(name in DEPRECATED))
      .map(([name]) => name)
      .sort();
    assert.deepEqual(errors.filter((n) => !JS_ONLY.includes(n)), python.filter((n) => !PYTHON_ONLY.includes(n)));
    for (const name of errors) {
      if (name === 'EffectDidNotHappen') continue; // made by your code, not the client
      assert.ok(api[name].prototype instanceof api.LedgerError || name === 'LedgerError', `${name} is a LedgerError`);
    }
    for (const [old, name] of Object.entries(DEPRECATED)) {
      assert.equal(api[old], api[name], `${old} is ${name} itself`);
    }
    // an error's name is its class's
    const paused = new api.DivergencePaused('m', { key: 'k', run: 'r', tool: 't' });
    assert.equal(paused.name, 'DivergencePaused');
    assert.ok(paused instanceof api.DivergencePausedError && paused instanceof api.EffectPaused);
    assert.equal(new api.RunAbandonedError('m', { run: 'r' }).name, 'RunAbandoned');
    assert.equal(new api.ToolRefused('m', { run: 'r', tool: 't' }).name, 'ToolRefused');
    const lost = new api.PoolerDetected('m', { run: 'r', epoch: 1, pid: 1, reachedPid: 2 });
    assert.ok(lost instanceof api.LeaseLost && lost instanceof api.LeaseLostError);
    assert.equal(new api.LeaseLost('m', { run: 'r', epoch: 1 }).name, 'LeaseLost');
  });
