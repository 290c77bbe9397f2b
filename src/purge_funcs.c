/*
 * purge_funcs.c: purge_settled(), the ledger's retention.
 *
 * The effects of a run are removed when the run is settled and quiet: every
 * effect completed or failed (none started, unknown or flagged by a
 * conflict), no divergence waiting for a verdict, no live lease (its own, or
 * one of a run that shares its effects), and nothing in its audit log since
 * the cutoff.  With them go their replaced attempts,
 * the run's divergences and its token leases' counters; the run's row (its
 * epochs), its token leases and the audit log stay.  A later call of a
 * purged run executes again: that is what a horizon means (docs).
 *
 * Each run is closed for calls while it is judged and purged (the lock
 * abandon_run takes: calls in progress are waited for, later ones wait for
 * the purge's commit), and judged again under that lock.  Audited per run
 * and once per call, with the person's name.
 */
#include "postgres.h"

#include "commands/trigger.h"
#include "access/xact.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "policy.h"

PG_FUNCTION_INFO_V1(dl_purge_settled_1_3);
PG_FUNCTION_INFO_V1(dl_purge_audit_1_3);
PG_FUNCTION_INFO_V1(dl_refuse_audit_log_change_1_2);

/* How many candidate runs are read at a time. */
#define CANDIDATE_BATCH 200

static void
emit(ReturnSetInfo *rsinfo, const char *run, const PurgeCounts *counts)
{
	Datum		values[4];
	bool		nulls[4] = {false};

	values[0] = CStringGetTextDatum(run);
	values[1] = Int64GetDatum(counts->effects);
	values[2] = Int64GetDatum(counts->past_attempts);
	values[3] = Int64GetDatum(counts->divergences);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

static void
audit_purge(const char *run, const char *purged_by, const char *older_than,
			const PurgeCounts *counts, int64 runs)
{
	DetailBuilder detail;

	dl_detail_init(&detail);
	dl_detail_text(&detail, "purged_by", purged_by);
	dl_detail_text(&detail, "older_than", older_than);
	if (run == NULL)
		dl_detail_int(&detail, "runs", runs);
	dl_detail_int(&detail, "effects", counts->effects);
	dl_detail_int(&detail, "past_attempts", counts->past_attempts);
	dl_detail_int(&detail, "divergences", counts->divergences);
	dl_write_audit(run, NULL, AUDIT_PURGED, dl_detail_finish(&detail), 0, 0);
}

/* Whether a live lease holds run. */
static bool
lease_live(const char *run)
{
	RunState	state;

	return dl_read_run_state(run, &state) && dl_lease_is_live(run, state.epoch);
}

/*
 * Whether a live lease holds run, or another run the ledger names with its
 * effects (a purge leaves it alone): a live attempt that failed a business
 * key that run then completed would otherwise ask about the key again, find
 * nothing, and pay again.
 */
static bool
held(const char *run)
{
	ListCell   *lc;

	if (lease_live(run))
		return true;
	foreach(lc, dl_read_runs_sharing_effects(run))
		if (lease_live(lfirst(lc)))
			return true;
	return false;
}

/*
 * A purge judges what is committed now and deletes what it judged: a
 * transaction's older snapshot would delete less than it judged.
 */
static void
refuse_snapshot_isolation(const char *what)
{
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("%s cannot run in a REPEATABLE READ or SERIALIZABLE transaction", what),
				 errhint("Call it in a READ COMMITTED transaction (the default).")));
}

/*
 * The arguments both purges begin with (older_than, purged_by, dry_run):
 * the cutoff, now - older_than.
 */
static TimestampTz
horizon_args(FunctionCallInfo fcinfo, char **older_than_text, char **purged_by, bool *dry_run)
{
	Interval   *older_than;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz cutoff;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("older_than must not be null")));
	older_than = PG_GETARG_INTERVAL_P(0);
	*purged_by = dl_required_text_arg(fcinfo, 1, "purged_by", 0);
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dry_run must not be null")));
	*dry_run = PG_GETARG_BOOL(2);
	cutoff = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_mi_interval,
													 TimestampTzGetDatum(now),
													 IntervalPGetDatum(older_than)));
	if (cutoff > now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("older_than must not be negative")));
	*older_than_text = DatumGetCString(DirectFunctionCall1(interval_out,
														   IntervalPGetDatum(older_than)));
	return cutoff;
}

/* purge_settled's max_runs: at least 1. */
static int32
max_runs_arg(FunctionCallInfo fcinfo, int argno)
{
	int32		max_runs;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_runs must not be null")));
	max_runs = PG_GETARG_INT32(argno);
	if (max_runs < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_runs must be at least 1")));
	return max_runs;
}

/*
 * purge_settled(older_than interval, purged_by text, dry_run boolean DEFAULT
 * true, max_runs integer DEFAULT 500) RETURNS TABLE (run text, effects
 * bigint, past_attempts bigint, divergences bigint)
 *
 * One row per run purged (or, with dry_run, that would be); at most max_runs
 * runs are closed (each holds a lock until the transaction ends): call again
 * until it returns nothing.  A dry run writes nothing and takes no lock.
 */
Datum
dl_purge_settled_1_3(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *older_than_text;
	char	   *purged_by;
	bool		dry_run;
	int32		max_runs;
	TimestampTz cutoff;
	char	   *after = "";
	int64		purged = 0;
	int64		closed = 0;
	PurgeCounts total = {0, 0, 0};

	cutoff = horizon_args(fcinfo, &older_than_text, &purged_by, &dry_run);
	max_runs = max_runs_arg(fcinfo, 3);
	if (!dry_run)
	{
		dl_check_writable("purge_settled()");
		refuse_snapshot_isolation("purge_settled()");
	}

	InitMaterializedSRF(fcinfo, 0);
	dl_spi_connect();
	while (purged < max_runs && closed < max_runs)
	{
		List	   *candidates = dl_read_purge_candidates(cutoff, after, CANDIDATE_BATCH);
		ListCell   *lc;

		if (candidates == NIL)
			break;
		foreach(lc, candidates)
		{
			char	   *run = lfirst(lc);
			PurgeCounts counts;

			after = run;
			if (purged >= max_runs || closed >= max_runs)
				break;
			if (!dl_read_run_purge_state(run, cutoff, false, &counts) || held(run))
				continue;
			if (!dry_run)
			{
				/*
				 * Closed for calls (at most max_runs are) and its effects
				 * locked against reports (waiting for those under way), then
				 * judged again as committed now: nothing may have started,
				 * been reported or taken the lease since.
				 */
				dl_run_lock_closing(dl_run_lock_key(run));
				closed++;
				if (!dl_read_run_purge_state(run, cutoff, true, &counts) ||
					!dl_read_run_purge_state(run, cutoff, false, &counts) || held(run))
					continue;
				dl_write_run_purge(run, &counts);
				audit_purge(run, purged_by, older_than_text, &counts, 0);
			}
			emit(rsinfo, run, &counts);
			purged++;
			total.effects += counts.effects;
			total.past_attempts += counts.past_attempts;
			total.divergences += counts.divergences;
		}
	}
	if (!dry_run && purged > 0)
	{
		audit_purge(NULL, purged_by, older_than_text, &total, purged);
		dl_note_durable_write();
	}
	dl_spi_finish();
	return (Datum) 0;
}

/*
 * purge_audit(older_than interval, purged_by text, dry_run boolean DEFAULT
 * true) RETURNS TABLE (chain bigint, audit_rows bigint, up_to_seq bigint)
 *
 * The audit log's horizon.  Removes rows logged before now - older_than of
 * runs that have no effect left (purge_settled removed them) and rows with no
 * run; a run with effects keeps all its rows (the ledger finds a run's effects
 * through them), and so does anything still open (AUDIT_ROW_PAST_HORIZON).
 * Of each hash chain only a prefix goes, and the chain is anchored at its
 * last removed row (durable_ledger.audit_anchors), so that verify_audit links
 * the next row to the anchor.  One row per chain.  A row without a chain is
 * never removed: since 1.3 there is none but one added by hand, which
 * verify_audit reports.  Audited once, with the counts and where each chain
 * was cut (with the hash there): an anchor that no purge's chained row
 * records is reported by verify_audit.
 */
Datum
dl_purge_audit_1_3(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *older_than_text;
	char	   *purged_by;
	bool		dry_run;
	TimestampTz cutoff = horizon_args(fcinfo, &older_than_text, &purged_by, &dry_run);
	List	   *plan;
	ListCell   *lc;
	int64		rows = 0;
	int64		chains = 0;
	StringInfoData cuts;

	if (!dry_run)
	{
		dl_check_writable("purge_audit()");
		refuse_snapshot_isolation("purge_audit()");
	}
	InitMaterializedSRF(fcinfo, 0);
	dl_spi_connect();
	plan = dl_read_audit_purge_plan(cutoff);
	initStringInfo(&cuts);
	appendStringInfoChar(&cuts, '[');
	foreach(lc, plan)
	{
		AuditPurge *purge = lfirst(lc);
		Datum		values[3];
		bool		nulls[3] = {false};
		int64		removed = dry_run ? purge->rows : dl_write_audit_purge(purge, purged_by);

		if (!dry_run && removed > 0)
		{
			char	   *hex = palloc(VARSIZE_ANY_EXHDR(purge->row_hash) * 2 + 1);

			hex[hex_encode(VARDATA_ANY(purge->row_hash), VARSIZE_ANY_EXHDR(purge->row_hash), hex)] = '\0';
			appendStringInfo(&cuts, "%s{\"chain\": " INT64_FORMAT ", \"chain_seq\": " INT64_FORMAT
							 ", \"row_hash\": \"%s\"}", cuts.len > 1 ? ", " : "",
							 purge->chain, purge->up_to_seq, hex);
		}

		values[0] = Int64GetDatum(purge->chain);
		values[1] = Int64GetDatum(removed);
		values[2] = Int64GetDatum(purge->up_to_seq);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		rows += removed;
		chains++;
	}
	if (!dry_run && rows > 0)
	{
		DetailBuilder detail;

		dl_detail_init(&detail);
		dl_detail_text(&detail, "purged_by", purged_by);
		dl_detail_text(&detail, "older_than", older_than_text);
		dl_detail_int(&detail, "audit_rows", rows);
		dl_detail_int(&detail, "chains", chains);
		appendStringInfoChar(&cuts, ']');
		/* where each chain was cut: what makes its anchor trustworthy (verify_audit) */
		dl_detail_jsonb(&detail, "cuts",
						DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(cuts.data))));
		dl_write_audit(NULL, NULL, AUDIT_AUDIT_PURGED, dl_detail_finish(&detail), 0, 0);
		dl_note_durable_write();
	}
	dl_spi_finish();
	return (Datum) 0;
}

/*
 * The audit log's append-only trigger (statement level, BEFORE UPDATE,
 * DELETE, TRUNCATE): refuses them, for the table's owner too; only
 * purge_audit's own DELETEs pass, while it runs them.
 */
Datum
dl_refuse_audit_log_change_1_2(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	const char *op;

	if (!CALLED_AS_TRIGGER(fcinfo))
		elog(ERROR, "refuse_audit_log_change() is a trigger");
	if (TRIGGER_FIRED_BY_DELETE(trigdata->tg_event) && dl_audit_purge_under_way())
		return PointerGetDatum(NULL);
	op = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ? "UPDATE" :
		TRIGGER_FIRED_BY_DELETE(trigdata->tg_event) ? "DELETE" : "TRUNCATE";
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("durable_ledger.audit_log is append-only"),
			 errdetail("%s is refused on the audit log, for its owner too.", op)));
	return PointerGetDatum(NULL);
}
