// The console in headless Chromium, against a cluster whose pg_hba.conf asks
// every role but the test's superuser for a SCRAM password.  Each test is a
// person's task; the ledger's tables are the judge (not the page alone).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import {
  env, waitFor, superuser, startConsole, worker, launchBrowser, screenshot, login, submit, flash,
  consoleBackends, encodedId,
} from './support.js';

const PASSWORDS = { maria: 'maria-secret-1', ines: 'ines-secret-1', ana: 'ana-secret-1', ap_worker: 'worker-secret-1' };
let db;
let console1;
let browser;
let admin;   // maria's page

before(async () => {
  db = await superuser();
  await db.query(`
    CREATE TABLE bank_payments (id serial, invoice text, amount integer, idempotency_key text,
                                run text, paid_at timestamptz DEFAULT now());
    CREATE ROLE maria LOGIN PASSWORD '${PASSWORDS.maria}';
    CREATE ROLE ines LOGIN PASSWORD '${PASSWORDS.ines}';
    CREATE ROLE ana LOGIN PASSWORD '${PASSWORDS.ana}';
    CREATE ROLE ap_worker LOGIN PASSWORD '${PASSWORDS.ap_worker}';
    CREATE ROLE rooty LOGIN SUPERUSER PASSWORD 'rooty-secret-1';
    CREATE ROLE trusted_one LOGIN;
    GRANT durable_ledger_auditor TO trusted_one;
    GRANT durable_ledger_admin TO maria;
    GRANT durable_ledger_auditor TO ines;
    GRANT durable_ledger_approver TO ana;
    GRANT durable_ledger_worker TO ap_worker;
    GRANT INSERT, SELECT ON bank_payments TO ap_worker;
    GRANT USAGE ON SEQUENCE bank_payments_id_seq TO ap_worker;`);
  console1 = await startConsole();
  browser = await launchBrowser();
  admin = await browser.newPage();
});

after(async () => {
  await browser?.close();
  await console1?.app.close();
  await db?.end();
});

const bankCount = async (run) =>
  Number((await db.query('SELECT count(*) FROM bank_payments WHERE run = $1', [run])).rows[0].count);
const effectOf = async (run) =>
  (await db.query('SELECT * FROM durable_ledger.effects WHERE run = $1 ORDER BY created_at DESC LIMIT 1', [run])).rows[0];

/** A worker killed between the bank's answer and complete_effect: the payment's outcome is unknown. */
async function killMidPayment(run, extra = []) {
  const { child } = await worker(['--run', run, '--die-after', 'intent', ...extra], { until: /calling the bank/ });
  await waitFor('the bank to have the payment', async () => (await bankCount(run)) > 0);
  const pid = (await db.query(
    "SELECT pid FROM pg_stat_activity WHERE usename = 'ap_worker'")).rows.map((r) => r.pid);
  child.kill('SIGKILL');
  // the closed backend is gone: its lease ended with it
  await waitFor('the killed worker\'s backend to end', async () =>
    (await db.query('SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)', [pid])).rows[0].count === '0');
}

/** A worker's call that begins an effect and disconnects: the effect is unknown (if it executed). */
async function leaveUnknown(run, args, businessKey = null, tool = 'bank.pay') {
  const client = new pg.Client({ connectionString: workerUrl() });
  await client.connect();
  const { rows } = await client.query(
    'SELECT key, decision, attempt, reason FROM durable_ledger.begin_effect($1, $2, $3, $4)', [run, tool, args, businessKey]);
  const pid = (await client.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
  await client.end();
  await waitFor('the worker\'s backend to end', async () =>
    (await db.query('SELECT count(*) FROM pg_stat_activity WHERE pid = $1', [pid])).rows[0].count === '0');
  return rows[0];
}

function workerUrl() {
  const u = new URL(env.target.replace(/^postgresql:/, 'http:'));
  const host = u.searchParams.get('host');
  const port = u.searchParams.get('port');
  return `postgresql://ap_worker:${PASSWORDS.ap_worker}@/${u.pathname.slice(1)}?host=${encodeURIComponent(host)}&port=${port}`;
}

test('an admin logs in with their PostgreSQL role and password, on a connection of their own', async () => {
  const response = await login(admin, console1.url, 'maria', PASSWORDS.maria);
  assert.equal(response.status(), 200);
  assert.equal(await admin.$eval('#role', (el) => el.textContent), 'maria');
  assert.equal(await consoleBackends(db, 'maria'), 1, 'maria has one backend of the console');
  const csp = response.headers()['content-security-policy'];
  assert.match(csp, /default-src 'none'/);
  assert.match(csp, /script-src 'self'(;|$)/);
  assert.equal(response.headers()['cache-control'], 'no-store', 'no page is kept by the browser');
  const cookies = await admin.cookies();
  const session = cookies.find((c) => c.name === 'dl_console');
  assert.ok(session, 'a session cookie');
  assert.equal(session.httpOnly, true);
  assert.equal(session.sameSite, 'Strict');
  assert.ok(!cookies.some((c) => c.value.includes(PASSWORDS.maria)), 'no cookie carries the password');
  await screenshot(admin, 'queue-empty');
});

test('a worker killed mid-payment appears on the open page without a reload; resolved as completed, the next attempt replays it', async () => {
  const run = 'console-pay-1';
  await admin.goto(`${console1.url}/`);
  await admin.evaluate(() => { window.notReloaded = true; });
  await killMidPayment(run);
  const paused = await worker(['--run', run]);
  assert.equal(paused.code, 3, `the next attempt pauses: ${paused.out}`);
  const e = await effectOf(run);
  // the queue re-reads only on a notification here (its timer is an hour)
  await admin.waitForSelector(`tr.item[data-key="${e.key}"]`, { timeout: 30000 });
  assert.equal(await admin.evaluate(() => window.notReloaded), true, 'the page was not reloaded');
  assert.match(await admin.$eval(`tr.item[data-key="${e.key}"] .downstream`, (el) => el.textContent), new RegExp(e.key));
  await screenshot(admin, 'queue-paused');

  await Promise.all([admin.waitForNavigation(), admin.click(`tr.item[data-key="${e.key}"] a.button`)]);
  const payment = (await db.query('SELECT id FROM bank_payments WHERE run = $1', [run])).rows[0].id;
  await admin.click('#resolve-form input[value=completed]');
  await admin.type('#resolve-form textarea[name=result]', JSON.stringify({ payment_id: payment }));
  await admin.type('#resolve-form input[name=name]', 'Maria Lopez');
  await admin.type('#resolve-form input[name=note]', `the bank has payment ${payment} for this key`);
  await screenshot(admin, 'effect-resolve');
  await submit(admin, '#resolve-form');
  assert.match(await flash(admin), /resolved as completed \(attempt 1\)/);
  await screenshot(admin, 'effect-resolved');

  const resolved = (await db.query('SELECT * FROM durable_ledger.effects WHERE key = $1', [e.key])).rows[0];
  assert.equal(resolved.status, 'completed');
  assert.deepEqual(resolved.result, { payment_id: payment });
  assert.equal(resolved.resolved_by, 'Maria Lopez (maria)');
  const audit = (await db.query(
    "SELECT role_name, application_name FROM durable_ledger.audit_log WHERE key = $1 AND event = 'resolved'", [e.key])).rows;
  assert.deepEqual(audit, [{ role_name: 'maria', application_name: 'durable_ledger_console' }],
    'the audit log names the logged-in role');

  const replayed = await worker(['--run', run]);
  assert.equal(replayed.code, 0, replayed.out + replayed.err);
  assert.match(replayed.out, /not paying again: recorded result \{'payment_id': \d+\}/);
  assert.equal(await bankCount(run), 1, 'the bank was called once');
  await waitFor('the item to leave the open queue', async () =>
    (await admin.goto(`${console1.url}/`), (await admin.$(`tr.item[data-key="${e.key}"]`)) === null));
});

test('a divergence (a reworded memo) is decided as the same payment: the rerun replays it', async () => {
  const run = 'console-pay-2';
  await admin.goto(`${console1.url}/`);
  const first = await worker(['--run', run, '--memo', 'Invoice INV-9, thanks!', '--die-after', 'paid'],
    { until: /acknowledging the job/ });
  first.child.kill('SIGKILL');
  const drifted = await worker(['--run', run, '--memo', 'Paying INV-9 as agreed']);
  assert.equal(drifted.code, 3, drifted.out);
  const d = (await db.query('SELECT * FROM durable_ledger.divergences WHERE run = $1', [run])).rows[0];
  await admin.waitForSelector(`tr.item.divergence[data-key="${d.key}"]`, { timeout: 30000 });
  await Promise.all([admin.waitForNavigation(), admin.click(`tr.item[data-key="${d.key}"] a.button`)]);
  await screenshot(admin, 'divergence');
  await admin.type('#same-form input[name=note]', 'the model reworded the memo; same invoice and amount');
  await submit(admin, '#same-form');
  assert.match(await flash(admin), /Divergence decided: same/);
  assert.match(await admin.$eval('#verdict', (el) => el.textContent), /same/);
  const again = await worker(['--run', run, '--memo', 'Paying INV-9 as agreed']);
  assert.equal(again.code, 0, again.out);
  assert.match(again.out, /not paying again/);
  assert.equal(await bankCount(run), 1, 'paid once');
});

test('an auditor sees no action buttons, and a forged resolve POST is refused by PostgreSQL (42501)', async () => {
  const waiting = await leaveUnknown('console-audit-1', { invoice: 'INV-31', amount: 310 });
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  try {
    await login(page, console1.url, 'ines', PASSWORDS.ines);
    await page.waitForSelector(`tr.item[data-key="${waiting.key}"]`);
    await page.goto(`${console1.url}/effect?key=${encodeURIComponent(waiting.key)}`);
    assert.equal(await page.$('#resolve-form'), null, 'no resolve form');
    assert.equal(await page.$('#retry-form'), null, 'no retry form');
    assert.deepEqual(await page.$$eval('main form', (fs) => fs.length), 0, 'no form at all in the page');
    assert.ok(await page.$('#read-only'));
    await screenshot(page, 'auditor-effect');
    for (const where of ['/tools', '/leases', `/run?run=console-audit-1`]) {
      await page.goto(`${console1.url}${where}`);
      assert.equal(await page.$$eval('main form', (fs) => fs.length), 0, `no form for an auditor on ${where}`);
    }
    await page.goto(`${console1.url}/audit`);
    assert.deepEqual(await page.$$eval('main form', (fs) => fs.map((f) => f.id)), ['verify-form'],
      'an auditor may verify the chain');

    // the forged request: the form an admin's page would send (its key
    // encoded as the pages do), with the auditor's own token
    await page.goto(`${console1.url}/effect?key=${encodeURIComponent(waiting.key)}`);
    await Promise.all([page.waitForNavigation(), page.evaluate((key) => {
      const f = document.createElement('form');
      f.method = 'post';
      f.action = '/act/resolve';
      const fields = {
        _csrf: document.querySelector('form.logout input[name=_csrf]').value,
        back: location.pathname + location.search, key, attempt: '1', outcome: 'completed', result: '{}',
      };
      for (const [name, value] of Object.entries(fields)) {
        const input = document.createElement('input');
        input.name = name;
        input.value = value;
        f.append(input);
      }
      document.body.append(f);
      f.submit();
    }, encodedId(waiting.key))]);
    const said = await flash(page);
    assert.match(said, /SQLSTATE 42501/);
    assert.match(said, /permission denied for function resolve_effect/);
    await screenshot(page, 'auditor-forged');
    const row = (await db.query('SELECT status FROM durable_ledger.effects WHERE key = $1', [waiting.key])).rows[0];
    assert.equal(row.status, 'started', 'nothing was written');
    await submit(page, 'form.logout');
    await waitFor('ines\'s backend to end', async () => (await consoleBackends(db, 'ines')) === 0);
  } finally {
    await context.close();
  }
});

test('a wrong password, a dropped role and a superuser are refused at login', async () => {
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  try {
    let response = await login(page, console1.url, 'maria', 'not-her-password');
    assert.equal(response.status(), 401);
    assert.match(await page.$eval('#login-error', (el) => el.textContent), /refused the login/);
    await screenshot(page, 'login-refused');

    await db.query("CREATE ROLE leaver LOGIN PASSWORD 'leaver-secret-1'; GRANT durable_ledger_auditor TO leaver");
    await db.query('DROP ROLE leaver');
    response = await login(page, console1.url, 'leaver', 'leaver-secret-1');
    assert.equal(response.status(), 401);
    assert.match(await page.$eval('#login-error', (el) => el.textContent), /refused the login/);

    response = await login(page, console1.url, 'rooty', 'rooty-secret-1');
    assert.equal(response.status(), 401);
    assert.match(await page.$eval('#login-error', (el) => el.textContent), /does not log in superusers/);
    assert.equal(await consoleBackends(db, 'rooty'), 0, 'the superuser\'s connection was closed');
    assert.equal((await page.cookies()).some((c) => c.name === 'dl_console'), false, 'no session');
  } finally {
    await context.close();
  }
});

test('args and notes that carry markup render as text and run nothing', async () => {
  const hostile = {
    invoice: 'INV-66',
    amount: 66,
    memo: '<script>window.pwned = "script"</script>',
    to: '"><img src=x onerror="window.pwned = \'img\'">',
  };
  const waiting = await leaveUnknown('console-xss-1', hostile);
  const blocked = [];
  admin.on('console', (m) => { if (/Content Security Policy/.test(m.text())) blocked.push(m.text()); });
  await admin.goto(`${console1.url}/`);
  const cell = `tr.item[data-key="${waiting.key}"] pre.args`;
  await admin.waitForSelector(cell);
  const shown = await admin.$eval(cell, (el) => el.textContent);
  // as JSON text: its quotes escaped by JSON, nothing else
  const asJson = (v) => JSON.stringify(v).slice(1, -1);
  assert.ok(shown.includes(asJson(hostile.memo)), `the script tag is shown as text: ${shown}`);
  assert.ok(shown.includes(asJson(hostile.to)), 'the img markup is shown as text');
  assert.equal(await admin.$$eval('main img, main script', (els) => els.length), 0, 'no element was made of them');
  assert.equal(await admin.evaluate(() => window.pwned), undefined, 'nothing ran');

  await admin.goto(`${console1.url}/effect?key=${encodeURIComponent(waiting.key)}`);
  await admin.click('#resolve-form input[value=failed]');
  await admin.type('#resolve-form textarea[name=result]', JSON.stringify({ said: hostile.memo }));
  await admin.type('#resolve-form input[name=name]', hostile.to);
  await admin.type('#resolve-form input[name=note]', hostile.memo);
  await submit(admin, '#resolve-form');
  assert.match(await flash(admin), /resolved as failed/);
  const page = await admin.content();
  assert.ok(!page.includes('<script>window'), 'the page source has no live script tag');
  assert.ok(page.includes('&lt;script&gt;window.pwned'), 'escaped');
  assert.equal(await admin.$$eval('main img, main script', (els) => els.length), 0);
  assert.equal(await admin.evaluate(() => window.pwned), undefined, 'nothing ran');
  await screenshot(admin, 'hostile-args');
  const row = (await db.query('SELECT resolved_by, resolution_note FROM durable_ledger.effects WHERE key = $1', [waiting.key])).rows[0];
  assert.equal(row.resolved_by, `${hostile.to} (maria)`);
  assert.equal(row.resolution_note, hostile.memo);
  assert.deepEqual(blocked, [], 'the page needed nothing the policy blocks');
});

test('a page left open on attempt 1 cannot resolve attempt 2', async () => {
  const run = 'console-bk-1';
  const args = { invoice: 'INV-77', amount: 770 };
  const first = await leaveUnknown(run, args, 'PAY-INV-77');
  assert.equal(first.attempt, 1);
  // maria's page, open on attempt 1
  await admin.goto(`${console1.url}/effect?key=${encodeURIComponent(first.key)}`);
  assert.equal(await admin.$eval('#attempt', (el) => el.textContent), '1');
  // meanwhile someone finds attempt 1 did not happen, and a worker makes attempt 2, and dies
  await db.query("SELECT durable_ledger.retry_effect($1, 1, 'ops on call', 'the bank has nothing')", [first.key]);
  const second = await leaveUnknown(run, args, 'PAY-INV-77');
  assert.equal(second.attempt, 2);
  assert.equal(second.key, first.key);
  await admin.click('#resolve-form input[value=completed]');
  await admin.type('#resolve-form textarea[name=result]', '{"payment_id": 1}');
  await submit(admin, '#resolve-form');
  const said = await flash(admin);
  assert.match(said, /SQLSTATE 55000/, said);
  assert.match(await admin.$eval('#attempt', (el) => el.textContent), /^2$/, 'the page now shows attempt 2');
  await screenshot(admin, 'stale-attempt');
  const row = (await db.query('SELECT status, attempt FROM durable_ledger.effects WHERE key = $1', [first.key])).rows[0];
  assert.deepEqual(row, { status: 'started', attempt: 2 }, 'attempt 2 was not decided');
});

test('a POST without the CSRF token is refused and writes nothing', async () => {
  const waiting = await leaveUnknown('console-csrf-1', { invoice: 'INV-88', amount: 88 });
  const cookies = (await admin.cookies()).map((c) => `${c.name}=${c.value}`).join('; ');
  const response = await fetch(`${console1.url}/act/resolve`, {
    method: 'POST',
    redirect: 'manual',
    headers: { cookie: cookies, 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ key: waiting.key, attempt: '1', outcome: 'failed' }),
  });
  assert.equal(response.status, 403);
  assert.match(await response.text(), /CSRF/);
  const row = (await db.query('SELECT status FROM durable_ledger.effects WHERE key = $1', [waiting.key])).rows[0];
  assert.equal(row.status, 'started');
});

test('leases: a hung worker\'s lease is broken with a name and a note', async () => {
  const hung = new pg.Client({ connectionString: workerUrl() });
  await hung.connect();
  hung.on('error', () => {});
  await hung.query("SELECT durable_ledger.acquire_run('console-hung-1')");
  await admin.goto(`${console1.url}/leases`);
  const row = await admin.waitForSelector('xpath///tr[td/a[text()="console-hung-1"]]');
  await screenshot(admin, 'leases');
  await row.$eval('input[name=note]', (el) => { el.value = 'worker hung on the bank call'; });
  await Promise.all([admin.waitForNavigation(), row.$eval('form', (f) => f.requestSubmit())]);
  assert.match(await flash(admin), /The lease of console-hung-1 was broken/);
  await waitFor('the hung backend to end', async () =>
    (await db.query("SELECT count(*) FROM durable_ledger.leases WHERE run = 'console-hung-1'")).rows[0].count === '0');
  const audit = (await db.query(
    "SELECT role_name, detail FROM durable_ledger.audit_log WHERE run = 'console-hung-1' AND event = 'lease_broken'")).rows[0];
  assert.equal(audit.role_name, 'maria');
  assert.equal(audit.detail.note, 'worker hung on the bank call');
});

test('tools: a tool registered with key fields, and the policy for tools nobody registered', async () => {
  await admin.goto(`${console1.url}/tools`);
  await admin.type('#register-form input[name=tool]', 'bank.refund');
  await admin.type('#register-form input[name=key_fields]', 'invoice, amount');
  await submit(admin, '#register-form');
  assert.match(await flash(admin), /Tool bank.refund registered/);
  const tool = (await db.query("SELECT key_fields, registered_by FROM durable_ledger.tools WHERE tool = 'bank.refund'")).rows[0];
  assert.deepEqual(tool, { key_fields: ['invoice', 'amount'], registered_by: 'maria' });
  await admin.select('#change-form select[name=tool]', encodedId('bank.refund'));
  await admin.select('#change-form select[name=divergence]', 'warn');
  await submit(admin, '#change-form');
  assert.match(await flash(admin), /Tool bank.refund changed/);
  const retire = await admin.waitForSelector('xpath///tr[td/code[text()="bank.refund"]]//form');
  await Promise.all([admin.waitForNavigation(), retire.evaluate((f) => f.requestSubmit())]);
  assert.match(await flash(admin), /Tool bank.refund retired/);
  const changed = (await db.query(
    "SELECT divergence, key_fields, changed_by, retired_by FROM durable_ledger.tools WHERE tool = 'bank.refund'")).rows[0];
  assert.deepEqual(changed, { divergence: 'warn', key_fields: ['invoice', 'amount'], changed_by: 'maria', retired_by: 'maria' },
    'the change kept what it did not name');
  await admin.select('form[action="/act/unregistered_tools"] select', 'warn');
  await submit(admin, 'form[action="/act/unregistered_tools"]');
  assert.match(await flash(admin), /Tools nobody registered: warn \(was allow\)/);
  assert.equal(await admin.$eval('#unregistered-tools', (el) => el.textContent), 'warn');
  await screenshot(admin, 'tools');
  await db.query("SELECT durable_ledger.set_unregistered_tools('allow', 'test', NULL)");
});

test('a run\'s timeline, the metrics and the audit chain\'s verification', async () => {
  await admin.goto(`${console1.url}/run?run=console-pay-1`);
  const events = await admin.$$eval('#timeline tr.event', (rows) => rows.map((r) => r.className.replace('event ', '')));
  for (const e of ['lease_acquired', 'intent', 'pause', 'resolved', 'replay']) {
    assert.ok(events.includes(e), `the timeline has ${e}: ${events}`);
  }
  await screenshot(admin, 'run');
  await admin.goto(`${console1.url}/metrics`);
  const unresolved = (await db.query('SELECT unresolved FROM durable_ledger.metrics')).rows[0].unresolved;
  assert.equal(await admin.$eval('#m-unresolved', (el) => el.textContent), String(unresolved));
  await screenshot(admin, 'metrics');
  await admin.goto(`${console1.url}/audit`);
  const heads = await admin.$eval('#heads-json', (el) => el.textContent);
  await admin.type('#verify-form textarea', heads);
  await submit(admin, '#verify-form');
  assert.ok(await admin.$('#verify-ok'), 'the chain and the kept heads verify');
  await screenshot(admin, 'audit');
});

test('an approver approves a call on its page, which then executes once; she may not resolve', async () => {
  await db.query(`SELECT durable_ledger.register_tool('shop.refund', 'test', key_fields => '{invoice,amount}');
                  SELECT durable_ledger.set_approval('shop.refund', 'strict $.amount > 100', 'test')`);
  const args = { invoice: 'INV-90', amount: 900 };
  const waiting = await leaveUnknown('console-refund-1', args, null, 'shop.refund');
  assert.equal(waiting.decision, 'pause');
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  try {
    await login(page, console1.url, 'ana', PASSWORDS.ana);
    await page.waitForSelector(`tr.item.approval[data-key="${waiting.key}"]`);
    await page.goto(`${console1.url}/effect?key=${encodeURIComponent(waiting.key)}`);
    assert.equal(await page.$('#resolve-form'), null, 'an approver may not resolve');
    assert.ok(await page.$('#reject-form'));
    await page.type('#approve-form input[name=note]', 'refund agreed with the customer');
    await screenshot(page, 'approval');
    await submit(page, '#approve-form');
    assert.match(await flash(page), /Approved/);
    const row = (await db.query('SELECT approval, approver FROM durable_ledger.effects WHERE key = $1', [waiting.key])).rows[0];
    assert.deepEqual(row, { approval: 'approved', approver: 'ana' });
    const executed = await leaveUnknown('console-refund-1', args, null, 'shop.refund');
    assert.equal(executed.decision, 'execute', 'the approved call executes');
    await submit(page, 'form.logout');
  } finally {
    await context.close();
  }
});

test('"make it again": an attempt found not to have happened is executed anew by the next call', async () => {
  const args = { invoice: 'INV-91', amount: 91 };
  const first = await leaveUnknown('console-retry-1', args, 'PAY-INV-91');
  await admin.goto(`${console1.url}/effect?key=${encodeURIComponent(first.key)}`);
  await admin.type('#retry-form input[name=note]', 'the bank has no payment with this key');
  await submit(admin, '#retry-form');
  assert.match(await flash(admin), /Attempt 1 did not happen/);
  const second = await leaveUnknown('console-retry-1', args, 'PAY-INV-91');
  assert.deepEqual([second.decision, second.attempt], ['execute', 2]);
});

test('a run stopped at its budget: the pause is listed, and a person raises the run\'s budget on its page', async () => {
  await db.query(`SELECT durable_ledger.register_tool('mail.send', 'test');
                  SELECT durable_ledger.set_budget('mail.send', 2, 'test')`);
  const client = new pg.Client({ connectionString: workerUrl() });
  await client.connect();
  const decisions = [];
  for (let n = 1; n <= 3; n += 1) {
    const { rows } = await client.query(
      "SELECT key, decision FROM durable_ledger.begin_effect('console-mail-1', 'mail.send', $1)", [{ to: 'ann@example.com', try: n }]);
    decisions.push(rows[0].decision);
    if (rows[0].decision === 'execute') await client.query("SELECT durable_ledger.complete_effect($1, '{}')", [rows[0].key]);
  }
  assert.deepEqual(decisions, ['execute', 'execute', 'pause']);
  await admin.goto(`${console1.url}/`);
  await admin.waitForSelector('tr.item.budget');
  await Promise.all([admin.waitForNavigation(), admin.click('tr.item.budget a.button')]);
  await admin.type('#budget-form input[name=tool]', 'mail.send');
  await admin.type('#budget-form input[name=max_executions]', '3');
  await admin.type('#budget-form input[name=note]', 'one more try is fine');
  await submit(admin, '#budget-form');
  assert.match(await flash(admin), /budgets of run console-mail-1 were set/);
  const { rows } = await client.query(
    "SELECT decision FROM durable_ledger.begin_effect('console-mail-1', 'mail.send', $1)", [{ to: 'ann@example.com', try: 3 }]);
  assert.equal(rows[0].decision, 'execute', 'the raised budget lets the call execute');
  await client.end();
});

test('a run is forked up to an effect, and a run abandoned, from its page', async () => {
  await admin.goto(`${console1.url}/run?run=console-pay-1`);
  await admin.type('#fork-form input[name=new_run]', 'console-pay-1-again');
  await admin.type('#fork-form input[name=note]', 'start over from the payment');
  await submit(admin, '#fork-form');
  assert.match(await flash(admin), /forked from console-pay-1, carrying 1 effects/);
  assert.equal(await admin.$eval('#run-id', (el) => el.textContent), 'console-pay-1-again');
  const forked = (await db.query("SELECT forked_from FROM durable_ledger.runs WHERE run = 'console-pay-1-again'")).rows[0];
  assert.equal(forked.forked_from, 'console-pay-1');
  await admin.goto(`${console1.url}/run?run=console-pay-2`);
  await admin.type('#abandon-form input[name=note]', 'the customer cancelled');
  await submit(admin, '#abandon-form');
  assert.match(await flash(admin), /Run console-pay-2 abandoned/);
  assert.ok(await admin.$('#abandoned'));
  const abandoned = (await db.query("SELECT abandoned_by FROM durable_ledger.runs WHERE run = 'console-pay-2'")).rows[0];
  assert.equal(abandoned.abandoned_by, 'maria');
});

test('logout closes the person\'s connection', async () => {
  assert.equal(await consoleBackends(db, 'maria'), 1);
  await submit(admin, 'form.logout');
  assert.match(admin.url(), /\/login$/);
  await waitFor('maria\'s backend to end', async () => (await consoleBackends(db, 'maria')) === 0);
  const response = await admin.goto(`${console1.url}/`);
  assert.match(response.url(), /\/login$/, 'logged out');
});

/** A login by HTTP alone (no browser): the response of the POST and the cookie header. */
async function httpLogin(url, user, password) {
  const page = await fetch(`${url}/login`);
  const jar = page.headers.getSetCookie().map((c) => c.split(';')[0]);
  const token = (await page.text()).match(/name="_csrf" value="([^"]+)"/)[1];
  const response = await fetch(`${url}/login`, {
    method: 'POST',
    redirect: 'manual',
    headers: { cookie: jar.join('; '), 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ _csrf: token, user, password }),
  });
  jar.push(...response.headers.getSetCookie().map((c) => c.split(';')[0]));
  return { response, cookie: jar.join('; ') };
}

test('a person idle past the timeout is logged out and their connection closed', async () => {
  const short = await startConsole({ idleTimeoutMs: 1500 });
  try {
    const { response, cookie } = await httpLogin(short.url, 'ines', PASSWORDS.ines);
    assert.equal(response.status, 303);
    assert.equal((await fetch(`${short.url}/`, { headers: { cookie }, redirect: 'manual' })).status, 200);
    // a page left open re-reads the queue by itself: that is not the person's activity
    await waitFor('ines\'s idle backend to end', async () => {
      await fetch(`${short.url}/queue/rows`, { headers: { cookie, 'hx-request': 'true' }, redirect: 'manual' });
      return (await consoleBackends(db, 'ines')) === 0;
    });
    const later = await fetch(`${short.url}/`, { headers: { cookie }, redirect: 'manual' });
    assert.equal(later.status, 303);
    assert.equal(later.headers.get('location'), '/login');
    const reread = await fetch(`${short.url}/queue/rows`, { headers: { cookie, 'hx-request': 'true' } });
    assert.equal(reread.status, 401);
    assert.equal(reread.headers.get('hx-redirect'), '/login', 'an open page is taken to the login');
  } finally {
    await short.app.close();
  }
});

test('failed logins are limited per client address and user name; a stranger\'s requests lock nobody out', async () => {
  const limited = await startConsole({ loginLimit: 3 });
  try {
    // requests without a form token are refused before they count
    for (let i = 0; i < 5; i += 1) {
      const r = await fetch(`${limited.url}/login`, {
        method: 'POST', redirect: 'manual', headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ user: 'maria', password: 'x' }),
      });
      assert.equal(r.status, 403);
    }
    const statuses = [];
    for (let i = 0; i < 4; i += 1) {
      statuses.push((await httpLogin(limited.url, 'maria', `guess-${i}`)).response.status);
    }
    assert.deepEqual(statuses, [401, 401, 401, 429]);
    assert.equal((await httpLogin(limited.url, 'maria', PASSWORDS.maria)).response.status, 429, 'maria waits out the minute');
    assert.equal((await httpLogin(limited.url, 'ines', PASSWORDS.ines)).response.status, 303, 'ines is not locked out');
  } finally {
    await limited.app.close();
  }
});

test('what PostgreSQL must check is never taken from elsewhere: empty fields, a NUL, a trusted role, a role without a ledger role', async () => {
  const refused = async (user, password, why) => {
    const { response } = await httpLogin(console1.url, user, password);
    assert.equal(response.status, 401, `${why}: refused`);
    const page = await response.text();
    return page.match(/id="login-error">([^<]*)</)[1];
  };
  assert.match(await refused('maria', '', 'an empty password'), /give your user name and your password/);
  assert.match(await refused('', PASSWORDS.maria, 'an empty user'), /give your user name/);
  assert.match(await refused('rooty\u0000options\u0000-c role=maria', 'rooty-secret-1', 'a NUL in the user name'),
    /refused the login/);
  assert.match(await refused('trusted_one', 'anything', 'a role pg_hba.conf trusts'), /did not ask for a password/);
  assert.equal(await consoleBackends(db, 'trusted_one'), 0);
  await db.query("CREATE ROLE nobody LOGIN PASSWORD 'nobody-secret-1'");
  assert.match(await refused('nobody', 'nobody-secret-1', 'a role without a ledger role'), /holds none of durable_ledger_admin/);
  assert.equal(await consoleBackends(db, 'nobody'), 0);
});

test('a role whose login is revoked is logged out at its next request; a role has a few sessions at most', async () => {
  const small = await startConsole({ maxSessionsPerRole: 2 });
  try {
    const logins = [];
    for (let i = 0; i < 4; i += 1) logins.push(await httpLogin(small.url, 'ines', PASSWORDS.ines));
    await waitFor('ines\'s oldest sessions to end', async () => (await consoleBackends(db, 'ines')) === 2);
    assert.equal((await fetch(`${small.url}/`, { headers: { cookie: logins[0].cookie }, redirect: 'manual' })).status, 303,
      'the oldest session ended');
    assert.equal((await fetch(`${small.url}/`, { headers: { cookie: logins[3].cookie }, redirect: 'manual' })).status, 200);
    await db.query('ALTER ROLE ines NOLOGIN');
    try {
      const after = await fetch(`${small.url}/`, { headers: { cookie: logins[3].cookie }, redirect: 'manual' });
      assert.equal(after.status, 303, 'logged out');
      await waitFor('ines\'s backends to end', async () => (await consoleBackends(db, 'ines')) === 1);
    } finally {
      await db.query('ALTER ROLE ines LOGIN');
    }
  } finally {
    await small.app.close();
  }
});

test('a form posted from another origin, or with a token of another session, is refused', async () => {
  const waiting = await leaveUnknown('console-origin-1', { invoice: 'INV-92', amount: 92 });
  const { cookie } = await httpLogin(console1.url, 'maria', PASSWORDS.maria);
  const page = await (await fetch(`${console1.url}/effect?key=${encodeURIComponent(waiting.key)}`, { headers: { cookie } })).text();
  const token = page.match(/name="_csrf" value="([^"]+)"/)[1];
  const post = (headers, csrf) => fetch(`${console1.url}/act/retry`, {
    method: 'POST', redirect: 'manual',
    headers: { cookie, 'content-type': 'application/x-www-form-urlencoded', ...headers },
    body: new URLSearchParams({ _csrf: csrf, key: encodedId(waiting.key), attempt: '1', back: '/' }),
  });
  assert.equal((await post({ origin: 'http://127.0.0.1:9999' }, token)).status, 403, 'another port of this host');
  assert.equal((await post({ 'sec-fetch-site': 'same-site' }, token)).status, 403, 'a sibling site');
  // the login page's token is bound to no session
  const loginPage = await fetch(`${console1.url}/login`, { headers: { cookie } });
  const loginToken = (await loginPage.text()).match(/name="_csrf" value="([^"]+)"/);
  if (loginToken) assert.equal((await post({}, loginToken[1])).status, 403, 'a token of no session');
  const row = (await db.query('SELECT status FROM durable_ledger.effects WHERE key = $1', [waiting.key])).rows[0];
  assert.equal(row.status, 'started', 'nothing was written');
  const ok = await post({ origin: console1.url }, token);
  assert.equal(ok.status, 303, 'the console\'s own form is taken');
  assert.equal((await db.query('SELECT status FROM durable_ledger.effects WHERE key = $1', [waiting.key])).rows[0].status,
    'failed', 'and made it again');
});

test('an approver\'s page left open on attempt 1 approves nothing once attempt 2 (other args) waits', async () => {
  await db.query(`SELECT durable_ledger.register_tool('shop.credit', 'test', key_fields => '{invoice}');
                  SELECT durable_ledger.set_approval('shop.credit', 'strict $.amount > 100', 'test')`);
  const first = await leaveUnknown('console-credit-1', { invoice: 'INV-93', amount: 150 }, 'CREDIT-INV-93', 'shop.credit');
  assert.equal(first.decision, 'pause');
  const { cookie } = await httpLogin(console1.url, 'ana', PASSWORDS.ana);
  const page = await (await fetch(`${console1.url}/effect?key=${encodeURIComponent(first.key)}`, { headers: { cookie } })).text();
  const token = page.match(/name="_csrf" value="([^"]+)"/)[1];
  assert.match(page, /id="approve-form"[\s\S]*name="attempt" value="1"/, 'the form names attempt 1');
  // meanwhile: approved by someone else, executed, failed; attempt 2 asks for 99,999
  await db.query("SELECT durable_ledger.approve_effect($1, 'ops', 'agreed')", [first.key]);
  const executed = await leaveUnknown('console-credit-1', { invoice: 'INV-93', amount: 150 }, 'CREDIT-INV-93', 'shop.credit');
  assert.equal(executed.decision, 'execute');
  await db.query(`SELECT durable_ledger.fail_effect($1, '{"code": "declined"}', 1)`, [first.key]);
  const second = await leaveUnknown('console-credit-2', { invoice: 'INV-93', amount: 99999 }, 'CREDIT-INV-93', 'shop.credit');
  assert.deepEqual([second.decision, second.attempt], ['pause', 2]);
  const r = await fetch(`${console1.url}/act/approve`, {
    method: 'POST', redirect: 'manual',
    headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ _csrf: token, key: encodedId(first.key), attempt: '1', back: `/effect?key=${encodeURIComponent(first.key)}` }),
  });
  assert.equal(r.status, 303);
  const shown = await (await fetch(new URL(r.headers.get('location'), console1.url), { headers: { cookie } })).text();
  assert.match(shown, /the page showed attempt 1 of this call; the ledger has attempt 2 now/);
  const row = (await db.query('SELECT status, attempt, approval FROM durable_ledger.effects WHERE key = $1', [first.key])).rows[0];
  assert.deepEqual(row, { status: 'awaiting_approval', attempt: 2, approval: 'requested' }, 'attempt 2 was not approved');
  const audit = (await db.query("SELECT count(*) FROM durable_ledger.audit_log WHERE key = $1 AND event = 'approved'", [first.key])).rows[0];
  assert.equal(audit.count, '1', 'no approval of attempt 2 was recorded');
});
