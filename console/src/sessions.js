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

// json and jsonb reach the pages as PostgreSQL's own text: node-postgres's
// JSON.parse would turn numbers a double cannot hold into others
// (12345678901234567891 into 12345678901234567000, 1e400 into null)
export class JsonText {
  constructor(text) {
    this.text = text;
  }
}
const JSON_OIDS = new Set([114, 3802]);
const TYPES = {
  getTypeParser(oid, format) {
    if (JSON_OIDS.has(oid) && format !== 'binary') return (text) => new JsonText(text);
    return pg.types.getTypeParser(oid, format);
  },
};

// the ledger the console is made for, and the oldest it works with
export const NEEDS_EXTENSION = '1.3';

class Session {
  constructor(id, role, roleOid, client) {
    this.id = id;
    this.role = role;  // as read at login; a page shows, and an action records, session_user as it is now
    this.roleOid = roleOid;
    this.client = client;
    this.createdAt = Date.now();
    this.lastSeen = Date.now();
    this.streams = new Set();  // open server-sent-event streams of this person
    this.flashes = new Map();  // what an action said, by the id its redirect names
    // The person's requests (two tabs, a double-click, the live queue's
    // re-read) share the connection: each use of it waits for the one before
    // to end, and a transaction is one use, so nothing of another request
    // comes between its BEGIN and its COMMIT.
    this.tail = Promise.resolve();
    this.closed = false;  // logged out, or the connection ended
  }

  /** Runs fn() alone on the connection: no query of another request starts until it ends. */
  exclusive(fn) {
    const run = this.tail.then(fn, fn);
    this.tail = run.then(() => {}, () => {});
    return run;
  }

  /** A query as this person (their role, their privileges). */
  query(text, values) {
    return this.exclusive(() => this.client.query(text, values));
  }

  /**
   * fn(query) in a transaction of its own, as one exclusive use of the
   * connection: committed when fn returns, rolled back when it throws.
   */
  transaction(fn) {
    return this.exclusive(async () => {
      const query = (text, values) => this.client.query(text, values);
      await query('BEGIN');
      let result;
      try {
        result = await fn(query);
      } catch (err) {
        await query('ROLLBACK').catch(() => {});
        throw err;
      }
      // a COMMIT that fails (or finds the transaction aborted) commits nothing
      const done = await query('COMMIT');
      if (done.command !== 'COMMIT') throw new Error(`the transaction was not committed (${done.command})`);
      return result;
    });
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
    let refusedAuth = null;
    const client = new pg.Client({
      ...this.target,
      user,
      password: () => {
        // a server that asked for the password itself, or for its MD5 hash,
        // gets nothing (connect() fails): only a SCRAM proof leaves the console
        if (refusedAuth) throw new LoginRefused(refusedAuth, '28000');
        asked = true;
        return password;
      },
      application_name: APPLICATION_NAME,
      // a page must never hang on a lock: a statement waits 30 s at most
      statement_timeout: 30000,
      connectionTimeoutMillis: 10000,
      types: TYPES,
    });
    client.on('error', () => {});
    // These run before the driver's own handlers (attached by connect()),
    // which would send the password in clear text, or its MD5 hash (which
    // logs in as well as the password does, and is guessed offline).
    const refuse = (what) => () => {
      refusedAuth = `the server at the console's --database address asked for ${what}: the console sends a ` +
        'password only as a SCRAM proof (scram-sha-256 in pg_hba.conf, and the role\'s password stored as SCRAM), ' +
        'and sent nothing';
      client.connection.stream.destroy();
    };
    client.connection.on('authenticationCleartextPassword', refuse('the password in clear text'));
    client.connection.on('authenticationMD5Password', refuse('the password\'s MD5 hash'));
    try {
      await client.connect();
    } catch (err) {
      if (refusedAuth) throw new LoginRefused(refusedAuth, '28000');
      throw new LoginRefused(loginMessage(err), err.code);
    } finally {
      // the driver keeps what the password function returned
      client.password = null;
      if (client.connectionParameters) client.connectionParameters.password = null;
    }
    let role;
    let roleOid;
    try {
      if (refusedAuth) throw new LoginRefused(refusedAuth, '28000');
      if (!asked) {
        throw new LoginRefused(
          'PostgreSQL did not ask for a password (pg_hba.conf trusts this connection): the console logs in ' +
          'only roles whose password PostgreSQL checks (scram-sha-256 in pg_hba.conf)', '28000');
      }
      const { rows } = await client.query(
        `SELECT session_user AS role, r.oid::text AS oid, current_user = session_user AS own, r.rolsuper AS superuser,
                ${LEDGER_ROLES.map((g) => `pg_catalog.pg_has_role(session_user, '${g}', 'USAGE')`).join(' OR ')} AS ledger,
                (SELECT e.extversion FROM pg_catalog.pg_extension e WHERE e.extname = 'durable_ledger') AS version
           FROM pg_catalog.pg_roles r WHERE r.rolname = session_user`);
      const me = rows[0];
      role = me.role;
      roleOid = me.oid;
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
      if (me.version === null) {
        throw new LoginRefused(
          `durable_ledger is not installed in database ${client.database}: the console needs durable_ledger ` +
          `${NEEDS_EXTENSION} or later there (CREATE EXTENSION durable_ledger), or another --database`, '42704');
      }
      if (olderThan(me.version, NEEDS_EXTENSION)) {
        throw new LoginRefused(
          `the ledger in database ${client.database} is durable_ledger ${me.version}; the console needs ` +
          `${NEEDS_EXTENSION} or later (ALTER EXTENSION durable_ledger UPDATE, as its owner)`, '0A000');
      }
      await client.query(`LISTEN ${ATTENTION_CHANNEL}`);
    } catch (err) {
      await client.end().catch(() => {});
      if (err instanceof LoginRefused) throw err;
      throw new LoginRefused(`PostgreSQL: ${err.message}`, err.code);
    }
    if (replacing) await this.drop(replacing);
    // a role holds a few sessions at most: its oldest ends (each is a
    // backend); a role is its OID (a renamed role is the same role, and a
    // new role given its old name another)
    const own = [...this.byId.values()].filter((x) => x.roleOid === roleOid).sort((a, b) => a.createdAt - b.createdAt);
    for (const old of own.slice(0, Math.max(0, own.length - this.maxSessionsPerRole + 1))) await this.drop(old.id);
    const id = randomBytes(32).toString('base64url');
    const session = new Session(id, role, roleOid, client);
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
    session.closed = true;
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

// "1.2" < "1.3" < "1.10"
function olderThan(version, wanted) {
  const a = String(version).split('.').map(Number);
  const b = wanted.split('.').map(Number);
  for (let i = 0; i < Math.max(a.length, b.length); i += 1) {
    const x = a[i] ?? 0;
    const y = b[i] ?? 0;
    if (x !== y) return x < y;
  }
  return false;
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
