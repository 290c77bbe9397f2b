// What a review of the console found, each as a person's task against the
// real server (in this process) or in headless Chromium: one person's
// requests at once (two tabs, a double-click), keys and tools that a browser
// would rewrite in a form, numbers a double cannot hold, a server that asks
// for a password in clear text, a console behind a TLS proxy, guesses sent at
// once, an older ledger, a renamed role.  The ledger's tables are the judge.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import {
  env, waitFor, superuser, startConsole, launchBrowser, screenshot, login, submit, flash,
  roleUrl, encodedId, formFields, httpPerson,
} from './support.js';
import { parseTarget } from '../src/target.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const PW = {
  h_maria: 'h-maria-secret-1', h_ana: 'h-ana-secret-1', h_ines: 'h-ines-secret-1', h_worker: 'h-worker-secret-1',
};
let db;
let console1;
let browser;
// what node-postgres says when a client is given a query while it runs another
const overlapping = [];
const onWarning = (w) => {
  if (/already executing a query/.test(w.message)) overlapping.push(w.message);
};

before(async () => {
  process.on('warning', onWarning);
  db = await superuser();
  await db.query(`
    CREATE ROLE h_maria LOGIN PASSWORD '${PW.h_maria}';
    CREATE ROLE h_ana LOGIN PASSWORD '${PW.h_ana}';
    CREATE ROLE h_ines LOGIN PASSWORD '${PW.h_ines}';
    CREATE ROLE h_worker LOGIN PASSWORD '${PW.h_worker}';
    GRANT durable_ledger_admin TO h_maria;
    GRANT durable_ledger_approver TO h_ana;
    GRANT durable_ledger_auditor TO h_ines;
    GRANT durable_ledger_worker TO h_worker;`);
  console1 = await startConsole();
  browser = await launchBrowser();
});

after(async () => {
  process.off('warning', onWarning);
  await browser?.close();
  await console1?.app.close();
  await db?.end();
});

const effectRow = async (key) => (await db.query(
  `SELECT status, attempt, approval, approver, resolved_by, conflict,
          (SELECT count(*)::int FROM durable_ledger.audit_log a WHERE a.key = e.key AND a.event = 'resolved') AS resolutions
     FROM durable_ledger.effects e WHERE key = $1`, [key])).rows[0];

/**
 * A worker's call (begin_effect) that then disconnects: an executed call is
 * left unknown, a paused one waits.  `args` as an object, or as JSON text.
 */
async function call(run, tool, args, businessKey = null) {
  const client = new pg.Client({ connectionString: roleUrl('h_worker', PW.h_worker) });
  await client.connect();
  const { rows } = await client.query(
    'SELECT key, decision, attempt, status FROM durable_ledger.begin_effect($1, $2, $3, $4)',
    [run, tool, typeof args === 'string' ? args : JSON.stringify(args), businessKey]);
  const pid = (await client.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
  await client.end();
  await waitFor('the worker\'s backend to end', async () =>
    (await db.query('SELECT count(*) FROM pg_stat_activity WHERE pid = $1', [pid])).rows[0].count === '0');
  return rows[0];
}

async function approvalTool(tool, condition, keyFields = null) {
  await db.query('SELECT durable_ledger.register_tool($1, \'test\', key_fields => $2)', [tool, keyFields]);
  await db.query('SELECT durable_ledger.set_approval($1, $2, \'test\')', [tool, condition]);
}

async function browserLogin(user) {
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  const response = await login(page, console1.url, user, PW[user]);
  assert.equal(response.status(), 200, `${user} logged in`);
  return { context, page };
}

test('one person\'s double-submitted resolution is recorded once and kept (their requests use their connection one at a time)', async () => {
  const maria = await httpPerson(console1.url, 'h_maria', PW.h_maria);
  for (let i = 0; i < 6; i += 1) {
    const e = await call(`h-dbl-${i}`, 'h.pay', { invoice: `D-${i}`, amount: 10 });
    const page = await maria.get(`/effect?key=${encodeURIComponent(e.key)}`);
    const form = { ...formFields(page.text, 'resolve-form'), outcome: 'completed', result: '{"payment_id": 7}' };
    const [a, b] = await Promise.all([maria.act('resolve', form), maria.act('resolve', form)]);
    const row = await effectRow(e.key);
    assert.equal(row.status, 'completed', `double-submit ${i}: the resolution was kept (told "${a.said}" and "${b.said}")`);
    assert.equal(row.resolutions, 1, 'resolved once');
    const told = [a.said, b.said];
    assert.equal(told.filter((t) => /Effect resolved as completed \(attempt 1\)/.test(t)).length, 1, told.join(' | '));
    assert.equal(told.filter((t) => /SQLSTATE 55000/.test(t)).length, 1, 'the second was refused: decided already');
  }
  assert.deepEqual(overlapping, [], 'no query was given to the connection while it ran another');
});

test('another tab\'s failing read neither undoes a resolution nor logs the person out; a refused action neither', async () => {
  const maria = await httpPerson(console1.url, 'h_maria', PW.h_maria);
  for (let i = 0; i < 6; i += 1) {
    const e = await call(`h-read-${i}`, 'h.pay', { invoice: `R-${i}`, amount: 10 });
    const page = await maria.get(`/effect?key=${encodeURIComponent(e.key)}`);
    const form = { ...formFields(page.text, 'resolve-form'), outcome: 'completed', result: '{"payment_id": 8}' };
    // the other tab verifies the chain with heads that are not JSON (22P02)
    const [done, read] = await Promise.all([maria.act('resolve', form), maria.get('/audit?verify=1&heads=oops')]);
    assert.match(done.said, /Effect resolved as completed/, `try ${i}`);
    assert.equal((await effectRow(e.key)).status, 'completed', `try ${i}: what the person was told is what the ledger has`);
    assert.equal(read.status, 200);
    assert.match(read.text, /22P02/, 'the read shows its own error');
    assert.equal((await maria.get('/')).status, 200, 'still logged in');

    // a refused action (its JSON is not JSON) while the other tab loads a page
    const [refused, leases] = await Promise.all([
      maria.act('resolve', { ...form, result: '{not json' }), maria.get('/leases')]);
    assert.match(refused.said, /SQLSTATE 22P02/, `try ${i}`);
    assert.equal(leases.status, 200, 'the other tab\'s page is shown');
    assert.equal((await maria.get('/')).status, 200, 'still logged in');
  }
  assert.deepEqual(overlapping, [], 'no query was given to the connection while it ran another');
});

test('a stale approval page approves nothing while the same person approves another call at once', async () => {
  await approvalTool('h.credit', 'strict $.amount > 100', '{invoice}');
  const ana = await httpPerson(console1.url, 'h_ana', PW.h_ana);
  for (let i = 0; i < 4; i += 1) {
    const bk = `H-CREDIT-${i}`;
    const first = await call(`h-credit-${i}-1`, 'h.credit', { invoice: bk, amount: 150 }, bk);
    const legit = await call(`h-other-${i}`, 'h.credit', { invoice: `H-OTHER-${i}`, amount: 500 }, `H-OTHER-${i}`);
    // tab A: the page of attempt 1, left open
    const formA = formFields((await ana.get(`/effect?key=${encodeURIComponent(first.key)}`)).text, 'approve-form');
    assert.equal(formA.attempt, '1');
    // meanwhile: approved by someone else, executed, failed; attempt 2 asks for 99,999
    await db.query("SELECT durable_ledger.approve_effect($1, 'ops', 'agreed')", [first.key]);
    assert.equal((await call(`h-credit-${i}-1`, 'h.credit', { invoice: bk, amount: 150 }, bk)).decision, 'execute');
    await db.query(`SELECT durable_ledger.fail_effect($1, '{"code": "declined"}', 1)`, [first.key]);
    const second = await call(`h-credit-${i}-2`, 'h.credit', { invoice: bk, amount: 99999 }, bk);
    assert.deepEqual([second.decision, second.attempt], ['pause', 2]);
    // tab B: a call that waits, approved at the same moment
    const formB = formFields((await ana.get(`/effect?key=${encodeURIComponent(legit.key)}`)).text, 'approve-form');
    const [a, b] = i % 2 === 0
      ? await Promise.all([ana.act('approve', formA), ana.act('approve', formB)])
      : (await Promise.all([ana.act('approve', formB), ana.act('approve', formA)])).reverse();
    const rowA = await effectRow(first.key);
    const rowB = await effectRow(legit.key);
    assert.deepEqual([rowA.attempt, rowA.approval], [2, 'requested'], `trial ${i}: attempt 2 was not approved (tab A told "${a.said}")`);
    assert.match(a.said, /the page showed attempt 1 of this call; the ledger has attempt 2 now/);
    assert.equal(rowB.approval, 'approved', `trial ${i}: tab B was told "${b.said}"`);
    assert.match(b.said, /Approved attempt 1/);
  }
  assert.deepEqual(overlapping, [], 'no query was given to the connection while it ran another');
});

test('a key, a run or a tool that a browser would rewrite in a form (a line feed, two spaces) is decided exactly', async () => {
  await approvalTool('h.refund', 'strict $.amount > 10');
  const shown = 'H-REFUND\n1';      // what the approver reviews: 50
  const twin = 'H-REFUND\r\n1';     // a browser sends the line feed as CR LF: 99,999
  assert.equal((await call('h-refund-a', 'h.refund', { amount: 50, to: 'customer' }, shown)).key, shown);
  assert.equal((await call('h-refund-b', 'h.refund', { amount: 99999, to: 'someone' }, twin)).key, twin);
  const ana = await browserLogin('h_ana');
  try {
    await ana.page.goto(`${console1.url}/effect?key=${encodeURIComponent(shown)}`);
    await submit(ana.page, '#approve-form');
    assert.match(await flash(ana.page), /Approved attempt 1/);
  } finally {
    await ana.context.close();
  }
  assert.equal((await effectRow(shown)).approval, 'approved', 'the call the page showed was approved');
  assert.equal((await effectRow(twin)).approval, 'requested', 'its twin was not');

  // a resolution, and a lease broken from a run's page
  const payShown = 'H-PAY\n';
  const payTwin = 'H-PAY\r\n';
  await call('h-pay-a', 'h.pay', { invoice: 'P-1', amount: 1 }, payShown);
  await call('h-pay-b', 'h.pay', { invoice: 'P-2', amount: 2 }, payTwin);
  const held = [];
  for (const run of ['h-job\n', 'h-job\r\n']) {
    const w = new pg.Client({ connectionString: roleUrl('h_worker', PW.h_worker) });
    w.on('error', () => {});
    await w.connect();
    await w.query('SELECT durable_ledger.acquire_run($1)', [run]);
    held.push({ client: w, pid: (await w.query('SELECT pg_backend_pid() AS pid')).rows[0].pid });
  }
  const alive = async (pid) => (await db.query('SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = $1', [pid])).rows[0].n === 1;
  const maria = await browserLogin('h_maria');
  try {
    const { page } = maria;
    await page.goto(`${console1.url}/effect?key=${encodeURIComponent(payShown)}`);
    await page.click('#resolve-form input[value=completed]');
    await page.type('#resolve-form textarea[name=result]', '{"payment_id": 11}');
    await submit(page, '#resolve-form');
    assert.match(await flash(page), /Effect resolved as completed/);
    assert.equal((await effectRow(payShown)).status, 'completed', 'the effect the page showed was resolved');
    assert.equal((await effectRow(payTwin)).status, 'started', 'its twin was not');

    await page.goto(`${console1.url}/run?run=${encodeURIComponent('h-job\n')}`);
    await screenshot(page, 'run-key-with-line-feed');
    await submit(page, 'section.lease form');
    assert.match(await flash(page), /was broken/);
    await waitFor('the lease holder of h-job\\n to end', async () => !(await alive(held[0].pid)));
    assert.equal(await alive(held[1].pid), true, 'the holder of h-job\\r\\n was left alone');
  } finally {
    await maria.context.close();
    for (const h of held) await h.client.end().catch(() => {});
  }

  // a form that names its key as it is, not as the pages do, is refused before anything runs
  const person = await httpPerson(console1.url, 'h_maria', PW.h_maria);
  const form = formFields((await person.get(`/effect?key=${encodeURIComponent(payTwin)}`)).text, 'resolve-form');
  assert.equal(form.key, encodedId(payTwin), 'the page carries the key encoded');
  const raw = await person.act('resolve', { ...form, key: payTwin, outcome: 'completed', result: '{}' });
  assert.match(raw.said, /The form was not one of this console's pages: nothing was done/);
  assert.equal((await effectRow(payTwin)).status, 'started', 'nothing was written');
});

test('a tool whose name has two spaces is the one changed and retired, not its one-space twin', async () => {
  const chosen = 'h.pay  twin';
  const other = 'h.pay twin';
  for (const t of [chosen, other]) await db.query("SELECT durable_ledger.register_tool($1, 'test', side_effecting => true)", [t]);
  const { context, page } = await browserLogin('h_maria');
  try {
    await page.goto(`${console1.url}/tools`);
    // the person picks the option that reads "h.pay  twin"
    const picked = await page.$eval('#change-form select[name=tool]', (s, want) => {
      s.selectedIndex = [...s.options].findIndex((o) => o.textContent === want);
      return s.selectedIndex;
    }, chosen);
    assert.ok(picked >= 0);
    await page.select('#change-form select[name=side_effecting]', 'false');
    await submit(page, '#change-form');
    assert.match(await flash(page), /Tool h\.pay twin changed/);
    const retire = await page.waitForSelector(`xpath///tr[td/code[text()="${chosen}"]]//form`);
    await Promise.all([page.waitForNavigation(), retire.evaluate((f) => f.requestSubmit())]);
    assert.match(await flash(page), /retired/);
  } finally {
    await context.close();
  }
  const tool = async (t) => (await db.query(
    'SELECT side_effecting, changed_by, retired_by FROM durable_ledger.tools WHERE tool = $1', [t])).rows[0];
  assert.deepEqual(await tool(chosen), { side_effecting: false, changed_by: 'h_maria', retired_by: 'h_maria' });
  assert.deepEqual(await tool(other), { side_effecting: true, changed_by: null, retired_by: null }, 'the twin is untouched');
});

test('args that a double cannot hold are shown exactly as the ledger holds them', async () => {
  await approvalTool('h.transfer', 'strict $.amount > 100');
  const args = '{"to_account": 12345678901234567891, "amount": 1e400, "fee": 0.30000000000000000001}';
  const e = await call('h-transfer-1', 'h.transfer', args);
  assert.equal(e.status, 'awaiting_approval');
  const held = (await db.query('SELECT args::text FROM durable_ledger.effects WHERE key = $1', [e.key])).rows[0].args;
  assert.match(held, /12345678901234567891/);
  const { context, page } = await browserLogin('h_ana');
  try {
    const expected = ['"to_account": 12345678901234567891', '"fee": 0.30000000000000000001', `"amount": 1${'0'.repeat(400)}`];
    const cell = `tr.item[data-key="${e.key}"] pre.args`;
    await page.waitForSelector(cell);
    const inQueue = await page.$eval(cell, (el) => el.textContent);
    await page.goto(`${console1.url}/effect?key=${encodeURIComponent(e.key)}`);
    const onPage = await page.$eval('pre.json', (el) => el.textContent);
    await screenshot(page, 'exact-numbers');
    for (const text of expected) {
      assert.ok(inQueue.includes(text), `the queue shows ${text.slice(0, 40)}: ${inQueue.slice(0, 120)}`);
      assert.ok(onPage.includes(text), `the effect's page shows ${text.slice(0, 40)}: ${onPage.slice(0, 120)}`);
    }
  } finally {
    await context.close();
  }
});

/**
 * What answers at the ledger's address but is not PostgreSQL: it asks for
 * the password with `request` (an AuthenticationRequest message) and keeps
 * what the client sends after its startup message.
 */
async function fakeServer(request) {
  const got = { after: Buffer.alloc(0), closed: false };
  const server = net.createServer((socket) => {
    let buffer = Buffer.alloc(0);
    let started = false;
    socket.on('data', (d) => {
      buffer = Buffer.concat([buffer, d]);
      if (!started) {
        if (buffer.length < 4 || buffer.length < buffer.readUInt32BE(0)) return;
        buffer = buffer.subarray(buffer.readUInt32BE(0));
        started = true;
        socket.write(request);
      }
      got.after = Buffer.concat([got.after, buffer]);
      buffer = Buffer.alloc(0);
      if (got.after[0] === 0x70) {  // 'p': a password message
        const body = Buffer.from('SFATAL\0C28P01\0Mpassword authentication failed\0\0');
        const length = Buffer.alloc(4);
        length.writeUInt32BE(body.length + 4);
        socket.end(Buffer.concat([Buffer.from('E'), length, body]));
      }
    });
    socket.on('close', () => { got.closed = true; });
    socket.on('error', () => {});
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { port: server.address().port, got, close: () => new Promise((r) => server.close(r)) };
}

const authRequest = (code, extra = Buffer.alloc(0)) => {
  const head = Buffer.alloc(9);
  head.write('R', 0);
  head.writeUInt32BE(8 + extra.length, 1);
  head.writeUInt32BE(code, 5);
  return Buffer.concat([head, extra]);
};

test('a server that asks for the password in clear text, or for its MD5 hash, gets nothing', async () => {
  for (const [what, request] of [['the password in clear text', authRequest(3)],
    ['the password\'s MD5 hash', authRequest(5, Buffer.from([1, 2, 3, 4]))]]) {
    const fake = await fakeServer(request);
    const c = await startConsole({ target: { host: '127.0.0.1', port: fake.port, database: 'payments' } });
    try {
      const person = await httpPerson(c.url, 'h_maria', PW.h_maria);
      assert.equal(person.response.status, 401);
      const said = (await person.response.text()).match(/id="login-error">([^<]*)</)[1];
      assert.ok(said.includes(`asked for ${what.replace(/'/g, '&#39;')}`), said);
      await waitFor('the console to close the connection', () => fake.got.closed);
      assert.equal(fake.got.after.length, 0, `the console sent nothing after its startup message (${what}): ${fake.got.after}`);
    } finally {
      await c.app.close();
      await fake.close();
    }
  }
});

/** bin/console.js with these options: its exit code and output, or `started` once it serves (then stopped). */
function consoleBin(args, extraEnv = {}) {
  const child = spawn(process.execPath, [path.join(here, '..', 'bin', 'console.js'), '--port', '0', ...args],
    { env: { ...process.env, PGHOST: '', PGSSLMODE: '', ...extraEnv }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stderr.on('data', (d) => { err += d; });
  let started = false;
  return new Promise((resolve) => {
    child.stdout.on('data', (d) => {
      out += d;
      if (!started && /durable_ledger console: http/.test(out)) {
        started = true;
        child.kill('SIGTERM');
      }
    });
    child.on('exit', (code) => resolve({ started, code, out, err }));
  });
}

test('the ledger at another host is reached only over TLS that verifies it; --public-origin is an https origin', async () => {
  for (const [database, extraEnv] of [['postgresql://db.example:5432/payments', {}],
    ['postgresql://10.1.2.3/payments?sslmode=require', {}],
    ['', { PGHOST: 'db.example' }]]) {
    const r = await consoleBin(database ? ['--database', database] : [], extraEnv);
    assert.equal(r.started, false, `${database || JSON.stringify(extraEnv)} is refused`);
    assert.equal(r.code, 2);
    assert.match(r.err, /neither a Unix socket nor loopback.*sslmode=verify-full/s);
  }
  for (const [database, extraEnv] of [['postgresql://db.example:5432/payments?sslmode=verify-full', {}],
    ['postgresql://127.0.0.1:5432/payments', {}], [env.target, {}], ['', { PGHOST: 'db.example', PGSSLMODE: 'verify-full' }]]) {
    const r = await consoleBin(database ? ['--database', database] : [], extraEnv);
    assert.equal(r.started, true, `${database || JSON.stringify(extraEnv)} is taken: ${r.err}`);
  }
  const proxied = await consoleBin(['--database', env.target, '--public-origin', 'https://console.example']);
  assert.equal(proxied.started, true, proxied.err);
  const plain = await consoleBin(['--database', env.target, '--public-origin', 'http://console.example']);
  assert.deepEqual([plain.started, plain.code], [false, 2]);
  assert.match(plain.err, /--public-origin must be an https:\/\/ origin/);
});

test('behind a TLS-terminating proxy (--public-origin): people log in, the cookies are Secure __Host- cookies, logout clears them', async () => {
  const origin = 'https://console.example';
  const proxied = await startConsole({ publicOrigin: origin, loginLimit: 3 });
  try {
    const page = await fetch(`${proxied.url}/login`);
    const csrfCookie = page.headers.getSetCookie().find((c) => c.startsWith('__Host-dl_csrf='));
    assert.ok(csrfCookie, 'the form\'s cookie is a __Host- cookie');
    assert.match(csrfCookie, /; Secure/);
    const ines = await httpPerson(proxied.url, 'h_ines', PW.h_ines, { origin, headers: { 'x-forwarded-for': '198.51.100.7' } });
    assert.equal(ines.response.status, 303, 'the login from the public origin is taken');
    const session = ines.response.headers.getSetCookie().find((c) => c.startsWith('__Host-dl_console='));
    assert.ok(session, 'the session cookie is a __Host- cookie');
    for (const attribute of ['Path=/', 'HttpOnly', 'Secure', 'SameSite=Strict']) {
      assert.ok(session.split('; ').includes(attribute), `${attribute}: ${session}`);
    }
    const queue = await ines.get('/');
    assert.equal(queue.status, 200);
    assert.match(queue.headers.get('strict-transport-security') ?? '', /max-age/);
    const token = queue.text.match(/name="_csrf" value="([^"]+)"/)[1];
    // a form posted to the console's own address (not the public origin) is refused
    const direct = await fetch(`${proxied.url}/logout`, {
      method: 'POST', redirect: 'manual',
      headers: { cookie: ines.cookie(), origin: proxied.url, 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ _csrf: token }),
    });
    assert.equal(direct.status, 403);
    const out = await fetch(`${proxied.url}/logout`, {
      method: 'POST', redirect: 'manual',
      headers: { cookie: ines.cookie(), origin, 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ _csrf: token }),
    });
    assert.equal(out.status, 303);
    const cleared = out.headers.getSetCookie().find((c) => c.startsWith('__Host-dl_console='));
    assert.ok(cleared, 'the session cookie is cleared');
    for (const attribute of ['Path=/', 'Secure']) {
      assert.ok(cleared.split('; ').includes(attribute), `cleared with ${attribute}, as it was set: ${cleared}`);
    }
    assert.match(cleared, /^__Host-dl_console=;/);
    assert.match(cleared, /Expires=Thu, 01 Jan 1970/);

    // the failed-login limit counts each person's address, as the proxy forwards it
    const from = async (address) => (await httpPerson(proxied.url, 'h_maria', 'wrong', {
      origin, headers: { 'x-forwarded-for': address } })).response.status;
    const statuses = [];
    for (let i = 0; i < 4; i += 1) statuses.push(await from('203.0.113.5'));
    assert.deepEqual(statuses, [401, 401, 401, 429]);
    assert.equal(await from('203.0.113.6'), 401, 'another address is not locked out');
  } finally {
    await proxied.app.close();
  }
});

test('guesses sent at once are refused beyond the failed-login limit; a name counts as PostgreSQL reads it (63 bytes)', async () => {
  const limited = await startConsole({ loginLimit: 3 });
  try {
    const page = await fetch(`${limited.url}/login`);
    const cookie = page.headers.getSetCookie().map((c) => c.split(';')[0]).join('; ');
    const token = (await page.text()).match(/name="_csrf" value="([^"]+)"/)[1];
    const guess = (user, password) => fetch(`${limited.url}/login`, {
      method: 'POST', redirect: 'manual',
      headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ _csrf: token, user, password }),
    }).then((r) => r.status);
    const statuses = await Promise.all(Array.from({ length: 30 }, (_, n) => guess('h_maria', `guess-${n}`)));
    const count = (s) => statuses.filter((x) => x === s).length;
    assert.ok(count(401) <= 3, `at most 3 reached PostgreSQL: ${count(401)} did`);
    assert.equal(count(401) + count(429), 30, statuses.join(' '));
    assert.equal(await guess('h_maria', PW.h_maria), 429, 'the name waits out the minute');

    // PostgreSQL cuts a user name to 63 bytes: these four are one name
    const long = 'h'.repeat(63);
    const named = [];
    for (const suffix of ['a', 'b', 'c', 'd']) named.push(await guess(long + suffix, 'x'));
    assert.deepEqual(named, [401, 401, 401, 429]);
    assert.equal(await guess('h_ines', PW.h_ines), 303, 'another name logs in');
  } finally {
    await limited.app.close();
  }
});

test('a ledger older than the console (1.2), or none, is named at login instead of a silent logout', async () => {
  const superUrl = (dbname) => env.superDsn.replace(/\/postgres\?/, `/${dbname}?`);
  await db.query('CREATE DATABASE h_old12');
  await db.query('CREATE DATABASE h_none');
  const old = new pg.Client({ connectionString: superUrl('h_old12') });
  await old.connect();
  await old.query("CREATE EXTENSION durable_ledger VERSION '1.2'");
  await old.end();
  for (const [database, said] of [['h_old12', /durable_ledger 1\.2; the console needs 1\.3 or later \(ALTER EXTENSION durable_ledger UPDATE/],
    ['h_none', /durable_ledger is not installed in database h_none/]]) {
    const c = await startConsole({ target: { ...parseTarget(env.target), database } });
    try {
      const person = await httpPerson(c.url, 'h_maria', PW.h_maria);
      assert.equal(person.response.status, 401, `${database}: refused at login`);
      assert.match((await person.response.text()).match(/id="login-error">([^<]*)</)[1], said);
      const { rows } = await db.query(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND application_name = 'durable_ledger_console'", [database]);
      assert.equal(rows[0].n, 0, 'its connection was closed');
    } finally {
      await c.app.close();
    }
  }
});

test('a role renamed while logged in: its decisions are recorded under its name now, and a new role of its old name ends none of its sessions', async () => {
  await db.query(`CREATE ROLE h_olga LOGIN PASSWORD 'h-olga-secret-1'; GRANT durable_ledger_admin TO h_olga`);
  const single = await startConsole({ maxSessionsPerRole: 1 });
  try {
    const olga = await httpPerson(single.url, 'h_olga', 'h-olga-secret-1');
    assert.equal(olga.response.status, 303);
    await db.query(`ALTER ROLE h_olga RENAME TO h_olga_old;
                    CREATE ROLE h_olga LOGIN PASSWORD 'h-olga-secret-2'; GRANT durable_ledger_auditor TO h_olga`);
    const newcomer = await httpPerson(single.url, 'h_olga', 'h-olga-secret-2');
    assert.equal(newcomer.response.status, 303);
    const e = await call('h-renamed-1', 'h.pay', { invoice: 'REN-1', amount: 5 });
    const page = await olga.get(`/effect?key=${encodeURIComponent(e.key)}`);
    assert.equal(page.status, 200, 'the renamed role is still logged in');
    assert.match(page.text, /id="role">h_olga_old</, 'the page names the role as it is now');
    const form = { ...formFields(page.text, 'resolve-form'), outcome: 'failed', result: '{"bank": "no such payment"}' };
    assert.match((await olga.act('resolve', form)).said, /Effect resolved as failed/);
    const row = (await db.query('SELECT resolved_by FROM durable_ledger.effects WHERE key = $1', [e.key])).rows[0];
    const audit = (await db.query(
      "SELECT role_name, detail->>'resolved_by' AS resolved_by FROM durable_ledger.audit_log WHERE key = $1 AND event = 'resolved'",
      [e.key])).rows[0];
    assert.equal(row.resolved_by, 'h_olga_old');
    assert.deepEqual(audit, { role_name: 'h_olga_old', resolved_by: 'h_olga_old' });
  } finally {
    await single.app.close();
  }
});

test('a rejected call offers no "make it again"; a flagged call awaiting approval is listed and offered as a resolution', async () => {
  await approvalTool('h.gift', 'strict $.amount > 10');
  const rejected = await call('h-gift-1', 'h.gift', { amount: 50 });
  await db.query("SELECT durable_ledger.reject_effect($1, 'ops', 'no such order')", [rejected.key]);
  const flagged = await call('h-gift-2', 'h.gift', { amount: 60 });
  const w = new pg.Client({ connectionString: roleUrl('h_worker', PW.h_worker) });
  await w.connect();
  // a report on a call that never executed: kept as a conflict, the call flagged
  await w.query(`SELECT durable_ledger.complete_effect($1, '{"sent": true}', 1)`, [flagged.key]);
  await w.end();
  assert.deepEqual([(await effectRow(flagged.key)).status, (await effectRow(flagged.key)).conflict], ['awaiting_approval', true]);
  const { context, page } = await browserLogin('h_maria');
  try {
    await page.goto(`${console1.url}/effect?key=${encodeURIComponent(rejected.key)}`);
    assert.equal(await page.$('#retry-form'), null, 'no "make it again" of a rejected call');
    assert.ok(!(await page.content()).includes('Make it again'));

    await page.goto(`${console1.url}/`);
    const row = `tr.item[data-key="${flagged.key}"]`;
    await page.waitForSelector(row);
    assert.equal(await page.$eval(row, (el) => el.classList.contains('approval')), false);
    assert.equal(await page.$eval(`${row} a.button`, (el) => el.textContent.trim()), 'Resolve');
    assert.match(await page.$eval(`${row} .tag`, (el) => el.textContent), /awaiting_approval, flagged/);
    await Promise.all([page.waitForNavigation(), page.click(`${row} a.button`)]);
    assert.ok(await page.$('#resolve-form'), 'its page offers the resolution');
    assert.equal(await page.$('#approve-form'), null);
  } finally {
    await context.close();
  }
});
