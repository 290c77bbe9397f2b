/*
 * decide.c: what a call of begin_effect or begin_recorded decides -- execute,
 * replay, pause or in_progress -- and what that writes.
 *
 * Uniqueness comes from the primary key of durable_ledger.effects, never from
 * the lease: a new key is inserted, and whoever finds it there decides from
 * the row.  The lease only serialises the occurrence counting of one run.  An
 * outcome that nobody knows is never guessed: it pauses the run until a
 * person resolves it -- unless the call was recorded as safe to redo, and is
 * again: then it is executed again, as the effect's next attempt.  A call
 * that needs an approval (set_approval) is recorded awaiting it and pauses
 * instead of executing; once approved, the next call of its key executes it.
 *
 * A decision is made in three steps:
 *
 *   read   the call once (its lease, its tool's rules, its identity and key:
 *          read_call), then the effect (its row, or for a new key how the
 *          call relates to the run's earlier attempts: read_effect);
 *   judge  a value, the Decision: what to answer and what to write; it reads
 *          nothing more and writes nothing (judge);
 *   apply  writes it: the effect's row, its audit row (which notifies a
 *          listener when a person should look), the epoch's counters.
 *
 * A row to change is locked by apply, and must still be the version judged;
 * when it is not (or another run inserted the business key first, or an
 * insert the read waited for rolled back) the round starts again from the
 * read.  New kinds of decision are new branches of the judgement.
 */
#include "postgres.h"

#include "decision.h"

/* How often a decision is made again when the row changed under it. */
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
#define REASON_RETRY \
	"a person found that attempt %d of the effect did not happen and asked for it to be made again (retry_effect): it is executed as attempt %d, under a new provider key"
#define REASON_RECONCILED \
	"a reconciler found from the provider's record that attempt %d of the effect did not happen (reconcile_effect): it is executed as attempt %d, under a new provider key"
#define REASON_AWAITING_APPROVAL \
	"awaiting approval: this call needs an approver's approval before it executes (set_approval); its intent is recorded and nothing was performed; an approver decides with durable_ledger.approve_effect() or durable_ledger.reject_effect()"
#define REASON_APPROVED \
	"an approver approved this call (approve_effect): it is executed, once"
#define REASON_REPLAY_REJECTED \
	"an approver rejected this call (reject_effect): the rejection is returned as its error and it must not be performed"
#define REASON_APPROVAL_OTHER_ARGS \
	"a person said this call is the same as effect \"%s\", which was approved for the args it was recorded with, not for this call's: it is not executed; an approval binds to the call approved"
#define REASON_APPROVAL_CHANGED_ARGS \
	"an approver approved this key for the args it was recorded with, and this call has other args: it is not executed; the run must make the call with the args approved (or a person abandons the run)"
#define REASON_IN_PROGRESS_MINE \
	"this lease began this effect and has not reported its outcome yet; report it with complete_effect or fail_effect"
#define REASON_IN_PROGRESS_OTHER \
	"run \"%s\" is performing this effect right now under a live lease; ask again later"
#define REASON_PAUSE_DIVERGENCE \
	"this attempt's call of tool \"%s\" was not made by the run's earlier attempts, which recorded effect \"%s\" of the tool that this attempt has not replayed: the call may be that effect again with drifted arguments; a person must decide with durable_ledger.resolve_divergence() whether it is the same (its outcome is replayed) or distinct (it is executed)"

#define REASON_PAUSE_CALL_ID \
	"this attempt's call of tool \"%s\" has a new call id, and an earlier attempt of the run recorded effect \"%s\" of the tool with the same arguments: the call may be that effect again, named anew (a model asked again after its answer was lost); a person must decide with durable_ledger.resolve_divergence() whether it is the same (its outcome is replayed) or distinct (it is executed)"

#define REASON_PAUSE_SAME_ARGS \
	"this attempt's call of tool \"%s\" has the arguments of effect \"%s\", which an earlier attempt of the run recorded under a call id: the call may be that effect again, keyed by its occurrence this time; a person must decide with durable_ledger.resolve_divergence() whether it is the same (its outcome is replayed) or distinct (it is executed)"

#define REASON_MODEL_CHANGED \
	"the model changed in this attempt, from \"%s\" to \"%s\" (model_changed): the drift may be the new model's"

/* Each decision's audit event (a new divergence's row is the divergence's own). */
static const AuditEvent decision_events[] = {
	[DECIDE_EXECUTE] = AUDIT_INTENT,
	[DECIDE_REPLAY] = AUDIT_REPLAY,
	[DECIDE_PAUSE] = AUDIT_PAUSE,
	[DECIDE_IN_PROGRESS] = AUDIT_IN_PROGRESS,
};

static const char *const decision_names[] = {
	[DECIDE_EXECUTE] = "execute",
	[DECIDE_REPLAY] = "replay",
	[DECIDE_PAUSE] = "pause",
	[DECIDE_IN_PROGRESS] = "in_progress",
};

const char *
dl_decision_name(DecisionKind kind)
{
	return decision_names[kind];
}

/* The call, read once: its lease, its tool's rules, its identity and key. */
typedef struct Call
{
	const BeginRequest *request;
	CallLease	lease;
	ToolRules	rules;
	StringInfoData canon;		/* the canonical text of its identity */
	NewIntent	intent;
	EpochCounter occurrences;	/* where its occurrence is counted (derived keys) */
	ReplayProgress progress;	/* how far the epoch replayed the tool (derived keys) */
	char		derived_key[DL_KEY_HEX_LEN + 1];
	bool		waited;			/* it may have waited for a lock since its token lease was checked */
	bool		unregistered;	/* its tool is nobody's, and policy warn: warned once it executes */
	BudgetCheck budget;			/* judged where the call would execute (budgets.c) */
} Call;

/* The effect a round decides on, read afresh each round. */
typedef struct Facts
{
	const NewIntent *intent;	/* the call's; or as a call of the effect a verdict made it */
	NewIntent	same;			/* (that one) */
	bool		found;			/* row is the effect's; else its key is new */
	EffectRow	row;
	bool		lease_live;		/* a started effect's lease is live */
	Drift		drift;			/* a new derived key: how it relates to the earlier attempts */
	char	   *model;			/* a divergence's: its attempt's model, */
	char	   *model_from;		/* ... and the earlier attempts' when it changed */
} Facts;

/* What a decision changes besides writing its audit row. */
typedef enum Change
{
	CHANGE_NOTHING,
	CHANGE_INTENT,				/* the intent of a new key */
	CHANGE_NEXT_ATTEMPT,		/* the effect starts again: a failed business key, a redo, a retry */
	CHANGE_START_APPROVED,		/* an approved call starts */
	CHANGE_UNKNOWN,				/* its lease ended without a report */
	CHANGE_DIVERGENCE,			/* a new divergence waits for a person */
	CHANGE_BUDGET				/* a budget stops a call that would execute */
} Change;

typedef struct Decision
{
	BeginAnswer answer;
	Change		change;
	EffectStatus replaced_as;	/* CHANGE_NEXT_ATTEMPT: how the current attempt is kept */
	const char *cause;			/* a pause's, for its audit row */
	const char *divergence;		/* the drifted call's key, when a verdict made it this effect's */
	bool		request_approval;	/* the intent (or next attempt) is recorded awaiting approval */
	const BudgetCheck *budget;	/* CHANGE_BUDGET: what stopped the call */
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

/* ---------- read ---------- */

/*
 * Reads the call: its lease (a token lease, or this session's), waits while
 * its run is being abandoned or its tool's rules are changing, and derives
 * its identity (its tool's key fields, or all of args), occurrence and key.
 * The tool's rules are read once the lease is held, and cannot change until
 * the call's transaction ends (tools.c).
 */
static void
read_call(const BeginRequest *request, Call *call)
{
	NewIntent  *intent = &call->intent;
	bool		waited;

	memset(call, 0, sizeof(Call));
	call->request = request;
	call->lease.run = request->run;
	if (request->token != NULL)
		call->lease.epoch = dl_token_for_call(request->run, request->token);
	else
	{
		call->lease.held = dl_lease_for_call(request->run);
		call->lease.epoch = dl_lease_epoch(call->lease.held);

		/*
		 * A local effect under a session lease holds the run's call lock
		 * until its transaction ends, as a token call does: a next epoch
		 * waits for it (take_session_lock, take_lease) even when this
		 * session's lock is dropped meanwhile (pg_advisory_unlock_all), and
		 * then judges what it committed.
		 */
		if (request->local)
			(void) dl_run_lock_xact(dl_run_lock_key(request->run), DL_CALL_LOCK_CLASS, true);
	}
	waited = dl_check_run_open(request->run);
	waited |= dl_tool_rules(request->tool, &call->rules);
	if (request->recorded)
		dl_check_may_redo(request->tool, &call->rules);

	/*
	 * A token lease was checked before those locks: after waiting for an
	 * abandonment or a registry change (either may be rolled back), check
	 * it again, since a release, a break or the expiry do not wait for the
	 * run's calls.
	 */
	if (waited && request->token != NULL)
		(void) dl_token_for_call(request->run, request->token);
	dl_note_attempt_model(&call->lease, request->meta);
	initStringInfo(&call->canon);
	dl_append_canonical_args(&call->canon,
							 dl_identity_of_call(&call->rules, request->args, NULL));

	intent->run = request->run;
	intent->tool = request->tool;
	intent->args = request->args;
	intent->meta = request->meta;
	intent->lease_epoch = call->lease.epoch;
	intent->safe_to_redo = request->recorded;
	intent->local = request->local;
	intent->business_key = request->business_key != NULL;
	if (intent->business_key)
	{
		intent->key = request->business_key;
		/* a call id is judged by what the attempt replayed (divergence.c) */
		if (request->call_id)
			call->waited = dl_progress_start(&call->progress, &call->lease, request->tool,
											 &call->rules, false);
		return;
	}
	intent->occurrence = dl_next_occurrence(&call->lease, request->tool, call->canon.data,
											call->canon.len, &call->occurrences);
	dl_derive_key(request->run, request->tool, call->canon.data, call->canon.len,
				  intent->occurrence, call->derived_key);
	intent->key = call->derived_key;
	call->waited = dl_progress_start(&call->progress, &call->lease, request->tool, &call->rules,
									 request->recorded);
}

/*
 * Reads key's effect into f->row when there is one; one that another
 * transaction is writing is locked, which waits for it.  False when that
 * transaction's insert rolled back: look again.
 */
static bool
read_row(Call *call, const char *key, Facts *f)
{
	LockedEffect locked;

	f->found = false;
	switch (dl_read_key(key, &f->row))
	{
		case KEY_ABSENT:
			return true;
		case KEY_FOUND:
			f->found = true;
			return true;
		case KEY_BUSY:
			call->waited = true;
			if (!dl_lock_effect(key, &locked))
				return false;
			f->row = locked.row;
			f->found = true;
			return true;
	}
	return false;				/* keep compiler quiet */
}

/*
 * What the decision needs to know of a found row besides the row: a
 * business key's call must be the one recorded (check_same_call: an error
 * otherwise, nothing written), and a started effect's lease is live or not.
 */
static void
read_row_facts(const Call *call, Facts *f)
{
	if (f->intent->business_key)
		check_same_call(f->intent, call->canon.data, &f->row, &call->rules);
	f->lease_live = f->row.status == EFFECT_STARTED &&
		dl_lease_is_live(f->row.run, f->row.lease_epoch);
}

/*
 * Reads what a round decides on: the call's effect; for a new derived key,
 * or a new call id, how the call relates to the run's earlier attempts
 * (divergence.c), and the effect a person said it is the same as.  False:
 * look again.
 *
 * In a run's first epoch a derived key of a tool nobody registered is not
 * even looked up: epoch 1 is given only to a run whose audit log names no
 * epoch at all (write_runs.c), and every intent is logged with its epoch and
 * uses up its occurrence, so no key of the run can exist -- but the intent of
 * a call that waits for an approval, which pauses and uses up nothing
 * (count_call): that is a registered tool's (set_approval), whose condition
 * may have been removed since, so a registered tool's key is looked up.
 */
static bool
read_effect(Call *call, Facts *f)
{
	const NewIntent *intent = &call->intent;

	f->intent = intent;
	f->found = false;
	f->lease_live = false;
	f->drift.kind = DRIFT_NONE;
	f->model = NULL;
	f->model_from = NULL;
	if (!intent->business_key && intent->lease_epoch == 1 && !call->rules.registered)
		return true;
	if (!read_row(call, intent->key, f))
		return false;
	if (f->found)
		read_row_facts(call, f);
	if (f->found)
		return true;
	if (intent->business_key)
		call->waited |= dl_judge_business_key(&call->progress, &call->lease, intent->tool,
											  &call->rules, intent->key, call->canon.data,
											  call->request->call_id, &f->drift);
	else
		dl_judge_drift(&call->progress, intent->key, &call->rules, call->canon.data, &f->drift);
	if (f->drift.kind == DRIFT_NEW || f->drift.kind == DRIFT_WAITING)
		f->model = dl_read_attempt_model(intent->run, intent->lease_epoch, &f->model_from);
	if (f->drift.kind != DRIFT_SAME)
		return true;

	/*
	 * a person said it is an earlier effect: decide as a call of that one,
	 * whose outcome it replays (a new call id's too: not a business key's
	 * next attempt)
	 */
	f->same = *intent;
	f->same.key = f->drift.same_as;
	f->same.business_key = false;
	f->intent = &f->same;
	if (!read_row(call, f->same.key, f))
		return false;
	if (!f->found)
		elog(ERROR, "effect \"%s\" that a divergence was resolved as the same as does not exist",
			 f->same.key);
	read_row_facts(call, f);
	return true;
}

/* ---------- judge ---------- */

static void
decide_execute(Decision *d, int32 attempt)
{
	d->answer.decision = DECIDE_EXECUTE;
	d->answer.status = EFFECT_STARTED;
	d->answer.attempt = attempt;
}

static void
decide_pause(Decision *d, const char *reason, const char *cause)
{
	d->answer.decision = DECIDE_PAUSE;
	d->answer.reason = reason;
	d->cause = cause;
}

static void
decide_replay(Decision *d, const char *reason)
{
	d->answer.decision = DECIDE_REPLAY;
	d->answer.reason = reason;
}

/*
 * A call that would execute and needs an approval first: it is recorded
 * (as the given attempt) awaiting it, and pauses; nothing is performed.
 */
static void
request_approval(Decision *d, int32 attempt)
{
	decide_pause(d, REASON_AWAITING_APPROVAL, "approval requested");
	d->answer.status = EFFECT_AWAITING_APPROVAL;
	d->answer.attempt = attempt;
	d->request_approval = true;
}

/*
 * The args an attempt this call starts is recorded with, and judged on for
 * an approval (set_approval): the call's; but a drifted call a verdict made
 * the same starts the effect's own again, whose key is of the effect's args.
 * Judged only where the call would execute: a replay or a pause never
 * evaluates the condition.
 */
static Jsonb *
attempt_args(const Facts *f)
{
	return f->intent == &f->same ? f->row.args : f->intent->args;
}

/*
 * The effect starts again as its next attempt, for reason: its current one
 * is kept in past_attempts with status replaced_as.  A call that needs an
 * approval asks for it again (an approval is of one execution), judged on
 * the args the attempt is recorded with.
 */
static void
next_attempt(const Call *call, const Facts *f, EffectStatus replaced_as,
			 const char *reason, Decision *d)
{
	decide_execute(d, f->row.attempt + 1);
	d->answer.reason = reason;
	d->change = CHANGE_NEXT_ATTEMPT;
	d->replaced_as = replaced_as;
	if (dl_needs_approval(&call->rules, attempt_args(f)))
		request_approval(d, f->row.attempt + 1);
}

/*
 * A new key: the call executes, unless it diverges from the run's earlier
 * attempts (divergence.c) and waits for a person.
 */
static void
judge_new(const Call *call, const Facts *f, Decision *d)
{
	switch (f->drift.kind)
	{
		case DRIFT_NEW:
		case DRIFT_WAITING:
			decide_pause(d, psprintf(f->drift.call_id ? REASON_PAUSE_CALL_ID :
									 f->drift.same_args ? REASON_PAUSE_SAME_ARGS :
									 REASON_PAUSE_DIVERGENCE,
									 call->intent.tool, f->drift.candidate_key),
						 "divergence");
			if (f->model_from != NULL)
				d->answer.reason = psprintf("%s; " REASON_MODEL_CHANGED, d->answer.reason,
											f->model_from, f->model);
			d->answer.no_effect = true;
			if (f->drift.kind == DRIFT_NEW)
				d->change = CHANGE_DIVERGENCE;
			return;
		case DRIFT_NONE:
		case DRIFT_WARN:
			decide_execute(d, 1);
			d->change = CHANGE_INTENT;
			if (dl_needs_approval(&call->rules, attempt_args(f)))
				request_approval(d, 1);
			return;
		case DRIFT_SAME:
			break;				/* read_effect read that effect */
	}
	elog(ERROR, "a new key cannot be the same as an earlier effect");
}

/* Why a failed effect a person retried, or a reconciler found did not happen, executes again. */
static const char *
reason_again(const EffectRow *row)
{
	return psprintf(row->reconciled ? REASON_RECONCILED : REASON_RETRY, row->attempt,
					row->attempt + 1);
}

/*
 * A started effect: in progress under a live lease; else its lease ended
 * without a report, and it is unknown -- made again when both it and this
 * call are recorded as safe to redo.  Once unknown, an effect waits for a
 * person whatever asks.
 */
static void
judge_started(const Call *call, const Facts *f, Decision *d)
{
	const EffectRow *row = &f->row;

	if (f->lease_live)
	{
		d->answer.decision = DECIDE_IN_PROGRESS;
		if (strcmp(row->run, f->intent->run) == 0 && row->lease_epoch == f->intent->lease_epoch)
			d->answer.reason = REASON_IN_PROGRESS_MINE;
		else
			d->answer.reason = psprintf(REASON_IN_PROGRESS_OTHER, row->run);
		return;
	}
	if (f->intent->safe_to_redo && row->safe_to_redo)
	{
		next_attempt(call, f, EFFECT_UNKNOWN,
					 psprintf(REASON_REDO, row->attempt, row->attempt + 1), d);
		return;
	}
	decide_pause(d, REASON_PAUSE_UNKNOWN, "lease ended");
	d->answer.status = EFFECT_UNKNOWN;
	d->change = CHANGE_UNKNOWN;
}

/*
 * An approved call executes, as the attempt approved; not a drifted call a
 * verdict made the same, whose own args nobody approved, nor a call of the
 * key with other args (a tool's key fields, or a business key, leave out
 * what an approver saw, e.g. the amount): it pauses.
 */
static void
judge_approved(const Call *call, const Facts *f, Decision *d)
{
	/*
	 * a call id a verdict made the same as the approved call, with its very
	 * args (the call named anew), is that call: it starts, once
	 */
	if (f->intent == &f->same &&
		!(f->drift.call_id && dl_jsonb_equal(call->intent.args, f->row.args)))
	{
		decide_pause(d, psprintf(REASON_APPROVAL_OTHER_ARGS, f->row.key),
					 "approved for other args");
		return;
	}
	if (!dl_jsonb_equal(call->intent.args, f->row.args))
	{
		decide_pause(d, REASON_APPROVAL_CHANGED_ARGS, "approved for other args");
		return;
	}
	decide_execute(d, f->row.attempt);
	d->answer.reason = REASON_APPROVED;
	d->change = CHANGE_START_APPROVED;
}

/* The effect is in the ledger: decide from its row, one judgement per state. */
static void
judge_row(const Call *call, const Facts *f, Decision *d)
{
	const EffectRow *row = &f->row;

	d->answer.status = row->status;
	d->answer.attempt = row->attempt;
	if (row->conflict)
	{
		decide_pause(d, REASON_PAUSE_CONFLICT, "conflict");
		return;
	}
	switch (row->status)
	{
		case EFFECT_COMPLETED:
			decide_replay(d, REASON_REPLAY_COMPLETED);
			d->answer.result = row->result;
			return;
		case EFFECT_FAILED:
			if (row->approval == APPROVAL_REJECTED)
			{
				/* an approver said no: never executed, not even as a next attempt */
				decide_replay(d, REASON_REPLAY_REJECTED);
				d->answer.error = row->error;
				return;
			}
			if (f->intent->business_key)
			{
				/* a failed business key is executed again: its next attempt */
				next_attempt(call, f, EFFECT_FAILED,
							 row->execute_again ? reason_again(row) : NULL, d);
				return;
			}
			if (row->execute_again && f->intent != &f->same)
			{
				/*
				 * a person (retry_effect) or a reconciler (reconcile_effect)
				 * found it did not happen; not for a drifted call a verdict
				 * made the same, which would execute its own args under the
				 * effect's record: it replays
				 */
				next_attempt(call, f, EFFECT_FAILED, reason_again(row), d);
				return;
			}
			decide_replay(d, REASON_REPLAY_FAILED);
			d->answer.error = row->error;
			return;
		case EFFECT_UNKNOWN:
			/* a person was asked already, also for a recorded call's */
			decide_pause(d, REASON_PAUSE_UNKNOWN, "unknown");
			return;
		case EFFECT_STARTED:
			judge_started(call, f, d);
			return;
		case EFFECT_AWAITING_APPROVAL:
			decide_pause(d, REASON_AWAITING_APPROVAL, "awaiting approval");
			return;
		case EFFECT_APPROVED:
			judge_approved(call, f, d);
			return;
	}
}

static void
judge(const Call *call, const Facts *f, Decision *d)
{
	memset(d, 0, sizeof(Decision));
	d->answer.key = f->intent->key;
	if (f->intent != &call->intent)
		d->divergence = call->intent.key;
	if (f->found)
		judge_row(call, f, d);
	else
		judge_new(call, f, d);
}

/*
 * A call that would execute and that a budget stops (budgets.c) pauses
 * instead: nothing is performed, nor recorded but the pause.  Judged last,
 * on what the run has executed (its counter, locked), and only where the
 * call would execute.
 */
static void
judge_budget(Call *call, const Facts *f, Decision *d)
{
	if (d->answer.decision != DECIDE_EXECUTE ||
		!dl_budget_stops(&call->lease, call->intent.tool, &call->rules, &call->budget))
		return;
	if (f->found)
	{
		/* the effect as it stands: a next attempt's current one is failed, or unknown */
		d->answer.status = d->change == CHANGE_NEXT_ATTEMPT ? d->replaced_as : f->row.status;
		d->answer.attempt = f->row.attempt;
	}
	else
	{
		d->answer.no_effect = true;
		d->answer.attempt = 0;
	}
	decide_pause(d, call->budget.reason, "budget");
	d->change = CHANGE_BUDGET;
	d->budget = &call->budget;
}

/* ---------- apply ---------- */

/*
 * Locks the effect's row to change it, after any transaction changing it
 * has ended: true when it is still the version judged.
 */
static bool
lock_as_judged(Call *call, const Facts *f, LockedEffect *locked)
{
	const EffectRow *judged = &f->row;

	call->waited = true;
	return dl_lock_effect(f->intent->key, locked) &&
		locked->row.status == judged->status &&
		locked->row.conflict == judged->conflict &&
		locked->row.execute_again == judged->execute_again &&
		locked->row.attempt == judged->attempt &&
		locked->row.lease_epoch == judged->lease_epoch &&
		strcmp(locked->row.run, judged->run) == 0;
}

/* The audit row of a new divergence (DRIFT_WARN, DRIFT_NEW). */
static void
audit_divergence(const Call *call, const Facts *f)
{
	dl_write_audit(call->intent.run, call->intent.key, AUDIT_DIVERGENCE,
				   dl_divergence_detail(&call->progress, &f->drift),
				   call->intent.lease_epoch, 0);
}

/*
 * Before a call executes: warns of a divergence (policy warn), refuses a
 * call whose tool may not execute (tools.c; nothing is written), and notes
 * a tool nobody registered (policy warn), whose warning apply gives once the
 * call executes: the round may start again and decide otherwise.  A call of
 * a tool nobody registered that had to wait for a change of their policy
 * decides again first (false), on its row as it is now: meanwhile a report
 * may have flagged it, and a flagged effect pauses, whatever the policy.
 */
static bool
check_executed(Call *call, const Facts *f)
{
	if (dl_policy_changed_meanwhile(&call->rules))
	{
		call->waited = true;
		return false;
	}
	if (f->drift.kind == DRIFT_WARN)
	{
		audit_divergence(call, f);
		dl_warn_divergence(&call->progress, &f->drift);
	}
	call->unregistered = dl_may_execute(call->intent.tool, &call->rules);
	return true;
}

/* A new divergence: audited, and recorded to wait for a person's verdict. */
static void
record_divergence(const Call *call, const Facts *f)
{
	DivergenceRow row = {0};

	audit_divergence(call, f);
	row.key = (char *) call->intent.key;
	row.run = (char *) call->intent.run;
	row.lease_epoch = call->intent.lease_epoch;
	row.tool = (char *) call->intent.tool;
	row.args = call->intent.args;
	row.occurrence = call->intent.occurrence;
	row.candidate_key = f->drift.candidate_key;
	dl_write_divergence(&row);
}

/*
 * Writes the decision's change; false, nothing written, when the row is no
 * longer the one judged or another run inserted the business key first.  A
 * derived key is only ever written under its run's lease, which this call
 * holds, so a new one is inserted straight away (a duplicate would still be
 * a unique violation); a business key is shared by runs, so its intent is
 * inserted as with ON CONFLICT DO NOTHING.  (A local effect's derived key
 * too is written under the lease: no later epoch of the run can start while
 * the transaction that began it is open, since that holds the run's lock.)
 */
static bool
apply_change(Call *call, const Facts *f, const Decision *d)
{
	LockedEffect locked;
	NewIntent	intent = *f->intent;

	intent.awaiting_approval = d->request_approval;

	switch (d->change)
	{
		case CHANGE_NOTHING:
			return true;
		case CHANGE_DIVERGENCE:
			record_divergence(call, f);
			return true;
		case CHANGE_BUDGET:
			dl_budget_pause(&call->lease, call->intent.tool, call->intent.key, attempt_args(f),
							&call->budget);
			return true;
		case CHANGE_INTENT:
			if (!check_executed(call, f))
				return false;
			if (!intent.business_key)
			{
				dl_write_new_intent(&intent);
				return true;
			}
			call->waited = true;	/* the insert may wait for another run's */
			return dl_write_intent_unless_exists(&intent);
		case CHANGE_NEXT_ATTEMPT:
			if (!check_executed(call, f))
				return false;
			if (!lock_as_judged(call, f, &locked))
				return false;
			if (!f->intent->business_key)	/* a watched tool's replay, made again */
				dl_progress_redone(&call->progress, f->intent->key);
			intent.args = attempt_args(f);
			dl_write_next_attempt(&locked, &intent, d->replaced_as);
			return true;
		case CHANGE_START_APPROVED:
			if (!check_executed(call, f))
				return false;
			if (!lock_as_judged(call, f, &locked))
				return false;
			dl_write_approved_start(&locked, &intent);
			return true;
		case CHANGE_UNKNOWN:
			if (!lock_as_judged(call, f, &locked))
				return false;
			dl_write_unknown(&locked);
			return true;
	}
	return false;				/* keep compiler quiet */
}

/*
 * The audit row of a decision.  A replay's names the effect's tool too (1.2):
 * "replays per tool" is then answered by the replays' own index, without
 * looking each replayed effect up (docs/auditing.md).
 */
static void
audit_decision(const Facts *f, const Decision *d)
{
	AuditEvent	event = decision_events[d->answer.decision];
	DetailBuilder detail;

	dl_detail_init(&detail);
	if (d->request_approval)
	{
		/* who asks is the audit row's role: an approver may not be them */
		event = AUDIT_APPROVAL_REQUESTED;
		dl_detail_text(&detail, "tool", f->intent->tool);
		dl_detail_jsonb(&detail, "args", attempt_args(f));	/* what asks */
		if (d->change == CHANGE_NEXT_ATTEMPT)
			dl_detail_text(&detail, "after", dl_status_name(d->replaced_as));
		dl_write_audit(f->intent->run, f->intent->key, event, dl_detail_finish(&detail),
					   f->intent->lease_epoch, d->answer.attempt);
		return;
	}
	switch (d->answer.decision)
	{
		case DECIDE_EXECUTE:
			/*
			 * a new key's intent: its row says it all -- but that it is a
			 * local effect, which a next attempt's row no longer says
			 */
			if (d->change == CHANGE_INTENT && !f->intent->local)
			{
				dl_write_audit(f->intent->run, f->intent->key, event, NULL,
							   f->intent->lease_epoch, d->answer.attempt);
				return;
			}
			if (d->change == CHANGE_NEXT_ATTEMPT)
			{
				dl_detail_text(&detail, "after", dl_status_name(d->replaced_as));
				dl_detail_int(&detail, "attempt", d->answer.attempt);
			}
			if (d->change == CHANGE_START_APPROVED)
				dl_detail_text(&detail, "after", dl_status_name(EFFECT_APPROVED));
			if (f->intent->local)
				dl_detail_bool(&detail, "local", true);
			break;
		case DECIDE_REPLAY:
			dl_detail_text(&detail, "status", dl_status_name(d->answer.status));
			dl_detail_text(&detail, "tool", f->row.tool);
			break;
		case DECIDE_PAUSE:
			dl_detail_text(&detail, "cause", d->cause);
			if (d->budget != NULL)
			{
				dl_detail_text(&detail, "tool", f->intent->tool);
				dl_detail_text(&detail, "budget", d->budget->budget);
				dl_detail_int(&detail, "limit", d->budget->limit);
				dl_detail_int(&detail, "count", d->budget->count);
			}
			break;
		case DECIDE_IN_PROGRESS:
			dl_detail_text(&detail, "holder_run", f->row.run);
			break;
	}
	if (d->divergence != NULL)
		dl_detail_text(&detail, "divergence", d->divergence);
	dl_write_audit(f->intent->run, f->intent->key, event, dl_detail_finish(&detail),
				   f->intent->lease_epoch, d->answer.attempt);
}

/*
 * Counts the call in its epoch.  A paused call did not happen: it does not
 * use up its occurrence, so asking again in this epoch asks about the same
 * effect (pause until a person resolves it, then its outcome) and never
 * executes a new one.
 */
static void
count_call(Call *call, const Facts *f, const Decision *d)
{
	dl_progress_keep(&call->progress);
	if (d->answer.decision == DECIDE_PAUSE)
		return;
	if (call->intent.business_key)
	{
		/*
		 * a call id replayed its effect, or the one a verdict answered it
		 * with: this attempt has replayed that effect (a call id's progress
		 * is started; a plain business key's marks nothing)
		 */
		if (d->answer.decision == DECIDE_REPLAY)
			dl_progress_replayed(&call->progress, d->answer.key);
		return;
	}
	dl_epoch_count(&call->lease, &call->occurrences, call->intent.occurrence);
	if (d->answer.decision == DECIDE_REPLAY)
		dl_progress_replayed(&call->progress, d->answer.key);
}

/*
 * Writes the decision: its change, its audit row, the epoch's counters.
 * A token lease was checked before the call may have waited for a lock
 * (another transaction's hold on an effect's row, a business key's insert,
 * a change of the policy for unregistered tools): before it executes, it is
 * checked again, since a break, a release or the expiry do not wait for the
 * run's calls (the error undoes what was written).  False when the round
 * must start again.
 */
static bool
apply(Call *call, const Facts *f, const Decision *d)
{
	if (!apply_change(call, f, d))
		return false;
	if (d->change != CHANGE_DIVERGENCE)	/* whose own audit row says it */
		audit_decision(f, d);
	if (d->answer.decision == DECIDE_EXECUTE)
	{
		if (call->request->token != NULL && call->waited)
			(void) dl_token_for_call(call->request->run, call->request->token);
		if (call->unregistered)
			dl_warn_unregistered(call->intent.tool);
		if (call->request->local)
			dl_local_begun(d->answer.key);
		dl_budget_count(&call->lease, call->intent.tool, &call->budget);
		dl_note_durable_write();
	}
	count_call(call, f, d);
	return true;
}

/*
 * Decides: rounds of read, judge, apply, until a decision is applied to the
 * row it was judged on.
 */
static void
decide(Call *call, BeginAnswer *answer)
{
	int			round;

	for (round = 0; round < MAX_DECISION_ROUNDS; round++)
	{
		Facts		facts;
		Decision	d;

		if (!read_effect(call, &facts))
			continue;
		judge(call, &facts, &d);
		judge_budget(call, &facts, &d);
		if (!apply(call, &facts, &d))
			continue;
		*answer = d.answer;
		/* a verdict may answer a call id as a derived key's effect, or the reverse */
		answer->effect_business_key = facts.found ? facts.row.business_key
			: call->intent.business_key;
		return;
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("effect \"%s\" kept changing while a decision was being made", call->intent.key),
			 errhint("Retry the call.")));
}

/* Records a call's intent and decides what its caller must do. */
void
dl_begin(const BeginRequest *request, BeginAnswer *answer)
{
	Call		call;

	read_call(request, &call);
	decide(&call, answer);
	answer->key = pstrdup(answer->key);	/* a derived key is in call, on this stack */
	answer->business_key = call.intent.business_key;
	answer->occurrence = call.intent.occurrence;
	if (!answer->no_effect)
		answer->downstream_key = dl_downstream_key(answer->key, answer->effect_business_key,
												answer->attempt);
}
