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

/** A role's libpq URL on the cluster's socket (the console's --database, with a user and password). */
export function roleUrl(user, password) {
  const { host, port, database } = parseTarget(env.target);
  return `postgresql://${encodeURIComponent(user)}:${encodeURIComponent(password)}@/${encodeURIComponent(database)}` +
    `?host=${encodeURIComponent(host)}&port=${port}`;
}

/** The console's encoding of a key, run or tool in a form field (src/ids.js). */
export const encodedId = (value) => Buffer.from(value, 'utf8').toString('base64url');

const unescapeHtml = (s) => s.replace(/&(#39|quot|lt|gt|amp);/g, (m, e) =>
  ({ '#39': "'", quot: '"', lt: '<', gt: '>', amp: '&' })[e]);

/** The named fields of a form of a page (its hidden inputs and the values its inputs hold), by the form's id. */
export function formFields(html, formId) {
  const form = html.match(new RegExp(`<form[^>]*id="${formId}"[^>]*>([\\s\\S]*?)</form>`));
  if (!form) throw new Error(`the page has no form #${formId}`);
  const fields = {};
  for (const input of form[1].matchAll(/<input\b([^>]*)>/g)) {
    const name = input[1].match(/\bname="([^"]*)"/);
    const value = input[1].match(/\bvalue="([^"]*)"/);
    if (name && !/type="radio"/.test(input[1])) fields[unescapeHtml(name[1])] = value ? unescapeHtml(value[1]) : '';
  }
  return fields;
}

/**
 * A person's browser as plain HTTP (a cookie jar): logs in, GETs pages, and
 * POSTs the console's forms as a browser does, following the redirect to
 * read what the action said.
 */
export async function httpPerson(url, user, password, { origin = url, headers = {} } = {}) {
  const jar = new Map();
  const keep = (response) => {
    for (const c of response.headers.getSetCookie()) {
      const [pair] = c.split(';');
      const i = pair.indexOf('=');
      jar.set(pair.slice(0, i), pair.slice(i + 1));
    }
  };
  const cookie = () => [...jar].map(([k, v]) => `${k}=${v}`).join('; ');
  const page = await fetch(`${url}/login`, { headers });
  keep(page);
  const token = (await page.text()).match(/name="_csrf" value="([^"]+)"/)[1];
  const response = await fetch(`${url}/login`, {
    method: 'POST', redirect: 'manual',
    headers: { ...headers, cookie: cookie(), origin, 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ _csrf: token, user, password }),
  });
  keep(response);
  const person = {
    response,
    jar,
    cookie,
    async get(path) {
      const r = await fetch(new URL(path, url), { headers: { ...headers, cookie: cookie() }, redirect: 'manual' });
      return { status: r.status, location: r.headers.get('location'), text: await r.text(), headers: r.headers };
    },
    /** POSTs `fields` to /act/<action>; returns the status and the message of the page it led to. */
    async act(action, fields) {
      const r = await fetch(`${url}/act/${action}`, {
        method: 'POST', redirect: 'manual',
        headers: { ...headers, cookie: cookie(), origin, 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams(fields),
      });
      if (r.status !== 303) return { status: r.status, said: await r.text() };
      const shown = await person.get(r.headers.get('location'));
      // the message's box closes on a line of its own (layout.njk)
      const said = shown.text.match(/id="flash">([\s\S]*?)\n  <\/div>/);
      const text = (said?.[1] ?? '').replace(/<[^>]+>/g, ' ').replace(/\s+/g, ' ').trim();
      return { status: r.status, said: unescapeHtml(text), page: shown };
    },
  };
  return person;
}
