// The people logged in: one PostgreSQL connection each, opened with their own
// credentials, held in this process's memory only and closed at logout, after
// the idle timeout, or when PostgreSQL ends it.  The console has no database
// account of its own: everything a person sees or does goes through their
// connection, so PostgreSQL decides what they may do and the audit log records
// who did it.
import { randomBytes } from 'node:crypto';
import pg from 'pg';

export const ATTENTION_CHANNEL = 'durable_ledger_attention';
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
    this.lastSeen = Date.now();
    this.streams = new Set();  // open server-sent-event replies of this person
    this.flash = null;         // the message of the last action, shown once
  }

  /** A query as this person (their role, their privileges). */
  query(text, values) {
    return this.client.query(text, values);
  }
}

export class Sessions {
  /**
   * @param {object} target  where to connect: host, port, database (pg's names)
   * @param {object} opts    idleTimeoutMs, allowSuperuser, log
   */
  constructor(target, { idleTimeoutMs, allowSuperuser = false, log = console }) {
    this.target = target;
    this.idleTimeoutMs = idleTimeoutMs;
    this.allowSuperuser = allowSuperuser;
    this.log = log;
    this.byId = new Map();
    this.sweeper = setInterval(() => this.sweep(), Math.min(Math.max(idleTimeoutMs / 4, 250), 30000));
    this.sweeper.unref();
  }

  /**
   * Opens a connection as `user` with `password` (PostgreSQL checks them: SCRAM
   * where pg_hba.conf says so) and returns the new session.  The password is
   * not kept: it reaches only the driver's connect.
   */
  async login(user, password) {
    const client = new pg.Client({
      ...this.target,
      user,
      password,
      application_name: APPLICATION_NAME,
      // a page must never hang on a lock: a statement waits 30 s at most
      statement_timeout: 30000,
      connectionTimeoutMillis: 10000,
    });
    // the driver keeps the config it was given; the password is needed only
    // until the connection is authenticated
    client.on('error', () => {});
    try {
      await client.connect();
    } catch (err) {
      throw new LoginRefused(loginMessage(err), err.code);
    } finally {
      client.password = null;
      if (client.connectionParameters) client.connectionParameters.password = null;
    }
    let role;
    try {
      const { rows } = await client.query(
        'SELECT current_user AS role, r.rolsuper AS superuser FROM pg_catalog.pg_roles r WHERE r.rolname = current_user');
      role = rows[0].role;
      if (rows[0].superuser && !this.allowSuperuser) {
        throw new LoginRefused(
          'the console does not log in superusers: log in as a role that holds a ledger role ' +
          '(durable_ledger_admin, durable_ledger_auditor, durable_ledger_approver), or start it with --allow-superuser',
          '28000');
      }
      await client.query(`LISTEN ${ATTENTION_CHANNEL}`);
    } catch (err) {
      await client.end().catch(() => {});
      if (err instanceof LoginRefused) throw err;
      throw new LoginRefused(`PostgreSQL: ${err.message}`, err.code);
    }
    const id = randomBytes(32).toString('base64url');
    const session = new Session(id, role, client);
    client.on('notification', (msg) => {
      if (msg.channel !== ATTENTION_CHANNEL) return;
      for (const stream of session.streams) stream(msg.payload);
    });
    // the backend ended (terminated, the server restarted, the role dropped
    // and its sessions ended): the person is logged out
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
    for (const stream of session.streams) stream(null);
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
