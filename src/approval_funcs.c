/*
 * approval_funcs.c: approve_effect() and reject_effect(), an approver's
 * verdict on a call that waits for approval (set_approval), with a name.
 *
 * The verdict is on the key, i.e. on the exact call recorded (its tool and
 * canonical args): a call with other args has a key of its own, and its own
 * approval.  Separation of duties: nobody approves a call their own role
 * made -- neither the role nor the login (session user) of the call that
 * asked for the approval may give the verdict (docs/reference.md,
 * "Approvals").
 */
#include "postgres.h"

#include "miscadmin.h"

#include "store.h"

PG_FUNCTION_INFO_V1(dl_approve_effect_1_3);
PG_FUNCTION_INFO_V1(dl_reject_effect_1_3);

/*
 * The verdict on row a verdict already gave; APPROVAL_REQUESTED: none yet,
 * the call waits; APPROVAL_NONE: nothing waits for one (a call that needed
 * none, or whose request a person settled otherwise: resolve_effect).
 */
static Approval
verdict_given(const EffectRow *row)
{
	/* a row nobody asked an approval for (one set by hand) takes no verdict */
	if (row->approval == APPROVAL_NONE)
		return APPROVAL_NONE;
	if (row->status == EFFECT_AWAITING_APPROVAL)
		return APPROVAL_REQUESTED;
	if (row->approval == APPROVAL_REQUESTED)
		return APPROVAL_NONE;
	return row->approval;
}

/* The caller is not who made the call: neither its role nor its login. */
static void
check_not_requester(const EffectRow *row)
{
	char	   *role_name;
	char	   *session_user_name;
	char	   *my_role = dl_caller_role_name();
	char	   *my_login = GetUserNameFromId(GetSessionUserId(), false);

	if (!dl_read_approval_requester(row->key, row->attempt, row->created_at, &role_name,
									&session_user_name))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the request for the approval of effect \"%s\" is not in the audit log",
						row->key),
				 errdetail("Who asked for it cannot be told apart from who approves it."),
				 errhint("The ledger keeps that row while the call waits: it was removed by hand. No verdict can be given; a person may abandon the run (abandon_run).")));
	if (strcmp(role_name, my_role) == 0 || strcmp(session_user_name, my_role) == 0 ||
		strcmp(role_name, my_login) == 0 || strcmp(session_user_name, my_login) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role \"%s\" may not give the verdict on a call it made", my_role),
				 errdetail("The call of effect \"%s\" was made by role \"%s\" (session user \"%s\").",
						   row->key, role_name, session_user_name),
				 errhint("Another person, logged in as a role of their own that is a member of durable_ledger_approver, decides.")));
}

static void
audit_verdict(const EffectRow *before, bool approved, const char *by, const char *note)
{
	DetailBuilder detail;

	dl_detail_init(&detail);
	dl_detail_text(&detail, approved ? "approved_by" : "rejected_by", by);
	dl_detail_text(&detail, "note", note);
	dl_detail_text(&detail, "tool", before->tool);
	dl_detail_jsonb(&detail, "args", before->args);
	dl_write_audit(before->run, before->key, approved ? AUDIT_APPROVED : AUDIT_REJECTED,
				   dl_detail_finish(&detail), before->lease_epoch, before->attempt);
}

/*
 * The verdict on key's call.  The same verdict again changes nothing (a
 * retry after a lost answer); the other one, once a verdict was given, is
 * refused: an approved call may already be executing.
 */
static Datum
give_verdict(FunctionCallInfo fcinfo, bool approved, const char *function)
{
	char	   *key = dl_required_text_arg(fcinfo, 0, "key", 0);
	char	   *by = dl_required_text_arg(fcinfo, 1, approved ? "approved_by" : "rejected_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 2);
	TupleDesc	desc = dl_result_desc(fcinfo);
	Approval	wanted = approved ? APPROVAL_APPROVED : APPROVAL_REJECTED;
	LockedEffect locked;
	EffectRow	before;
	HeapTuple	row;
	Datum		result;

	dl_check_writable(function);
	dl_spi_connect();
	if (!dl_lock_effect(key, &locked))
		dl_error_unknown_key(key);
	before = locked.row;
	if (before.conflict && before.approval != APPROVAL_NONE)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("effect \"%s\" waits for a person's resolution", key),
				 errdetail("A report on it contradicts what was recorded: it says the call was performed."),
				 errhint("Resolve it with durable_ledger.resolve_effect() instead.")));
	if (verdict_given(&before) == APPROVAL_NONE)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("effect \"%s\" does not wait for an approval", key),
				 before.approval == APPROVAL_NONE ?
				 errdetail("Its current attempt (%d) is %s and was not recorded as needing an approval.",
						   before.attempt, dl_status_name(before.status)) :
				 errdetail("A person settled its request for an approval otherwise: attempt %d is %s.",
						   before.attempt, dl_status_name(before.status))));
	if (verdict_given(&before) == wanted)
		row = locked.tuple;		/* given again: nothing to change */
	else if (verdict_given(&before) != APPROVAL_REQUESTED)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the call of effect \"%s\" was %s already", key,
						before.approval == APPROVAL_APPROVED ? "approved" : "rejected"),
				 errdetail("Attempt %d is %s.", before.attempt, dl_status_name(before.status)),
				 errhint("A verdict is not taken back: an approved call may be executing.")));
	else
	{
		check_not_requester(&before);
		row = dl_write_approval(&locked, approved, by, note);
		audit_verdict(&before, approved, by, note);
		dl_note_durable_write();
	}
	result = PointerGetDatum(SPI_returntuple(row, desc));
	dl_spi_finish();
	PG_RETURN_DATUM(result);
}

/* approve_effect(key text, approved_by text, note text) RETURNS durable_ledger.effects */
Datum
dl_approve_effect_1_3(PG_FUNCTION_ARGS)
{
	return give_verdict(fcinfo, true, "approve_effect()");
}

/* reject_effect(key text, rejected_by text, note text) RETURNS durable_ledger.effects */
Datum
dl_reject_effect_1_3(PG_FUNCTION_ARGS)
{
	return give_verdict(fcinfo, false, "reject_effect()");
}
