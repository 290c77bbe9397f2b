/*
 * compat.h: the few places where PostgreSQL versions differ.
 *
 * The extension is developed and tested against PostgreSQL 15; anything that
 * changes between major versions is kept here so that supporting 16 and 17 is
 * a matter of a few #if lines in one place.
 */
#ifndef DURABLE_LEDGER_COMPAT_H
#define DURABLE_LEDGER_COMPAT_H

#if PG_VERSION_NUM < 150000
#error "durable_ledger requires PostgreSQL 15 or later"
#endif

/* PostgreSQL 16 moved varatt macros into their own header. */
#if PG_VERSION_NUM >= 160000
#include "varatt.h"
#endif

/* PostgreSQL 16 gave EvalPlanQualInit the list of result relations. */
#if PG_VERSION_NUM >= 160000
#define dl_EvalPlanQualInit(epq, estate) \
	EvalPlanQualInit((epq), (estate), NULL, NIL, -1, NIL)
#else
#define dl_EvalPlanQualInit(epq, estate) \
	EvalPlanQualInit((epq), (estate), NULL, NIL, -1)
#endif

#endif							/* DURABLE_LEDGER_COMPAT_H */
