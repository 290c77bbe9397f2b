// The public types that have no code of their own: what a Ledger's methods take
// and return.  (Decision is in decisions.js, LedgerNotice in notices.js,
// Queryable in connection.js.)

/**
 * What a value becomes when the ledger records it (a JSON round trip), which guarded(),
 * record() and tools resolve to, on a first run and on a replay alike: a Date becomes its
 * ISO string (anything with toJSON, what that returns), undefined and functions become
 * null (in an object they are left out), other values keep their shape.
 * @template T
 * @typedef {0 extends 1 & T ? any
 *   : unknown extends T ? unknown
 *   : T extends string | number | boolean | null ? T
 *   : T extends bigint ? never
 *   : T extends undefined | symbol | ((...args: any[]) => unknown) ? null
 *   : T extends { toJSON(...args: any[]): infer J } ? Recorded<J>
 *   : T extends readonly unknown[] ? { -readonly [I in keyof T]: Recorded<T[I]> }
 *   : T extends object ? { -readonly [K in keyof T as RecordedKey<T, K>]: Recorded<Exclude<T[K], undefined>> }
 *   : unknown} Recorded
 */

/**
 * The keys of T that JSON keeps: not symbols, not functions, not always undefined.
 * @template T
 * @template {keyof T} K
 * @typedef {K extends symbol ? never
 *   : [T[K]] extends [undefined | symbol | ((...args: any[]) => unknown)] ? never
 *   : K} RecordedKey
 */

/**
 * A row of durable_ledger.effects, as effect_status returns it.
 * @typedef {object} EffectRow
 * @property {string} key
 * @property {string} run
 * @property {string} tool
 * @property {unknown} args
 * @property {boolean} business_key
 * @property {number | null} occurrence
 * @property {number} attempt
 * @property {import('./decisions.js').EffectStatusWord} status
 * @property {unknown} result
 * @property {unknown} error
 * @property {unknown} meta
 * @property {string} lease_epoch  bigint: node-postgres returns it as a string
 * @property {number} holder_pid
 * @property {Date} created_at
 * @property {Date | null} completed_at
 * @property {string | null} resolved_by
 * @property {string | null} resolution_note
 * @property {boolean} conflict
 * @property {string | null} [forked_from]  in a forked run (extension 1.2): the effect of the
 *   source run it carries
 */

/**
 * A row of durable_ledger.history(run) (extension 1.2): one audit event of the run.
 * node-postgres returns the bigint columns (id, lease_epoch) as strings.
 * @typedef {object} HistoryRow
 * @property {string} id
 * @property {Date} logged_at
 * @property {string | null} lease_epoch  the attempt (lease epoch) the event belongs to; null
 *   for an event outside any
 * @property {string} event  lease_acquired, lease_released, lease_broken, intent, replay,
 *   pause, in_progress, completed, late_completion, failed, late_failure, resolved, conflict,
 *   divergence, divergence_resolved, run_abandoned, run_forked, ...
 * @property {string | null} key
 * @property {string | null} tool
 * @property {unknown} args
 * @property {number | null} attempt  the attempt of the key the event concerns
 * @property {unknown} outcome  the result or error the event concerns
 * @property {unknown} detail
 * @property {string | null} role_name
 * @property {string | null} application_name
 */

/**
 * The options of a call: guarded(), a tool's.
 * @typedef {object} CallOptions
 * @property {string | null} [businessKey]  an operation identity shared across runs (invoice
 *   number, order id)
 * @property {unknown} [meta]  free JSON stored with the intent (model, prompt version, trace id...)
 */

/**
 * The options of beginEffect().
 * @typedef {object} BeginEffectOptions
 * @property {string | null} [businessKey]  an operation identity shared across runs
 * @property {unknown} [meta]  free JSON stored with the intent
 * @property {import('./token-lease.js').TokenLease | string | null} [lease]  a token lease (or
 *   its token): the call belongs to that lease's epoch, no session lock
 */

/**
 * The options of tokenAttempt().
 * @typedef {object} AttemptOptions
 * @property {string | null} [model]  the model that answers the attempt: put on every call
 *   as meta.model (a call's own meta.model is kept); a later attempt with another model is
 *   audited as model_changed (extension 1.3)
 */

/**
 * @typedef {object} TokenAttemptOptions
 * @property {string | null} [model]  as in AttemptOptions
 * @property {number} [ttl]  seconds the lease lives without renewal: 1 to 86400 (the server
 *   checks). Default 300.
 * @property {string | null} [holder]  the worker's name, shown in durable_ledger.leases
 * @property {(err: unknown, lease: import('./token-lease.js').TokenLease) => void} [onRenewalError]
 *   hears of a renewal that failed for another reason than a lost lease (it is retried within
 *   a second). Default: a process warning (DurableLedgerWarning).
 */

/**
 * A side effect for guarded().
 * @template T
 * @typedef {object} GuardedCall
 * @property {string} run
 * @property {string} tool
 * @property {unknown} args  any JSON value; key order, white space and number spelling do not
 *   matter
 * @property {(key: string) => T | Promise<T>} perform  performs the effect; pass `key`
 *   downstream as the idempotency key
 * @property {string | null} [businessKey]  an operation identity shared across runs (invoice
 *   number, order id)
 * @property {string | null} [callId]  instead of businessKey: a framework's own id of this tool
 *   call, kept across its resumes (extension 1.3).  The call's key is callKey(run, tool, callId);
 *   a new id whose call (tool and arguments, or the tool's key fields) equals an effect that an
 *   earlier attempt of the run recorded pauses as a divergence (DivergencePaused): the model may
 *   have named that call anew after its answer was lost
 * @property {unknown} [meta]  free JSON stored with the intent (model, prompt version, trace id...)
 * @property {import('./reconcile.js').Reconcile | null} [reconcile]  the provider's lookup by the
 *   key a lost attempt gave it: for a pause of an unknown outcome, its finding (Happened,
 *   NotHappened) is recorded (reconcile_effect) and the call asked again; null, a throw or a
 *   refusal leave the EffectPaused
 */

/**
 * A local effect for local(): a write in the ledger's own database, made in one
 * transaction with its intent and its outcome (begin_local).
 * @template T
 * @typedef {object} LocalCall
 * @property {string} run
 * @property {string} tool
 * @property {unknown} args  any JSON value, as guarded()'s
 * @property {(client: import('pg').ClientBase, key: string) => T | Promise<T>} write  makes
 *   the effect with SQL on `client`, inside the ledger's transaction (nothing else: only what
 *   commits with it is covered); its result is recorded with it
 * @property {string | null} [businessKey]  as guarded()'s
 * @property {unknown} [meta]  as guarded()'s
 */

/**
 * The options of tool().
 * @typedef {object} ToolOptions
 * @property {import('./reconcile.js').Reconcile | null} [reconcile]  as guarded()'s
 */

/**
 * A call that is harmless to make again (a model's turn, a read): Ledger.record().
 * @template T
 * @typedef {object} RecordedCall
 * @property {string} run
 * @property {string} tool  its name, e.g. "model"
 * @property {unknown} args  its JSON input (the messages so far); key order and white space do
 *   not matter
 * @property {() => T | Promise<T>} call  makes the call; its result is recorded, and replayed
 *   instead of calling again
 * @property {unknown} [meta]  free JSON stored with the intent (model name, prompt version)
 */

/**
 * The options of new Ledger().
  * @typedef {object} LedgerOptions
 * @property {boolean} [consoleWarn]  false: notices nobody listens to ('notice') are dropped
 *   instead of written with console.warn. Default true.
 * @property {boolean} [routed]  true: the database is a proxy of a sharded ledger
 *   (durable_ledger_proxy): every call about a key names its run, so that it goes straight
 *   to the run's shard. Default false.
 */

export {};
