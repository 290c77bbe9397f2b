// The people logged in: one PostgreSQL connection each, opened with their own
// credentials, held in this process's memory only and closed at logout, after
// the idle timeout, or when PostgreSQL ends it.  The console has no database
// account of its own: everything a person sees or does goes through their
// connection, so PostgreSQL decides what they may do and the audit log records
// who did it.
import { randomBytes } from 'node:crypto';
import pg from 'pg';

export const ATTENTION_CHANNEL = 'durable_ledger_attention';
// the roles whose members the console is for (a worker has nothing to see here)
export const LEDGER_ROLES = ['durable_ledger_admin', 'durable_ledger_auditor', 'durable_ledger_approver'];
const APPLICATION_NAME = 'durable_ledger_console';

export class LoginRefused extends Error {
  constructor(message, code) {
    super(message);
    this.code = code;
  }
}

class Session {
  constructor(id, role, client) {
    this.id = id;
    this.role = role;
    this.client = client;
    this.createdAt = Date.now();
    this.lastSeen = Date.now();
    this.streams = new Set();  // open server-sent-event streams of this person
    this.flashes = new Map();  // what an action said, by the id its redirect names
  }

  /** A query as this person (their role, their privileges). */
  query(text, values) {
    return this.client.query(text, values);
  }

  /** Keeps what an action said for the page its redirect leads to; returns its id. */
  say(message) {
    const id = randomBytes(9).toString('base64url');
    this.flashes.set(id, message);
    while (this.flashes.size > 20) this.flashes.delete(this.flashes.keys().next().value);
    return id;
  }

  /** What the action with this id said, once. */
  heard(id) {
    const message = (id && this.flashes.get(id)) ?? null;
    if (message) this.flashes.delete(id);
    return message;
  }
}

export class Sessions {
  /**
   * @param {object} target  where to connect: host, port, database (pg's names)
   * @param {object} opts    idleTimeoutMs, maxSessionsPerRole, allowSuperuser, log
   */
  constructor(target, { idleTimeoutMs, maxSessionsPerRole = 4, allowSuperuser = false, log = console }) {
    this.target = target;
    this.idleTimeoutMs = idleTimeoutMs;
    this.maxSessionsPerRole = maxSessionsPerRole;
    this.allowSuperuser = allowSuperuser;
    this.log = log;
    this.byId = new Map();
    this.sweeper = setInterval(() => this.sweep(), Math.min(Math.max(idleTimeoutMs / 4, 250), 30000));
    this.sweeper.unref();
  }

  /**
   * Opens a connection as `user` with `password` (PostgreSQL checks them: SCRAM
   * where pg_hba.conf says so) and returns the new session.  The password is
   * not kept: it reaches only the driver, when PostgreSQL asks for it; a server
   * that never asks (trust, peer) checked nothing, and the login is refused.
   * `replacing` is the session the browser had, which this one ends.
   */
  async login(user, password, { replacing } = {}) {
    // Empty fields would let the driver fill them in from the console's own
    // environment (PGUSER, PGPASSWORD, ~/.pgpass); a control character in the
    // user name would end it early in the startup packet and add parameters
    // of the typist's choice (options=-c role=...).
    if (!user || !password) throw new LoginRefused('give your user name and your password', '28000');
    if (/[\u0000-\u001f\u007f]/.test(user) || password.includes('\u0000')) {
      throw new LoginRefused('PostgreSQL refused the login: wrong user name or password, or the role may not log in', '28000');
    }
    let asked = false;
    const client = new pg.Client({
      ...this.target,
      user,
      password: () => {
        asked = true;
        return password;
      },
      application_name: APPLICATION_NAME,
      // a page must never hang on a lock: a statement waits 30 s at most
      statement_timeout: 30000,
      connectionTimeoutMillis: 10000,
    });
    client.on('error', () => {});
    try {
      await client.connect();
    } catch (err) {
      throw new LoginRefused(loginMessage(err), err.code);
    } finally {
      // the driver keeps what the password function returned
      client.password = null;
      if (client.connectionParameters) client.connectionParameters.password = null;
    }
    let role;
    try {
      if (!asked) {
        throw new LoginRefused(
          'PostgreSQL did not ask for a password (pg_hba.conf trusts this connection): the console logs in ' +
          'only roles whose password PostgreSQL checks (scram-sha-256 in pg_hba.conf)', '28000');
      }
      const { rows } = await client.query(
        `SELECT session_user AS role, current_user = session_user AS own, r.rolsuper AS superuser,
                ${LEDGER_ROLES.map((g) => `pg_catalog.pg_has_role(session_user, '${g}', 'USAGE')`).join(' OR ')} AS ledger
           FROM pg_catalog.pg_roles r WHERE r.rolname = session_user`);
      const me = rows[0];
      role = me.role;
      if (!me.own) throw new LoginRefused('the login set another role than its own: refused', '28000');
      if (me.superuser && !this.allowSuperuser) {
        throw new LoginRefused(
          'the console does not log in superusers: log in as a role that holds a ledger role ' +
          '(durable_ledger_admin, durable_ledger_auditor, durable_ledger_approver), or start it with --allow-superuser',
          '28000');
      }
      if (!me.ledger && !me.superuser) {
        throw new LoginRefused(
          `role ${role} holds none of ${LEDGER_ROLES.join(', ')}: the console has nothing to show it ` +
          '(GRANT durable_ledger_auditor TO ..., or _admin, _approver)', '42501');
      }
      await client.query(`LISTEN ${ATTENTION_CHANNEL}`);
    } catch (err) {
      await client.end().catch(() => {});
      if (err instanceof LoginRefused) throw err;
      throw new LoginRefused(`PostgreSQL: ${err.message}`, err.code);
    }
    if (replacing) await this.drop(replacing);
    // a role holds a few sessions at most: its oldest ends (each is a backend)
    const own = [...this.byId.values()].filter((x) => x.role === role).sort((a, b) => a.createdAt - b.createdAt);
    for (const old of own.slice(0, Math.max(0, own.length - this.maxSessionsPerRole + 1))) await this.drop(old.id);
    const id = randomBytes(32).toString('base64url');
    const session = new Session(id, role, client);
    client.on('notification', (msg) => {
      if (msg.channel !== ATTENTION_CHANNEL) return;
      for (const stream of session.streams) stream.notify();
    });
    // the backend ended (terminated, the server restarted): the person is
    // logged out
    client.on('end', () => this.drop(id));
    this.byId.set(id, session);
    return session;
  }

  /** The live session with this id, or null; `touch` counts it as the person's activity. */
  get(id, { touch = true } = {}) {
    const session = id ? this.byId.get(id) : undefined;
    if (!session) return null;
    if (Date.now() - session.lastSeen > this.idleTimeoutMs) {
      this.drop(id);
      return null;
    }
    if (touch) session.lastSeen = Date.now();
    return session;
  }

  async logout(id) {
    await this.drop(id);
  }

  async drop(id) {
    const session = this.byId.get(id);
    if (!session) return;
    this.byId.delete(id);
    for (const stream of session.streams) stream.end();
    session.streams.clear();
    await session.client.end().catch(() => {});
  }

  sweep() {
    const now = Date.now();
    for (const [id, session] of this.byId) {
      if (now - session.lastSeen > this.idleTimeoutMs) this.drop(id);
    }
  }

  async close() {
    clearInterval(this.sweeper);
    await Promise.all([...this.byId.keys()].map((id) => this.drop(id)));
  }
}

// What a person is told when PostgreSQL refuses the login: the same words for
// a wrong password and a role that does not exist (PostgreSQL's own rule), the
// server's words for anything else.
function loginMessage(err) {
  if (err.code === '28P01' || err.code === '28000') {
    return 'PostgreSQL refused the login: wrong user name or password, or the role may not log in';
  }
  if (err.code) return `PostgreSQL refused the login (${err.code}): ${err.message}`;
  return `could not reach PostgreSQL: ${err.message}`;
}
