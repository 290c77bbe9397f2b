/*
 * begin.c: begin_effect(), which records the intent of a side effect before
 * it happens and decides whether to execute, replay, pause or wait; and
 * begin_recorded(), the same for a call that is harmless to make again (a
 * model's answer, a read), recorded so that a replay sees what it returned.
 *
 * Uniqueness comes from the primary key of durable_ledger.effects, never from
 * the lease: a new key is inserted, and whoever finds it there decides from
 * the row.  The lease only serialises the occurrence counting of one run.  An
 * outcome that nobody knows is never guessed: it pauses the run until a
 * person resolves it -- unless the call was recorded as safe to redo, and is
 * again: then it is executed again, as the effect's next attempt.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "funcapi.h"
#include "utils/builtins.h"

#include "policy.h"

PG_FUNCTION_INFO_V1(dl_begin_effect_1_3);
PG_FUNCTION_INFO_V1(dl_begin_recorded_1_3);

/* How often a decision is tried again when the row changed under it. */
#define MAX_DECISION_ROUNDS 16

/* The sentences that explain a decision (the reason column). */
#define REASON_REPLAY_COMPLETED \
	"the effect completed in an earlier attempt; its recorded result is returned and it must not be performed again"
#define REASON_REPLAY_FAILED \
	"the effect failed in an earlier attempt; its recorded error is returned (call again for a new occurrence, or start a new run)"
#define REASON_PAUSE_UNKNOWN \
	"the outcome of an earlier attempt is unknown: its intent was recorded and no completion arrived before its lease ended; a person must resolve it with durable_ledger.resolve_effect()"
#define REASON_PAUSE_CONFLICT \
	"a report on this effect was kept for a person: it contradicts the recorded outcome, or names no attempt where that is ambiguous; a person must resolve it with durable_ledger.resolve_effect()"
#define REASON_REDO \
	"the outcome of attempt %d is unknown, and this call is recorded as safe to redo: it is executed again as attempt %d"
#define REASON_IN_PROGRESS_MINE \
	"this lease began this effect and has not reported its outcome yet; report it with complete_effect or fail_effect"
#define REASON_IN_PROGRESS_OTHER \
	"run \"%s\" is performing this effect right now under a live lease; ask again later"
#define REASON_PAUSE_DIVERGENCE \
	"this attempt's call of tool \"%s\" was not made by the run's earlier attempts, which recorded effect \"%s\" of the tool that this attempt has not replayed: the call may be that effect again with drifted arguments; a person must decide with durable_ledger.resolve_divergence() whether it is the same (its outcome is replayed) or distinct (it is executed)"

typedef enum DecisionKind
{
	DECIDE_EXECUTE,
	DECIDE_REPLAY,
	DECIDE_PAUSE,
	DECIDE_IN_PROGRESS
} DecisionKind;

static const char *const decision_names[] = {
	[DECIDE_EXECUTE] = "execute",
	[DECIDE_REPLAY] = "replay",
	[DECIDE_PAUSE] = "pause",
	[DECIDE_IN_PROGRESS] = "in_progress",
};

typedef struct Decision
{
	DecisionKind kind;
	const char *key;			/* the effect decided on: the call's, or the one it is the same as */
	bool		no_effect;		/* a divergence waiting for a person: no effect, no status */
	const char *divergence;		/* the drifted call's key, when a verdict made it this effect's */
	EffectStatus status;
	int32		attempt;
	Jsonb	   *result;
	Jsonb	   *error;
	const char *reason;
} Decision;

#define HINT_BUSINESS_KEY_OTHER_OPERATION \
	"A business key names one operation. A different operation needs a business key of " \
	"its own (e.g. the invoice number and a revision, \"INV-9/2\"), or none (the run's own " \
	"key, by occurrence); a new key for the same operation would perform it again."

#define HINT_BUSINESS_KEY_REWORDED \
	"If this is the same operation with reworded free text (a memo, a message body), an " \
	"admin names the fields that identify it: durable_ledger.change_tool(tool, changed_by, " \
	"key_fields => '{...}'), or, once calls of the tool are recorded under derived keys, " \
	"register_tool of a new tool name with key_fields; the call then replays. A new " \
	"business key would perform the operation again."

/*
 * A business key names one operation: the same tool with the same args (the
 * same key fields, for a tool registered with them).  A call that differs is
 * refused, and nothing is written: it is not an outcome a person could
 * decide (docs/reference.md, "Business keys"), but a caller or a registry
 * that does not say what the operation is.
 */
static void
check_same_call(const NewIntent *intent, const char *canon, const EffectRow *row,
				const ToolRules *rules)
{
	StringInfoData recorded;
	Jsonb	   *identity;
	bool		complete;
	bool		key_fields = rules->registered && rules->row.nkey_fields >= 0;

	if (strcmp(row->tool, intent->tool) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("business key \"%s\" is already used by a different call", intent->key),
				 errdetail("It was begun with tool \"%s\"; this call has tool \"%s\".",
						   row->tool, intent->tool),
				 errhint(HINT_BUSINESS_KEY_OTHER_OPERATION)));

	initStringInfo(&recorded);
	identity = dl_identity_of_call(rules, row->args, &complete);
	if (complete)
		dl_append_canonical_args(&recorded, identity);
	if (complete && strcmp(recorded.data, canon) == 0)
		return;
	if (key_fields)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("business key \"%s\" is already used by a different call", intent->key),
				 errdetail("It was begun with other values of the key fields of tool \"%s\".",
						   row->tool),
				 errhint(HINT_BUSINESS_KEY_OTHER_OPERATION)));
	ereport(ERROR,
			(errcode(ERRCODE_UNIQUE_VIOLATION),
			 errmsg("business key \"%s\" is already used by a different call", intent->key),
			 errdetail("It was begun with other arguments for tool \"%s\", which names no key fields: all of args must be equal.",
					   row->tool),
			 errhint(HINT_BUSINESS_KEY_REWORDED)));
}

/*
 * What a decision needs besides the intent: the tool's rules, the replay's
 * progress, the token lease (NULL: a session lease), and whether it locked an
 * effect's row (which may have waited for another transaction).
 */
typedef struct CallRules
{
	const ToolRules *rules;
	ReplayProgress *progress;
	const char *token;
	bool		locked_a_row;
} CallRules;

/* dl_lock_effect for a decision, noting that it may have waited. */
static bool
lock_effect(CallRules *call, const char *key, LockedEffect *locked)
{
	call->locked_a_row = true;
	return dl_lock_effect(key, locked);
}

/*
 * The audit row of a decision.  A replay's names the effect's tool too (1.2):
 * "replays per tool" is then answered by the replays' own index, without
 * looking each replayed effect up (docs/auditing.md); tool is NULL otherwise.
 */
static void
audit_decision(const NewIntent *intent, const char *event, const Decision *d,
			   const char *detail_name, const char *detail_value, const char *tool)
{
	DetailBuilder detail;

	dl_detail_init(&detail);
	dl_detail_text(&detail, detail_name, detail_value);
	if (tool != NULL)
		dl_detail_text(&detail, "tool", tool);
	if (d->kind == DECIDE_EXECUTE)
		dl_detail_int(&detail, "attempt", d->attempt);
	if (d->divergence != NULL)
		dl_detail_text(&detail, "divergence", d->divergence);
	dl_write_audit(intent->run, intent->key, event, dl_detail_finish(&detail),
				   intent->lease_epoch, d->attempt);
}

/* The intent is recorded: the caller performs the effect. */
static void
decide_execute(Decision *d, int32 attempt)
{
	d->kind = DECIDE_EXECUTE;
	d->status = EFFECT_STARTED;
	d->attempt = attempt;
	dl_note_durable_write();
}

static void
decide_pause(const NewIntent *intent, Decision *d, const char *reason, const char *cause)
{
	d->kind = DECIDE_PAUSE;
	d->reason = reason;
	audit_decision(intent, "pause", d, "cause", cause, NULL);
}

/*
 * What happens to a call whose intent would be inserted now (a new key): it
 * is refused when its tool may not execute (tools.c), paused or turned into
 * a replay when it diverges from the run's earlier attempts (divergence.c);
 * true when it executes.
 */
static bool
may_insert(const NewIntent *intent, CallRules *call, Drift *drift)
{
	drift->kind = DRIFT_NONE;
	if (!intent->business_key)
		dl_check_drift(call->progress, intent->key, intent->args, intent->occurrence, drift);
	if (drift->kind != DRIFT_NONE)
		return false;			/* it pauses, or replays an earlier effect: nothing executes */
	dl_check_may_execute(intent->tool, call->rules);
	return true;
}

typedef enum Found
{
	FOUND_ROW,					/* *row is the key's */
	FOUND_INSERTED,				/* the intent was inserted: execute */
	FOUND_DRIFT					/* not inserted: *drift says why */
} Found;

/*
 * Finds the intent's key, or inserts the intent when there is none (and
 * may_insert allows it).  A derived key is only ever written under its run's
 * lease, which this call holds, so a key nobody has is inserted straight
 * away (a duplicate would still be a unique violation); a business key is
 * shared by runs, so its intent is inserted as with ON CONFLICT DO NOTHING.
 * A key that another transaction is writing is locked, which waits for it.
 *
 * In a run's first epoch a derived key is not even looked up: epoch 1 is
 * given only to a run whose audit log names no epoch at all (writer.c), and
 * every intent is logged with its epoch, so no key of the run can exist.
 */
static Found
find_or_insert_intent(const NewIntent *intent, CallRules *call, EffectRow *row,
					  Drift *drift)
{
	int			round;

	if (!intent->business_key && intent->lease_epoch == 1)
	{
		if (!may_insert(intent, call, drift))
			return FOUND_DRIFT;
		dl_write_new_intent(intent);
		return FOUND_INSERTED;
	}

	for (round = 0; round < MAX_DECISION_ROUNDS; round++)
	{
		LockedEffect locked;

		switch (dl_read_key(intent->key, row))
		{
			case KEY_ABSENT:
				if (!may_insert(intent, call, drift))
					return FOUND_DRIFT;
				if (!intent->business_key)
				{
					dl_write_new_intent(intent);
					return FOUND_INSERTED;
				}
				if (dl_write_intent_unless_exists(intent))
					return FOUND_INSERTED;
				break;			/* another run inserted it: look again */
			case KEY_FOUND:
				return FOUND_ROW;
			case KEY_BUSY:
				if (lock_effect(call, intent->key, &locked))
				{
					*row = locked.row;
					return FOUND_ROW;
				}
				break;			/* its insert rolled back: look again */
		}
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("effect \"%s\" kept changing while a decision was being made", intent->key),
			 errhint("Retry the call.")));
	return FOUND_ROW;			/* keep compiler quiet */
}

/*
 * The key to pass downstream (the provider's idempotency key): a derived key
 * itself; a business key with its attempt, "INV-9#2", since a provider that
 * keeps its answers to a key (card processors do, for a day) would answer a
 * business key's next attempt, after a refusal, with the refusal again.
 */
static char *
downstream_key(const char *key, bool business_key, int32 attempt)
{
	return business_key ? psprintf("%s#%d", key, attempt) : pstrdup(key);
}

/*
 * A recorded call started under a lease that ended without a report (row, as
 * decided on) is executed again: its attempt is kept in past_attempts as
 * unknown and the next one starts.  Both the effect and this call must say
 * it is safe to redo: an effect begun by begin_effect, or a call of
 * begin_effect now, makes the effect unknown and pauses, as v1 does; once
 * unknown, an effect waits for a person whatever asks.  False when the row
 * changed meanwhile.
 */
static bool
decide_redo(const NewIntent *intent, CallRules *call, const EffectRow *row, Decision *d)
{
	LockedEffect locked;

	dl_check_may_execute(intent->tool, call->rules);
	if (!lock_effect(call, intent->key, &locked) ||
		locked.row.status != EFFECT_STARTED || locked.row.conflict ||
		locked.row.attempt != row->attempt ||
		locked.row.lease_epoch != row->lease_epoch ||
		strcmp(locked.row.run, row->run) != 0)
		return false;
	dl_progress_redone(call->progress, intent->key);	/* a watched tool's replay */
	dl_write_next_attempt(&locked, intent, EFFECT_UNKNOWN);
	decide_execute(d, row->attempt + 1);
	d->reason = psprintf(REASON_REDO, row->attempt, row->attempt + 1);
	audit_decision(intent, "intent", d, "after", dl_status_name(EFFECT_UNKNOWN), NULL);
	return true;
}

/*
 * Decides from the effect's row what the caller must do, writing what the
 * decision needs.  A change of the row (a status, an attempt) happens only to
 * the version locked here, after checking it is still the one decided on:
 * false when it changed meanwhile (the caller looks again).
 */
static bool
decide_from_row(const NewIntent *intent, const char *canon, CallRules *call,
				const EffectRow *row, Decision *d)
{
	LockedEffect locked;
	bool		redo = intent->safe_to_redo && row->safe_to_redo;

	if (intent->business_key)
		check_same_call(intent, canon, row, call->rules);

	d->status = row->status;
	d->attempt = row->attempt;

	if (row->conflict)
	{
		decide_pause(intent, d, REASON_PAUSE_CONFLICT, "conflict");
		return true;
	}

	switch (row->status)
	{
		case EFFECT_COMPLETED:
			d->kind = DECIDE_REPLAY;
			d->result = row->result;
			d->reason = REASON_REPLAY_COMPLETED;
			audit_decision(intent, "replay", d, "status", "completed", row->tool);
			return true;

		case EFFECT_FAILED:
			if (!intent->business_key)
			{
				d->kind = DECIDE_REPLAY;
				d->error = row->error;
				d->reason = REASON_REPLAY_FAILED;
				audit_decision(intent, "replay", d, "status", "failed", row->tool);
				return true;
			}
			/* a failed business key is executed again: its next attempt */
			dl_check_may_execute(intent->tool, call->rules);
			if (!lock_effect(call, intent->key, &locked) ||
				locked.row.status != EFFECT_FAILED || locked.row.conflict ||
				locked.row.attempt != row->attempt)
				return false;
			dl_write_next_attempt(&locked, intent, EFFECT_FAILED);
			decide_execute(d, row->attempt + 1);
			audit_decision(intent, "intent", d, "after", "failed", NULL);
			return true;

		case EFFECT_UNKNOWN:
			/* a person was asked already, also for a recorded call's (below) */
			decide_pause(intent, d, REASON_PAUSE_UNKNOWN, "unknown");
			return true;

		case EFFECT_STARTED:
			if (dl_lease_is_live(row->run, row->lease_epoch))
			{
				d->kind = DECIDE_IN_PROGRESS;
				if (strcmp(row->run, intent->run) == 0 &&
					row->lease_epoch == intent->lease_epoch)
					d->reason = REASON_IN_PROGRESS_MINE;
				else
					d->reason = psprintf(REASON_IN_PROGRESS_OTHER, row->run);
				audit_decision(intent, "in_progress", d, "holder_run", row->run, NULL);
				return true;
			}
			/* its lease ended without a report */
			if (redo)
				return decide_redo(intent, call, row, d);
			/* ... which the table says too: unknown waits for a person */
			if (!lock_effect(call, intent->key, &locked) ||
				locked.row.status != EFFECT_STARTED ||
				locked.row.attempt != row->attempt ||
				locked.row.lease_epoch != row->lease_epoch ||
				strcmp(locked.row.run, row->run) != 0)
				return false;
			dl_write_unknown(&locked);
			d->status = EFFECT_UNKNOWN;
			decide_pause(intent, d, REASON_PAUSE_UNKNOWN, "lease ended");
			return true;
	}
	return false;				/* keep compiler quiet */
}

/*
 * A call that diverges from the run's earlier attempts: it waits for a
 * person, or (a person said so) is the same operation as an earlier effect,
 * whose outcome it gets as that effect's own call would.
 */
static bool
decide_drift(const NewIntent *intent, const char *canon, CallRules *call,
			 const Drift *drift, Decision *d)
{
	NewIntent	same;
	EffectRow	row;
	LockedEffect locked;

	if (drift->kind == DRIFT_PAUSE)
	{
		d->kind = DECIDE_PAUSE;
		d->no_effect = true;
		d->reason = psprintf(REASON_PAUSE_DIVERGENCE, intent->tool, drift->candidate_key);
		if (!drift->recorded_now)
			audit_decision(intent, "pause", d, "cause", "divergence", NULL);
		return true;
	}

	/* DRIFT_SAME: decide as a call of the earlier effect's key would */
	same = *intent;
	same.key = drift->same_as;
	d->key = drift->same_as;
	d->divergence = intent->key;
	switch (dl_read_key(same.key, &row))
	{
		case KEY_FOUND:
			return decide_from_row(&same, canon, call, &row, d);
		case KEY_BUSY:
			if (lock_effect(call, same.key, &locked))
				return decide_from_row(&same, canon, call, &locked.row, d);
			return false;
		case KEY_ABSENT:
			break;
	}
	elog(ERROR, "effect \"%s\" that a divergence was resolved as the same as does not exist",
		 same.key);
	return false;				/* keep compiler quiet */
}

static void
decide(const NewIntent *intent, const char *canon, CallRules *call, Decision *d)
{
	int			round;

	for (round = 0; round < MAX_DECISION_ROUNDS; round++)
	{
		EffectRow	row;
		Drift		drift;

		d->key = intent->key;
		d->divergence = NULL;
		switch (find_or_insert_intent(intent, call, &row, &drift))
		{
			case FOUND_INSERTED:
				decide_execute(d, 1);
				return;
			case FOUND_DRIFT:
				if (decide_drift(intent, canon, call, &drift, d))
					return;
				break;
			case FOUND_ROW:
				if (decide_from_row(intent, canon, call, &row, d))
					return;
				break;
		}
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("effect \"%s\" kept changing while a decision was being made", intent->key),
			 errhint("Retry the call.")));
}

/* Where a kind of call takes its optional arguments (-1: it has none). */
typedef struct BeginArgs
{
	const char *function;
	bool		safe_to_redo;
	int			business_key;
	int			meta;
	int			lease;
} BeginArgs;

static const BeginArgs begin_effect_args = {"begin_effect()", false, 3, 4, 5};
static const BeginArgs begin_recorded_args = {"begin_recorded()", true, -1, 3, 4};

/*
 * Records a call's intent and decides (both entry points below).  Without
 * lease (a token), the call belongs to this session's lease of run, taken
 * when the session does not hold it; with one, to that token lease's epoch,
 * and the session holds nothing.
 */
static Datum
begin_call(FunctionCallInfo fcinfo, const BeginArgs *kind)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	char	   *tool = dl_required_text_arg(fcinfo, 1, "tool", DL_MAX_TOOL_CHARS);
	Jsonb	   *args = dl_required_jsonb_arg(fcinfo, 2, "args");
	char	   *business_key = NULL;
	char	   *token = NULL;
	MemoryContext call_cxt = CurrentMemoryContext;
	TupleDesc	desc;
	StringInfoData canon;
	ToolRules	rules;
	CallLease	lease;
	ReplayProgress progress = {0};
	CallRules call = {&rules, &progress};
	NewIntent	intent;
	EpochCounter counter;
	char		derived_key[DL_KEY_HEX_LEN + 1];
	Decision	d = {0};
	Datum		values[9];
	bool		nulls[9] = {false};
	HeapTuple	tuple;
	bool		waited;

	dl_check_run_and_tool(run, tool);
	if (kind->business_key >= 0 && !PG_ARGISNULL(kind->business_key))
	{
		business_key = dl_required_text_arg(fcinfo, kind->business_key, "business_key",
											DL_MAX_BUSINESS_KEY_CHARS);
		dl_check_business_key(business_key);
	}
	if (PG_NARGS() > kind->lease && !PG_ARGISNULL(kind->lease))
		token = dl_required_text_arg(fcinfo, kind->lease, "lease", 0);
	desc = dl_result_desc(fcinfo);
	/* before anything is written: the SQL objects may be older than the library */
	if (desc->natts != lengthof(values))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("durable_ledger.decision has %d attributes, the library fills %d",
						desc->natts, (int) lengthof(values)),
				 errhint("Run ALTER EXTENSION durable_ledger UPDATE.")));
	dl_check_writable(kind->function);

	dl_spi_connect();
	call.token = token;
	lease.run = run;
	if (token != NULL)
	{
		lease.held = NULL;
		lease.epoch = dl_token_for_call(run, token);
	}
	else
	{
		lease.held = dl_lease_for_call(run);
		lease.epoch = dl_lease_epoch(lease.held);
	}
	waited = dl_check_run_open(run);

	/*
	 * A call is counted and keyed by its identity: its tool's key fields, or
	 * all of args.  The tool's rules are read once the lease is held, and
	 * cannot change until the call's transaction ends (tools.c).
	 */
	waited |= dl_tool_rules(tool, &rules);
	if (kind->safe_to_redo)
		dl_check_may_redo(tool, &rules);

	/*
	 * A token lease was checked before those locks: after waiting for an
	 * abandonment or a registry change (either may be rolled back), check
	 * it again, since a release, a break or the expiry do not wait for the
	 * run's calls.
	 */
	if (waited && token != NULL)
		(void) dl_token_for_call(run, token);
	initStringInfo(&canon);
	dl_append_canonical_args(&canon, dl_identity_of_call(&rules, args, NULL));

	intent.run = run;
	intent.tool = tool;
	intent.args = args;
	intent.meta = dl_optional_jsonb_arg(fcinfo, kind->meta);
	intent.lease_epoch = lease.epoch;
	intent.safe_to_redo = kind->safe_to_redo;
	intent.business_key = business_key != NULL;
	if (business_key != NULL)
	{
		intent.key = business_key;
		intent.occurrence = 0;
	}
	else
	{
		intent.occurrence = dl_next_occurrence(&lease, tool, canon.data, canon.len, &counter);
		dl_derive_key(run, tool, canon.data, canon.len, intent.occurrence, derived_key);
		intent.key = derived_key;
		dl_progress_start(&progress, &lease, tool, &rules, kind->safe_to_redo);
	}

	decide(&intent, canon.data, &call, &d);

	/*
	 * A token lease was checked before the call waited for another
	 * transaction's hold on an effect's row (a business key shared with
	 * other runs): before it executes, check it again (the error undoes what
	 * the decision wrote).
	 */
	if (d.kind == DECIDE_EXECUTE && token != NULL && call.locked_a_row)
		(void) dl_token_for_call(run, token);

	/*
	 * A paused call did not happen: it does not use up its occurrence, so
	 * asking again in this epoch asks about the same effect (pause until a
	 * person resolves it, then its outcome) and never executes a new one.
	 */
	if (d.kind != DECIDE_PAUSE && !intent.business_key)
	{
		dl_epoch_count(&lease, &counter, intent.occurrence);
		if (d.kind == DECIDE_REPLAY)
			dl_progress_replayed(&progress, d.key);
	}

	/* form the answer where it outlives SPI_finish */
	values[0] = CStringGetTextDatum(d.key);
	values[1] = CStringGetTextDatum(decision_names[d.kind]);
	values[2] = d.no_effect ? (Datum) 0 : CStringGetTextDatum(dl_status_name(d.status));
	nulls[2] = d.no_effect;
	values[3] = Int32GetDatum(intent.occurrence);
	nulls[3] = intent.business_key;
	values[4] = Int32GetDatum(d.attempt);
	nulls[4] = d.no_effect;
	values[5] = PointerGetDatum(d.result);
	nulls[5] = d.result == NULL;
	values[6] = PointerGetDatum(d.error);
	nulls[6] = d.error == NULL;
	values[7] = d.reason ? CStringGetTextDatum(d.reason) : (Datum) 0;
	nulls[7] = d.reason == NULL;
	values[8] = d.no_effect ? (Datum) 0 :
		CStringGetTextDatum(downstream_key(d.key, intent.business_key, d.attempt));
	nulls[8] = d.no_effect;
	MemoryContextSwitchTo(call_cxt);
	tuple = heap_form_tuple(desc, values, nulls);
	dl_spi_finish();

	PG_RETURN_DATUM(HeapTupleGetDatum(tuple));
}

/*
 * begin_effect(run text, tool text, args jsonb, business_key text, meta jsonb,
 *              lease text) RETURNS durable_ledger.decision
 */
Datum
dl_begin_effect_1_3(PG_FUNCTION_ARGS)
{
	return begin_call(fcinfo, &begin_effect_args);
}

/*
 * begin_recorded(run text, tool text, args jsonb, meta jsonb, lease text)
 * RETURNS durable_ledger.decision
 *
 * A call that is harmless to make again: recorded and replayed as an effect,
 * but executed again when its outcome is unknown.
 */
Datum
dl_begin_recorded_1_3(PG_FUNCTION_ARGS)
{
	return begin_call(fcinfo, &begin_recorded_args);
}
