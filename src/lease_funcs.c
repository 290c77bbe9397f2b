/*
 * lease_funcs.c: acquire_run(), release_run(), session_epoch(),
 * release_attempt() and break_lease(), the SQL functions of session leases
 * (lease.c keeps them).
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "catalog/pg_authid.h"
#include "utils/acl.h"
#include "utils/fmgrprotos.h"

#include "lease.h"

PG_FUNCTION_INFO_V1(dl_acquire_run_1_2);
PG_FUNCTION_INFO_V1(dl_release_run_1_1);
PG_FUNCTION_INFO_V1(dl_break_lease_1_1);
PG_FUNCTION_INFO_V1(dl_session_epoch_1_3);
PG_FUNCTION_INFO_V1(dl_release_attempt_1_3);

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
 * Terminates holder, the backend that holds run's session lease (waiting
 * for it to end), and audits it as lease_broken at epoch; whether it ended.
 * epoch 0: the run's latest epoch, read once the holder ended (until then
 * it may start another attempt, whose epoch is the one broken).
 */
static bool
terminate_holder(const char *run, int holder, int64 epoch, const char *broken_by,
				 const char *note)
{
	bool		terminated;
	DetailBuilder detail;
	RunState	state;

	terminated = DatumGetBool(DirectFunctionCall2(pg_terminate_backend,
												  Int32GetDatum(holder),
												  Int64GetDatum(BREAK_LEASE_WAIT_MS)));
	if (epoch == 0 && dl_read_run_state(run, &state))
		epoch = state.epoch;
	dl_detail_init(&detail);
	dl_detail_text(&detail, "broken_by", broken_by);
	dl_detail_text(&detail, "note", note);
	dl_detail_int(&detail, "holder_pid", holder);
	dl_detail_bool(&detail, "terminated", terminated);
	dl_write_audit(run, NULL, AUDIT_LEASE_BROKEN, dl_detail_finish(&detail), epoch, 0);
	dl_note_durable_write();
	return terminated;
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
	terminated = terminate_holder(run, holder, 0, broken_by, note);
	dl_spi_finish();

	PG_RETURN_BOOL(terminated);
}

/*
 * session_epoch(run text) RETURNS bigint
 *
 * The epoch of this session's lease of run, NULL when this session holds
 * none.  A client that keeps its attempt's epoch asks it in the very
 * statement of each call (and calls only when it is still the same): through
 * a transaction pooler, a statement may reach another server connection, or
 * one whose session another client's attempt took over.  Writes nothing.
 */
Datum
dl_session_epoch_1_3(PG_FUNCTION_ARGS)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	int64		epoch = dl_lease_held_epoch(run);

	if (epoch == 0)
		PG_RETURN_NULL();
	PG_RETURN_INT64(epoch);
}

/*
 * pg_terminate_backend's own rule, for the calling role (the function runs
 * as the extension's owner): a backend of a role it has the privileges of,
 * or any with pg_signal_backend; a superuser's only by a superuser.
 */
static void
check_may_signal(int holder, const char *run)
{
	PGPROC	   *proc = BackendPidGetProc(holder);
	Oid			caller = GetOuterUserId();

	if (proc == NULL)
		return;					/* gone already: nothing will be signalled */
	if ((superuser_arg(proc->roleId) && !superuser_arg(caller)) ||
		(!has_privs_of_role(caller, proc->roleId) &&
		 !has_privs_of_role(caller, ROLE_PG_SIGNAL_BACKEND)))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to end the lease on run \"%s\"", run),
				 errdetail("Backend %d holds it; only a role that may terminate that backend (pg_terminate_backend's rule) ends it.",
						   holder),
				 errhint("An admin ends it with durable_ledger.break_lease().")));
}

/*
 * release_attempt(run text, epoch bigint) RETURNS boolean
 *
 * Ends the session lease of run at epoch wherever it is held: released when
 * this session holds it (as release_run); when another backend does -- a
 * transaction pooler gave the client that took it another server
 * connection, and the lock stayed on the first, where any other client
 * would meet it -- that backend is terminated, as the calling role may
 * (check_may_signal), and audited as lease_broken.  False when no live
 * session lease holds run at epoch: it ended, or a later attempt superseded
 * it (which is never touched).  The run's row stays locked until the
 * transaction ends, so that the holder cannot release the run and go on to
 * serve someone else while it is judged.
 */
Datum
dl_release_attempt_1_3(PG_FUNCTION_ARGS)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	int64		epoch;
	RunState	state;
	int			holder = 0;
	bool		terminated;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("epoch must not be null")));
	epoch = PG_GETARG_INT64(1);
	if (epoch < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("epoch must be at least 1, not " INT64_FORMAT, epoch)));
	dl_check_writable("release_attempt()");

	dl_spi_connect();
	if (dl_lease_is_mine(run, epoch))
	{
		bool		released = dl_lease_release(run);

		dl_spi_finish();
		PG_RETURN_BOOL(released);
	}
	if (!dl_lock_run(run) || !dl_read_run_state(run, &state) || state.epoch != epoch ||
		state.token || state.released ||
		(holder = dl_read_lease_holder_pid(dl_run_lock_key(run))) == 0 ||
		holder != state.holder_pid || holder == MyProcPid)
	{
		dl_spi_finish();
		PG_RETURN_BOOL(false);
	}
	check_may_signal(holder, run);
	terminated = terminate_holder(run, holder, epoch, "release_attempt",
								  "the session lease of this epoch was ended from another backend: its client's calls reached a server connection that did not hold it");
	dl_spi_finish();

	PG_RETURN_BOOL(terminated);
}
