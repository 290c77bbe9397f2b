/*
 * rows.h: the row-write core of the store layer (rows.c), for the store's
 * own files that write a table (write_*.c, audit.c); the other layers use
 * store.h.  One write is one RowWrite, from dl_row_begin() (or
 * dl_row_lookup(), for a write that only locks or deletes rows and so opens
 * no index) to dl_row_end(), with AFTER triggers fired at its end.
 */
#ifndef DURABLE_LEDGER_ROWS_H
#define DURABLE_LEDGER_ROWS_H

#include "nodes/execnodes.h"

#include "tables.h"

typedef struct RowWrite
{
	LedgerTable *table;
	Relation	rel;
	EState	   *estate;
	ResultRelInfo *rri;
	RangeTblEntry *rte;
	TupleTableSlot *slot;		/* the new row's values */
	bool	   *set;			/* which attributes the ledger gave a value */
	bool		updating;		/* an update: its SET list is collected in updated */
	Bitmapset  *updated;		/* as RangeTblEntry.updatedCols */
} RowWrite;

extern void dl_row_begin(RowWrite *w, LedgerTable *t);
extern void dl_row_lookup(RowWrite *w, LedgerTable *t);
extern void dl_row_end(RowWrite *w);
extern void dl_row_set(RowWrite *w, int column, Datum value);
extern void dl_row_set_null(RowWrite *w, int column);
extern void dl_row_set_optional(RowWrite *w, int column, Datum value, bool isnull);
extern void dl_row_start_from(RowWrite *w, HeapTuple locked);
extern void dl_row_insert(RowWrite *w);
extern bool dl_row_lock_by(RowWrite *w, int nkeys, const int *key_columns,
						   const Datum *values, HeapTuple *tuple);
extern bool dl_row_lock(RowWrite *w, Datum value, int key_column, HeapTuple *tuple);
extern void dl_row_update(RowWrite *w, HeapTuple locked);
extern void dl_row_delete(RowWrite *w, HeapTuple locked, int nkeys, const int *key_columns,
						  const Datum *values);
extern Datum dl_row_stored(RowWrite *w, int column);
extern char *dl_row_locked_text(RowWrite *w, HeapTuple locked, int column);
extern Datum dl_row_now(void);
extern void dl_row_announce_change(RowWrite *w);
extern void dl_row_report_skipped(LedgerTable *t, const char *command);
extern void dl_row_report_changed_key(LedgerTable *t);

/* index_plans.c: ExecOpenIndices for a write, with what a transaction learned */
extern void dl_open_indexes(ResultRelInfo *rri);

#endif							/* DURABLE_LEDGER_ROWS_H */
