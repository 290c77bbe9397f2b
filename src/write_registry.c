/*
 * write_registry.c: the rows of durable_ledger.tools and of
 * durable_ledger.policy, what an admin says about tools.
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "rows.h"

/* ---------- the tools registry ---------- */

static void
set_tool_rules(RowWrite *w, const ToolRow *row)
{
	dl_row_set(w, TOOL_SIDE_EFFECTING, BoolGetDatum(row->side_effecting));
	dl_row_set(w, TOOL_DIVERGENCE, CStringGetTextDatum(dl_divergence_name(row->divergence)));
	if (row->nkey_fields < 0)
		dl_row_set_null(w, TOOL_KEY_FIELDS);
	else
	{
		Datum	   *elems = palloc(sizeof(Datum) * Max(row->nkey_fields, 1));
		int			i;

		for (i = 0; i < row->nkey_fields; i++)
			elems[i] = CStringGetTextDatum(row->key_fields[i]);
		dl_row_set(w, TOOL_KEY_FIELDS,
				  PointerGetDatum(construct_array(elems, row->nkey_fields, TEXTOID, -1, false,
												  TYPALIGN_INT)));
	}
	dl_row_set_optional(w, TOOL_NOTE, row->note ? CStringGetTextDatum(row->note) : (Datum) 0,
				 row->note == NULL);
	dl_row_set_optional(w, TOOL_RECONCILE_GRACE,
						row->reconcilable ? IntervalPGetDatum(&row->reconcile_grace) : (Datum) 0,
						!row->reconcilable);
	dl_row_set_optional(w, TOOL_APPROVAL, PointerGetDatum(row->approval), row->approval == NULL);
	dl_row_set_optional(w, TOOL_MAX_EXECUTIONS, Int32GetDatum(row->max_executions),
						row->max_executions == 0);
	dl_row_set_optional(w, TOOL_MAX_IN_WINDOW, Int32GetDatum(row->max_in_window),
						row->max_in_window == 0);
	dl_row_set_optional(w, TOOL_BUDGET_WINDOW, IntervalPGetDatum(&row->budget_window),
						row->max_in_window == 0);
}

/* Registers a tool that has no row. */
void
dl_write_new_tool(const ToolRow *row, const char *registered_by)
{
	RowWrite		w;

	dl_row_begin(&w, &dl_tools_table);
	dl_row_set(&w, TOOL_TOOL, CStringGetTextDatum(row->tool));
	set_tool_rules(&w, row);
	dl_row_set(&w, TOOL_REGISTERED_BY, CStringGetTextDatum(registered_by));
	dl_row_set(&w, TOOL_REGISTERED_AT, dl_row_now());
	dl_row_set_null(&w, TOOL_CHANGED_BY);
	dl_row_set_null(&w, TOOL_CHANGED_AT);
	dl_row_set_null(&w, TOOL_RETIRED_BY);
	dl_row_set_null(&w, TOOL_RETIRED_AT);
	dl_row_insert(&w);
	dl_row_announce_change(&w);
	dl_row_end(&w);
}

/* Locks tool's row for this transaction; false when it has none. */
bool
dl_lock_tool(const char *tool, LockedTool *locked)
{
	RowWrite		w;
	bool		found;

	dl_row_lookup(&w, &dl_tools_table);
	found = dl_row_lock(&w, CStringGetTextDatum(tool), TOOL_TOOL, &locked->tuple);
	if (found)
	{
		TupleTableSlot *slot = MakeSingleTupleTableSlot(RelationGetDescr(w.rel),
														&TTSOpsHeapTuple);

		ExecStoreHeapTuple(locked->tuple, slot, false);
		dl_tool_row_from_slot(slot, &locked->row);
		ExecDropSingleTupleTableSlot(slot);
	}
	dl_row_end(&w);
	return found;
}

/*
 * Gives a locked tool the rules of to, by changed_by; registered_anew: a
 * retired tool registered again, which is in use again from now.
 */
void
dl_write_tool_change(LockedTool *locked, const ToolRow *to, const char *changed_by,
					 bool registered_anew)
{
	RowWrite		w;

	dl_row_begin(&w, &dl_tools_table);
	dl_row_start_from(&w, locked->tuple);
	set_tool_rules(&w, to);
	if (registered_anew)
	{
		dl_row_set(&w, TOOL_REGISTERED_BY, CStringGetTextDatum(changed_by));
		dl_row_set(&w, TOOL_REGISTERED_AT, dl_row_now());
		dl_row_set_null(&w, TOOL_CHANGED_BY);
		dl_row_set_null(&w, TOOL_CHANGED_AT);
		dl_row_set_null(&w, TOOL_RETIRED_BY);
		dl_row_set_null(&w, TOOL_RETIRED_AT);
	}
	else
	{
		dl_row_set(&w, TOOL_CHANGED_BY, CStringGetTextDatum(changed_by));
		dl_row_set(&w, TOOL_CHANGED_AT, dl_row_now());
	}
	dl_row_update(&w, locked->tuple);
	dl_row_announce_change(&w);
	dl_row_end(&w);
}

/* A locked tool is retired: it is executed no more. */
void
dl_write_tool_retired(LockedTool *locked, const char *retired_by, const char *note)
{
	RowWrite		w;

	dl_row_begin(&w, &dl_tools_table);
	dl_row_start_from(&w, locked->tuple);
	dl_row_set(&w, TOOL_RETIRED_BY, CStringGetTextDatum(retired_by));
	dl_row_set(&w, TOOL_RETIRED_AT, dl_row_now());
	if (note != NULL)
		dl_row_set(&w, TOOL_NOTE, CStringGetTextDatum(note));
	dl_row_update(&w, locked->tuple);
	dl_row_announce_change(&w);
	dl_row_end(&w);
}

/* ---------- the ledger's policy ---------- */

/*
 * Sets what the ledger does with a tool nobody registered: the settings
 * given (NULL: kept as the locked row has them, also a change this very
 * statement made); returns what it did before (no row:
 * DL_UNREGISTERED_DEFAULT), *after what it does now.
 */
UnregisteredPolicy
dl_write_unregistered_policy(const UnregisteredTools *may_execute,
							 const DivergencePolicy *divergence, const char *changed_by,
							 const char *note, UnregisteredPolicy *after)
{
	RowWrite		w;
	HeapTuple	current;
	UnregisteredPolicy before = DL_UNREGISTERED_DEFAULT;
	UnregisteredPolicy *to = after;

	dl_row_begin(&w, &dl_policy_table);
	if (dl_row_lock(&w, BoolGetDatum(true), POL_SINGLETON, &current))
	{
		(void) dl_unregistered_from_name(dl_row_locked_text(&w, current, POL_UNREGISTERED_TOOLS),
										 &before.may_execute);
		(void) dl_divergence_from_name(dl_row_locked_text(&w, current, POL_UNREGISTERED_DIVERGENCE),
									   &before.divergence);
		dl_row_start_from(&w, current);
	}
	else
		dl_row_set(&w, POL_SINGLETON, BoolGetDatum(true));
	*to = before;
	if (may_execute != NULL)
		to->may_execute = *may_execute;
	if (divergence != NULL)
		to->divergence = *divergence;
	dl_row_set(&w, POL_UNREGISTERED_TOOLS, CStringGetTextDatum(dl_unregistered_name(to->may_execute)));
	dl_row_set(&w, POL_UNREGISTERED_DIVERGENCE, CStringGetTextDatum(dl_divergence_name(to->divergence)));
	dl_row_set(&w, POL_CHANGED_BY, CStringGetTextDatum(changed_by));
	dl_row_set(&w, POL_CHANGED_AT, dl_row_now());
	dl_row_set_optional(&w, POL_NOTE, note ? CStringGetTextDatum(note) : (Datum) 0, note == NULL);
	if (w.updating)
		dl_row_update(&w, current);
	else
		dl_row_insert(&w);
	dl_row_announce_change(&w);
	dl_row_end(&w);
	return before;
}
