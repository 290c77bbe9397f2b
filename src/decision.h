/*
 * decision.h: the decision layer, what a call of begin_effect or
 * begin_recorded decides (decide.c): it reads what it needs once, judges,
 * and one apply writes what the judgement asks; and what a report on an
 * effect decides (report.c).
 *
 * Uses policy.h and the layers below; the entry points use it.  Needs an
 * open SPI connection.
 */
#ifndef DURABLE_LEDGER_DECISION_H
#define DURABLE_LEDGER_DECISION_H

#include "policy.h"

/* A call of begin_effect or begin_recorded, as its caller passed it. */
typedef struct BeginRequest
{
	const char *run;
	const char *tool;
	Jsonb	   *args;
	const char *business_key;	/* NULL: the run's own key, by occurrence */
	bool		call_id;		/* business_key is a framework's id of one tool call */
	Jsonb	   *meta;			/* NULL when not given */
	const char *token;			/* a token lease; NULL: this session's lease */
	bool		recorded;		/* begin_recorded: harmless to make again */
	bool		local;			/* begin_local: a write in this database, in this transaction */
} BeginRequest;

typedef enum DecisionKind
{
	DECIDE_EXECUTE,
	DECIDE_REPLAY,
	DECIDE_PAUSE,
	DECIDE_IN_PROGRESS
} DecisionKind;

/* The answer, a row of durable_ledger.decision. */
typedef struct BeginAnswer
{
	const char *key;			/* the effect decided on: the call's, or the one it is the same as */
	DecisionKind decision;
	bool		no_effect;		/* a divergence waiting for a person: no effect, no status */
	EffectStatus status;
	bool		business_key;	/* no occurrence */
	bool		effect_business_key;	/* the effect decided on has a business key */
	int32		occurrence;
	int32		attempt;
	Jsonb	   *result;			/* NULL when none */
	Jsonb	   *error;			/* NULL when none */
	const char *reason;			/* NULL when none */
	const char *downstream_key; /* the provider's idempotency key */
} BeginAnswer;

extern const char *dl_decision_name(DecisionKind kind);
extern void dl_begin(const BeginRequest *request, BeginAnswer *answer);

/* report.c: what a report on an effect decides (returns the row as it is now) */
extern HeapTuple dl_report(const char *key, int32 attempt, EffectStatus reported, Jsonb *value);
extern HeapTuple dl_reconcile(const char *key, int32 attempt, bool happened, Jsonb *evidence);
extern bool dl_reconcilable_from(const char *key, int32 attempt, TimestampTz *from);

/* local.c: a transaction that began a local effect commits only with its outcome */
extern void dl_local_begun(const char *key);
extern void dl_local_init(void);

#endif							/* DURABLE_LEDGER_DECISION_H */
