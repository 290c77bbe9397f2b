/*
 * lease_calls.c: acquire_run(), release_run() and break_lease(), the SQL
 * functions of leases (lease.c keeps them).
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "utils/acl.h"
#include "utils/fmgrprotos.h"

#include "lease.h"

PG_FUNCTION_INFO_V1(dl_acquire_run_1_2);
PG_FUNCTION_INFO_V1(dl_release_run_1_1);
PG_FUNCTION_INFO_V1(dl_break_lease_1_1);

/* How long break_lease waits for the holder's backend to end. */
#define BREAK_LEASE_WAIT_MS 10000

/* acquire_run(run text, wait boolean) RETURNS boolean */
Datum
dl_acquire_run_1_2(PG_FUNCTION_ARGS)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	bool		acquired;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("wait must not be null")));
	dl_check_writable("acquire_run()");

	dl_spi_connect();
	acquired = dl_lease_acquire(run, PG_GETARG_BOOL(1));
	dl_spi_finish();
	PG_RETURN_BOOL(acquired);
}

/* release_run(run text) RETURNS boolean */
Datum
dl_release_run_1_1(PG_FUNCTION_ARGS)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	bool		released;

	dl_check_writable("release_run()");
	dl_spi_connect();
	released = dl_lease_release(run);
	dl_spi_finish();
	PG_RETURN_BOOL(released);
}

/*
 * break_lease follows pg_terminate_backend's own rule: only a superuser ends
 * a superuser's session.  The function runs as the extension's owner, so the
 * caller is the role as after SET ROLE, as the audit log records it.
 */
static void
check_may_terminate(int holder, const char *run)
{
	PGPROC	   *proc = BackendPidGetProc(holder);

	if (proc != NULL && superuser_arg(proc->roleId) && !superuser_arg(GetOuterUserId()))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to break the lease on run \"%s\"", run),
				 errdetail("Its holder is a superuser's session; only a superuser may terminate it.")));
}

/*
 * break_lease(run text, broken_by text, note text) RETURNS boolean
 *
 * A token lease that holds the run expires at once (nothing is terminated);
 * a session lease ends with the holding backend, which is terminated.  Both
 * are audited with the name; false when nobody holds the run.
 */
Datum
dl_break_lease_1_1(PG_FUNCTION_ARGS)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	char	   *broken_by = dl_required_text_arg(fcinfo, 1, "broken_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 2);
	int			holder;
	bool		terminated;
	DetailBuilder detail;
	RunState	state;

	dl_check_writable("break_lease()");
	dl_spi_connect();
	if (dl_token_break(run, broken_by, note))
	{
		dl_spi_finish();
		PG_RETURN_BOOL(true);
	}
	holder = dl_read_lease_holder_pid(dl_run_lock_key(run));
	if (holder == 0)
	{
		dl_spi_finish();
		PG_RETURN_BOOL(false);
	}
	if (holder == MyProcPid)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("this session holds the lease on run \"%s\"", run),
				 errhint("Use durable_ledger.release_run() to release it.")));
	check_may_terminate(holder, run);

	terminated = DatumGetBool(DirectFunctionCall2(pg_terminate_backend,
												  Int32GetDatum(holder),
												  Int64GetDatum(BREAK_LEASE_WAIT_MS)));

	if (!dl_read_run_state(run, &state))
		state.epoch = 0;
	dl_detail_init(&detail);
	dl_detail_text(&detail, "broken_by", broken_by);
	dl_detail_text(&detail, "note", note);
	dl_detail_int(&detail, "holder_pid", holder);
	dl_detail_bool(&detail, "terminated", terminated);
	dl_write_audit(run, NULL, "lease_broken", dl_detail_finish(&detail), state.epoch, 0);
	dl_note_durable_write();
	dl_spi_finish();

	PG_RETURN_BOOL(terminated);
}
