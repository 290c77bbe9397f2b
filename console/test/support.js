// What the console's tests share: the cluster (a superuser connection for
// setting up and checking, never for the console), consoles started in this
// process, the demo's worker processes, headless Chromium, and waiting for a
// condition (never for a fixed time).
import { spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import puppeteer from 'puppeteer-core';
import { buildApp } from '../src/app.js';
import { parseTarget } from '../src/target.js';

const here = path.dirname(fileURLToPath(import.meta.url));
export const DEMO = path.resolve(here, '..', '..', 'demo', 'demo.py');

/** Environment the TAP wrapper (test/apps/050_console.pl) sets. */
export const env = {
  superDsn: required('DURABLE_LEDGER_DSN'),     // a superuser, by trust on the socket
  target: required('CONSOLE_DATABASE'),          // the console's --database (no user)
  workerDsn: required('CONSOLE_WORKER_DSN'),     // libpq string of the worker role (demo.py)
  chromium: process.env.CHROMIUM ?? '/usr/bin/chromium',
  screenshots: process.env.CONSOLE_SCREENSHOTS ?? path.join(here, 'screenshots'),
};

function required(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run these tests through test/apps/050_console.pl`);
  return v;
}

/** Polls `check` until it returns something truthy; fails after `seconds`. */
export async function waitFor(what, check, seconds = 60) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export async function superuser() {
  const client = new pg.Client({ connectionString: env.superDsn });
  await client.connect();
  return client;
}

/** A console in this process, on a free loopback port. */
export async function startConsole(options = {}) {
  const app = await buildApp({ target: parseTarget(env.target), queueRefreshSeconds: 3600, ...options });
  const url = await app.listen({ host: '127.0.0.1', port: 0 });
  return { app, url };
}

/**
 * demo.py as a worker ("ledger" role): resolves with its output and exit
 * code; `until` resolves early, with the process still running, once a line
 * of its output matches.
 */
export function worker(args, { until } = {}) {
  const child = spawn('/usr/bin/python3', [DEMO, 'ledger', '--dsn', env.workerDsn, ...args],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stderr.on('data', (d) => { err += d; });
  return new Promise((resolve, reject) => {
    child.stdout.on('data', (d) => {
      out += d;
      if (until && until.test(out)) resolve({ child, out });
    });
    child.on('error', reject);
    child.on('exit', (code, signal) => resolve({ child, out, err, code, signal }));
  });
}

export async function launchBrowser() {
  mkdirSync(env.screenshots, { recursive: true });
  return puppeteer.launch({
    executablePath: env.chromium,
    headless: true,
    // the tests run as root or the cluster's OS user, in a container: no
    // user-namespace sandbox there; the browser loads only this console
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
    defaultViewport: { width: 1400, height: 900 },
  });
}

export async function screenshot(page, name) {
  await page.screenshot({ path: path.join(env.screenshots, `${name}.png`), fullPage: true });
}

/** Logs in on the page; returns the response of the form's POST. */
export async function login(page, url, user, password) {
  await page.goto(`${url}/login`);
  await page.type('input[name=user]', user);
  await page.type('input[name=password]', password);
  const [response] = await Promise.all([page.waitForNavigation(), page.click('section.login button')]);
  return response;
}

/** Submits a form of the page and waits for the page it leads to. */
export async function submit(page, formSelector) {
  await Promise.all([page.waitForNavigation(), page.$eval(formSelector, (f) => f.requestSubmit())]);
}

export async function flash(page) {
  return page.$eval('#flash', (el) => el.textContent.replace(/\s+/g, ' ').trim()).catch(() => null);
}

/** The backends this role has open through the console. */
export async function consoleBackends(db, role) {
  const { rows } = await db.query(
    `SELECT pid FROM pg_stat_activity WHERE usename = $1 AND application_name = 'durable_ledger_console'`, [role]);
  return rows.length;
}
