// The console's web server: server-rendered pages (nunjucks, escaped by
// default), forms that POST with a CSRF token, htmx for the live queue, and a
// server-sent-event stream fed by each person's own LISTEN.
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Fastify from 'fastify';
import cookie from '@fastify/cookie';
import csrf from '@fastify/csrf-protection';
import formbody from '@fastify/formbody';
import helmet from '@fastify/helmet';
import rateLimit from '@fastify/rate-limit';
import fastifyStatic from '@fastify/static';
import nunjucks from 'nunjucks';
import { Sessions, LoginRefused } from './sessions.js';
import { LoginThrottle } from './throttle.js';
import * as ledger from './ledger.js';
import { ACTIONS, BadForm, recordedName, refusal, StalePage } from './actions.js';
import { decodeId } from './ids.js';
import { addFilters } from './filters.js';
import { openStream } from './stream.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
// the live queue's own requests (its stream, its re-reads) are not the
// person's activity: a page left open still logs them out when idle
const LIVE_ROUTES = new Set(['/events', '/queue/rows']);
const OPEN_ROUTES = new Set(['/login']);
// what the login form's token is bound to (no session id has this shape)
const NO_SESSION = 'no session';

/**
 * @param {object} options
 *   target: where PostgreSQL is ({host, port, database}: pg's names)
 *   idleTimeoutMs: a person idle this long is logged out (default 15 minutes)
 *   loginLimit: failed logins per client address and user name a minute (default 10)
 *   maxSessionsPerRole: a role's sessions at once; a new login ends its oldest (default 4)
 *   queueRefreshSeconds: the queue is also re-read this often (default 15), for
 *     what no notification announces (a lease that ended with its worker)
 *   allowSuperuser: let superusers log in (default no)
 *   https: fastify's https options (key, cert), or undefined
 *   publicOrigin: the https:// origin people reach the console at, through a
 *     TLS-terminating proxy that forwards to it on loopback: the origin forms
 *     must come from, and the cookies are then Secure (and __Host-)
 *   logger: fastify's logger option
 */
export async function buildApp(options) {
  const {
    target,
    idleTimeoutMs = 15 * 60 * 1000,
    loginLimit = 10,
    maxSessionsPerRole = 4,
    queueRefreshSeconds = 15,
    allowSuperuser = false,
    https,
    logger = false,
  } = options;
  const publicOrigin = options.publicOrigin === undefined ? undefined : httpsOrigin(options.publicOrigin);
  // the browser reaches the console over TLS: its own, or a proxy's
  const secure = Boolean(https) || publicOrigin !== undefined;
  // under TLS the cookies are __Host-: sent only to this origin, never set by a sibling
  const SESSION_COOKIE = secure ? '__Host-dl_console' : 'dl_console';
  const SESSION_COOKIE_OPTIONS = { path: '/', httpOnly: true, sameSite: 'strict', secure };
  // Behind a TLS-terminating proxy on loopback (publicOrigin), the client's
  // address is the one the proxy adds to X-Forwarded-For: the login limits
  // count per person's address, not all people as the proxy's one.
  const app = Fastify({ logger, https, trustProxy: publicOrigin !== undefined ? 'loopback' : false });
  const sessions = new Sessions(target, { idleTimeoutMs, maxSessionsPerRole, allowSuperuser });
  const throttle = new LoginThrottle(loginLimit);
  app.addHook('onClose', () => sessions.close());

  const views = new nunjucks.Environment(
    new nunjucks.FileSystemLoader(path.join(here, '..', 'views'), { noCache: false }),
    { autoescape: true, throwOnUndefined: false });
  addFilters(views);

  await app.register(helmet, {
    // a strict policy: nothing inline, nothing from elsewhere (htmx and the
    // stylesheet come from this server); no upgrade-insecure-requests, which
    // would break a console served over plain http on loopback
    contentSecurityPolicy: {
      useDefaults: false,
      directives: {
        defaultSrc: ["'none'"],
        scriptSrc: ["'self'"],
        styleSrc: ["'self'"],
        imgSrc: ["'self'"],
        connectSrc: ["'self'"],
        formAction: ["'self'"],
        frameAncestors: ["'none'"],
        baseUri: ["'none'"],
      },
    },
    strictTransportSecurity: secure,
    // same-origin, not no-referrer: under no-referrer a browser sends
    // "Origin: null" with the console's own forms, which the check below
    // could not tell from a forged one
    referrerPolicy: { policy: 'same-origin' },
  });
  await app.register(cookie);
  await app.register(formbody, { bodyLimit: 1024 * 1024 });
  // The token is bound to a secret cookie and to the session (the login
  // form's to no session): a token made for another cookie, another session
  // or none is refused.
  await app.register(csrf, {
    cookieKey: secure ? '__Host-dl_csrf' : 'dl_csrf',
    cookieOpts: { path: '/', sameSite: 'strict', httpOnly: true, secure },
    getUserInfo: (req) => req.person?.id ?? NO_SESSION,
    csrfOpts: { hmacKey: randomBytes(32) },
  });
  await app.register(rateLimit, { global: false });
  await app.register(fastifyStatic, { root: path.join(here, '..', 'public'), prefix: '/static/' });
  const vendor = {
    'htmx.min.js': require.resolve('htmx.org/dist/htmx.min.js'),
    'sse.js': require.resolve('htmx-ext-sse/dist/sse.min.js'),
  };
  for (const [name, file] of Object.entries(vendor)) {
    app.get(`/static/vendor/${name}`, (req, reply) =>
      reply.sendFile(path.basename(file), path.dirname(file), { maxAge: 3600 * 1000 }));
  }

  // A form posted from anywhere but this console's own pages is refused,
  // before anything else: SameSite does not tell another port of this host,
  // or a sibling name, from this origin; the browser's Origin header does.
  app.addHook('onRequest', async (req, reply) => {
    if (req.method !== 'POST') return;
    const origin = req.headers.origin;
    const site = req.headers['sec-fetch-site'];
    const own = publicOrigin ?? `${https ? 'https' : 'http'}://${req.headers.host}`;
    if ((origin !== undefined && origin !== own) || (site !== undefined && site !== 'same-origin')) {
      return reply.code(403).type('text/plain').send('refused: the form was not sent from this console\'s own pages');
    }
  });

  // Nothing the console sends is kept by the browser or a proxy (the back
  // button after logout must not show a page), but its static files.
  app.addHook('onSend', async (req, reply) => {
    if (!req.url.startsWith('/static/')) reply.header('cache-control', 'no-store');
  });

  // Who is asking: the session of the cookie, and what their role may do now
  // (asked of PostgreSQL on every request: a role whose login was revoked or
  // that was dropped is logged out); or a redirect to the login page.
  app.decorateRequest('person', null);
  app.decorateRequest('can', null);
  app.addHook('preHandler', async (req, reply) => {
    const url = req.routeOptions.url ?? '';
    if (OPEN_ROUTES.has(url) || url.startsWith('/static/')) return;
    let person = sessions.get(req.cookies[SESSION_COOKIE], { touch: !LIVE_ROUTES.has(url) });
    if (person) {
      try {
        req.can = await ledger.privileges(person);
      } catch (err) {
        if (err.code && !person.closed && !/^(08|57P)/.test(err.code)) {
          // the connection works, the question failed (a statement timeout):
          // that is no reason to log the person out
          return reply.code(503).type('text/plain')
            .send(`the console could not ask PostgreSQL what your role may do now (${err.code}: ${err.message}); try again`);
        }
        req.can = null;  // the connection failed or ended: logged out below
      }
      if (!req.can?.may_log_in) {
        await sessions.drop(person.id);
        person = null;
      }
    }
    if (!person) {
      if (req.method === 'GET' && url !== '/events' && !req.headers['hx-request']) {
        return reply.redirect('/login', 303);
      }
      // an open page's own re-read: htmx takes the page to the login
      if (req.headers['hx-request']) reply.header('HX-Redirect', '/login');
      return reply.code(401).type('text/plain').send('not logged in (or logged out): log in again');
    }
    req.person = person;
  });

  // A page: its template with what every page shows (the role, the buttons it
  // may see, what the action that led here said).
  function render(req, reply, template, context = {}) {
    const person = req.person;
    const html = views.render(template, {
      ...context,
      // the role's name now (it may have been renamed since the login)
      role: req.can?.role ?? person?.role ?? null,
      can: req.can ?? {},
      csrf: reply.generateCsrf({ userInfo: person?.id ?? NO_SESSION }),
      flash: context.flash ?? person?.heard(String(req.query?.done ?? '')) ?? null,
      refreshSeconds: queueRefreshSeconds,
    });
    return reply.type('text/html; charset=utf-8').send(html);
  }

  // A page's reads; a read the role may not make (a grant revoked since the
  // login) is shown on the page, with the way out.
  async function page(req, reply, template, load) {
    let context;
    try {
      context = await load(req.can);
    } catch (err) {
      if (!err.code) throw err;
      return render(req, reply, 'refused.njk', { error: refusal(err) });
    }
    if (context === null) return reply.code(404).type('text/html; charset=utf-8').send(views.render('missing.njk', {}));
    return render(req, reply, template, context);
  }

  app.get('/login', (req, reply) => render(req, reply, 'login.njk', { error: null }));
  app.post('/login', {
    preHandler: app.csrfProtection,
    // every login request of an address, good or bad (each opens a connection)
    config: { rateLimit: { max: Math.max(60, loginLimit * 3), timeWindow: '1 minute' } },
  }, async (req, reply) => {
    const user = String(req.body?.user ?? '');
    const password = String(req.body?.password ?? '');
    // logins PostgreSQL has not answered yet count as failures until it does
    const { wait, key } = throttle.begin(req.ip, user);
    if (wait > 0) {
      reply.code(429);
      return render(req, reply, 'login.njk', {
        error: `too many failed logins for ${user} from your address (or too many at once): try again in ${Math.ceil(wait / 1000)} s`, user,
      });
    }
    let ok = false;
    try {
      const person = await sessions.login(user, password, { replacing: req.cookies[SESSION_COOKIE] });
      ok = true;
      reply.setCookie(SESSION_COOKIE, person.id, SESSION_COOKIE_OPTIONS);
      return reply.redirect('/', 303);
    } catch (err) {
      if (!(err instanceof LoginRefused)) throw err;
      reply.code(401);
      return render(req, reply, 'login.njk', { error: err.message, user });
    } finally {
      throttle.finished(key, ok);
    }
  });
  app.post('/logout', { preHandler: app.csrfProtection }, async (req, reply) => {
    await sessions.logout(req.person.id);
    // with the attributes it was set with (a __Host- cookie is cleared only by a Secure one)
    reply.clearCookie(SESSION_COOKIE, SESSION_COOKIE_OPTIONS);
    return reply.redirect('/login', 303);
  });

  app.get('/', (req, reply) => page(req, reply, 'queue.njk', async () => ledger.queue(req.person)));
  // the live queue's re-read: a fragment, which never takes what an action said
  app.get('/queue/rows', (req, reply) =>
    page(req, reply, 'queue_rows.njk', async () => ({ ...(await ledger.queue(req.person)), flash: false })));

  // The live queue: a notification on this person's connection (LISTEN
  // durable_ledger_attention) tells the page to re-read it.  The payload is
  // not passed on: anyone may NOTIFY the channel, so it is only a cue.
  app.get('/events', (req, reply) => {
    if (!req.can.read_unresolved) return reply.code(403).type('text/plain').send('your role may not read the queue');
    reply.hijack();
    openStream(req.person, req.raw, reply.raw);
  });

  app.get('/effect', (req, reply) => page(req, reply, 'effect.njk', async (can) =>
    ledger.effect(req.person, String(req.query.key ?? ''), can)));
  app.get('/divergence', (req, reply) => page(req, reply, 'divergence.njk', async () =>
    ledger.divergence(req.person, String(req.query.key ?? ''))));
  app.get('/run', (req, reply) => page(req, reply, 'run.njk', async (can) => ({
    runId: String(req.query.run ?? ''),
    ...(await ledger.run(req.person, String(req.query.run ?? ''), can)),
  })));
  app.get('/leases', (req, reply) => page(req, reply, 'leases.njk', async () =>
    ({ leases: await ledger.leases(req.person) })));
  app.get('/tools', (req, reply) => page(req, reply, 'tools.njk', async (can) =>
    ledger.tools(req.person, can)));
  app.get('/metrics', (req, reply) => page(req, reply, 'metrics.njk', async (can) =>
    ledger.metrics(req.person, can)));
  app.get('/audit', (req, reply) => page(req, reply, 'audit.njk', async (can) => {
    const verify = req.query.verify !== undefined;
    const heads = verify ? String(req.query.heads ?? '').trim() : undefined;
    return { ...(await ledger.audit(req.person, can, heads)), verified: verify, keptHeads: heads ?? '' };
  }));

  // A button: one ledger call as the person, in a transaction of its own
  // (an action that must check what the call answered rolls it back when the
  // page showed something else); then back to the page it came from, which
  // shows what PostgreSQL said.
  app.post('/act/:action', { preHandler: app.csrfProtection }, async (req, reply) => {
    if (!Object.hasOwn(ACTIONS, req.params.action)) return reply.code(404).type('text/plain').send('no such action');
    const action = ACTIONS[req.params.action];
    const form = { ...(req.body ?? {}) };
    const person = req.person;
    const back = localPath(form.back);
    let said;
    try {
      // the key, run or tool the page named, exactly (ids.js)
      for (const field of action.ids ?? []) {
        const value = decodeId(form[field]);
        if (value === null) throw new BadForm(`its field "${field}" does not name a key, run or tool as the console's pages do`);
        form[field] = value;
      }
      // the name recorded is the role's now (it may have been renamed since the login)
      const name = recordedName(req.can.role ?? person.role, form.name);
      // one exclusive use of the person's connection: no other request of
      // theirs (another tab, a double-click) comes between BEGIN and COMMIT
      const rows = await person.transaction(async (query) => {
        const { rows: answered } = await query(action.sql, action.args(form, name));
        action.check?.(form, answered);
        return answered;
      });
      said = { kind: 'done', message: action.done(form, rows) };
    } catch (err) {
      if (!err.code && !(err instanceof StalePage) && !(err instanceof BadForm)) throw err;
      said = { kind: 'error', ...refusal(err) };
    }
    const to = (said.kind === 'done' && action.back ? action.back(form) : back).replace(/([?&])done=[^&]*&?/, '$1').replace(/[?&]$/, '');
    return reply.redirect(`${to}${to.includes('?') ? '&' : '?'}done=${person.say(said)}`, 303);
  });

  app.setErrorHandler((err, req, reply) => {
    if (err.statusCode === 403 && /csrf/i.test(err.code ?? '')) {
      return reply.code(403).type('text/plain')
        .send('refused: the form was not sent by this console (its CSRF token is missing or wrong); reload the page');
    }
    if (err.statusCode === 429) return reply.code(429).type('text/plain').send(err.message);
    req.log.error(err);
    return reply.code(err.statusCode ?? 500).type('text/plain').send('the console failed: ' + err.message);
  });

  app.decorate('sessions', sessions);
  return app;
}

// An https:// origin (scheme, host, port; a trailing slash is allowed), as
// browsers write it in Origin; anything else is refused.
export function httpsOrigin(value) {
  let u;
  try {
    u = new URL(String(value));
  } catch {
    u = null;
  }
  if (!u || u.protocol !== 'https:' || u.username || u.password || u.pathname !== '/' || u.search || u.hash ||
      !/^https:\/\/[^/?#]+\/?$/.test(String(value))) {
    throw new Error(`--public-origin must be an https:// origin (https://host or https://host:port), not "${value}"`);
  }
  return u.origin;
}

// Only a path of this console: never another site (an open redirect).
function localPath(value) {
  const s = String(value ?? '/');
  return /^\/(?![/\\])[^\s]*$/.test(s) ? s : '/';
}
