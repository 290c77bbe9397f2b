// The console's web server: server-rendered pages (nunjucks, escaped by
// default), forms that POST with a CSRF token, htmx for the live queue, and a
// server-sent-event stream fed by each person's own LISTEN.
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
import * as ledger from './ledger.js';
import { ACTIONS, recordedName, refusal } from './actions.js';
import { addFilters } from './filters.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const SESSION_COOKIE = 'dl_console';
const LIVE_ROUTES = new Set(['/events', '/queue/rows']);

/**
 * @param {object} options
 *   target: where PostgreSQL is ({host, port, database}: pg's names)
 *   idleTimeoutMs: a person idle this long is logged out (default 15 minutes)
 *   loginLimit: login attempts per client address and minute (default 10)
 *   queueRefreshSeconds: the queue is also re-read this often (default 15), for
 *     what no notification announces (a lease that ended with its worker)
 *   secure: cookies only over TLS (set when the console serves https)
 *   allowSuperuser: let superusers log in (default no)
 *   https: fastify's https options (key, cert), or undefined
 *   logger: fastify's logger option
 */
export async function buildApp(options) {
  const {
    target,
    idleTimeoutMs = 15 * 60 * 1000,
    loginLimit = 10,
    queueRefreshSeconds = 15,
    allowSuperuser = false,
    https,
    logger = false,
  } = options;
  const secure = Boolean(https);
  const app = Fastify({ logger, https, trustProxy: false });
  const sessions = new Sessions(target, { idleTimeoutMs, allowSuperuser });
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
    referrerPolicy: { policy: 'no-referrer' },
  });
  await app.register(cookie);
  await app.register(formbody, { bodyLimit: 1024 * 1024 });
  await app.register(csrf, {
    cookieOpts: { path: '/', sameSite: 'strict', httpOnly: true, secure },
  });
  await app.register(rateLimit, { global: false });
  const assets = [
    ['htmx.min.js', path.dirname(require.resolve('htmx.org/dist/htmx.min.js'))],
    ['sse.js', path.dirname(require.resolve('htmx-ext-sse/dist/sse.min.js'))],
  ];
  await app.register(fastifyStatic, { root: path.join(here, '..', 'public'), prefix: '/static/' });
  for (const [name, dir] of assets) {
    app.get(`/static/vendor/${name}`, (req, reply) =>
      reply.sendFile(name === 'sse.js' ? 'sse.min.js' : name, dir, { maxAge: 3600 * 1000 }));
  }

  // Who is asking: the session of the cookie, or a redirect to the login page.
  app.decorateRequest('person', null);
  app.addHook('preHandler', async (req, reply) => {
    const url = req.routeOptions.url ?? '';
    if (url === '/login' || url.startsWith('/static/')) return;
    // the live queue's own requests (its stream, its re-reads) are not the
    // person's activity: a page left open still logs them out when idle
    const person = sessions.get(req.cookies[SESSION_COOKIE], { touch: !LIVE_ROUTES.has(url) });
    if (!person) {
      if (req.method === 'GET' && url !== '/events' && !req.headers['hx-request']) {
        return reply.redirect('/login', 303);
      }
      // an open page's own re-read: htmx takes the page to the login
      if (req.headers['hx-request']) reply.header('HX-Redirect', '/login');
      return reply.code(401).type('text/plain').send('not logged in (or logged out after being idle): log in again');
    }
    req.person = person;
  });

  // A page: its template with what every page shows (the role, the buttons it may see).
  async function render(req, reply, template, context = {}, can = null) {
    const person = req.person;
    const flash = person?.flash ?? null;
    if (person) person.flash = null;
    const html = views.render(template, {
      ...context,
      role: person?.role ?? null,
      can: can ?? (person ? await ledger.privileges(person) : {}),
      csrf: reply.generateCsrf(),
      flash,
      refreshSeconds: queueRefreshSeconds,
    });
    return reply.type('text/html; charset=utf-8').send(html);
  }

  // A read that failed (a role without the grant it needs): shown on the page.
  async function page(req, reply, template, load) {
    const can = await ledger.privileges(req.person);
    let context;
    try {
      context = await load(can);
    } catch (err) {
      if (!err.code) throw err;
      return render(req, reply, 'refused.njk', { error: refusal(err) }, can);
    }
    if (context === null) return reply.code(404).send(views.render('missing.njk', {}));
    return render(req, reply, template, context, can);
  }

  app.get('/login', (req, reply) => render(req, reply, 'login.njk', { error: null }));
  app.post('/login', {
    preHandler: app.csrfProtection,
    config: { rateLimit: { max: loginLimit, timeWindow: '1 minute' } },
  }, async (req, reply) => {
    const user = String(req.body?.user ?? '');
    const password = String(req.body?.password ?? '');
    try {
      const person = await sessions.login(user, password);
      reply.setCookie(SESSION_COOKIE, person.id, { path: '/', httpOnly: true, sameSite: 'strict', secure });
      return reply.redirect('/', 303);
    } catch (err) {
      if (!(err instanceof LoginRefused)) throw err;
      reply.code(401);
      return render(req, reply, 'login.njk', { error: err.message, user });
    }
  });
  app.post('/logout', { preHandler: app.csrfProtection }, async (req, reply) => {
    await sessions.logout(req.person.id);
    reply.clearCookie(SESSION_COOKIE, { path: '/' });
    return reply.redirect('/login', 303);
  });

  app.get('/', (req, reply) => page(req, reply, 'queue.njk', async () => ledger.queue(req.person)));
  app.get('/queue/rows', (req, reply) =>
    page(req, reply, 'queue_rows.njk', async () => ledger.queue(req.person)));

  // The live queue: a notification on this person's connection (LISTEN
  // durable_ledger_attention) tells the page to re-read it.  The payload is
  // not passed on: anyone may NOTIFY the channel, so it is only a cue.
  app.get('/events', (req, reply) => {
    const person = req.person;
    reply.hijack();
    const res = reply.raw;
    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-store',
      connection: 'keep-alive',
    });
    res.write(': the ledger\'s attention channel\n\n');
    const stream = (payload) => {
      if (payload === null) {
        res.end();
        return;
      }
      res.write('event: attention\ndata: changed\n\n');
    };
    const heartbeat = setInterval(() => res.write(': still here\n\n'), 20000);
    person.streams.add(stream);
    req.raw.on('close', () => {
      clearInterval(heartbeat);
      person.streams.delete(stream);
    });
  });

  app.get('/effect', (req, reply) => page(req, reply, 'effect.njk', async (can) => {
    const found = await ledger.effect(req.person, String(req.query.key ?? ''), can);
    return found && { ...found, key: String(req.query.key) };
  }));
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

  // A button: one ledger call as the person; then back to the page it came
  // from, which shows what PostgreSQL said.
  app.post('/act/:action', { preHandler: app.csrfProtection }, async (req, reply) => {
    const action = ACTIONS[req.params.action];
    const form = req.body ?? {};
    const person = req.person;
    const back = localPath(form.back);
    if (!action) return reply.code(404).type('text/plain').send('no such action');
    try {
      const { rows } = await person.query(action.sql, action.args(form, recordedName(person.role, form.name)));
      person.flash = { kind: 'done', message: action.done(form, rows) };
      return reply.redirect(action.back ? action.back(form) : back, 303);
    } catch (err) {
      if (!err.code) throw err;
      person.flash = { kind: 'error', ...refusal(err) };
      return reply.redirect(back, 303);
    }
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

// Only a path of this console: never another site (an open redirect).
function localPath(value) {
  const s = String(value ?? '/');
  return /^\/(?![/\\])[^\s]*$/.test(s) ? s : '/';
}
