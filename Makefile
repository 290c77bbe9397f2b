# durable_ledger: PGXS build.  The version lives only in durable_ledger.control.

EXTENSION  = durable_ledger
EXTVERSION = $(shell sed -n "s/^default_version *= *'\(.*\)'/\1/p" $(EXTENSION).control)
MODULE_big = durable_ledger
OBJS = \
	src/module.o \
	src/canonical.o \
	src/keys.o \
	src/lease.o \
	src/store.o \
	src/direct.o \
	src/ledger.o \
	src/drop_guard.o \
	src/older_sql.o
DATA = $(wildcard $(EXTENSION)--*.sql)
PG_CPPFLAGS = -I$(srcdir)/src

# pg_regress suites: one file per concern (sql/ and expected/)
REGRESS = \
	install \
	decisions \
	occurrences \
	business_keys \
	attempts \
	canonical_args \
	keys \
	failures \
	resolution \
	audit_log \
	direct_writes \
	privileges \
	bad_input \
	rollback \
	leases \
	liveness \
	durability \
	search_path \
	hostile_input \
	drop_guard
REGRESS_OPTS = --encoding=UTF8 --load-extension=pgcrypto --load-extension=dblink

# isolation specs: one named permutation per interleaving (test/specs, test/expected)
ISOLATION = \
	lease_handoff \
	lease_nowait \
	business_key_race \
	report_race \
	attempt_reports \
	lease_lost \
	break_lease \
	rollback_while_waiting \
	direct_writes
ISOLATION_OPTS = --inputdir=$(srcdir)/test --encoding=UTF8 --load-extension=durable_ledger

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# The whole test suite in throwaway clusters; see README "Running the tests".
.PHONY: test deps demo bench
deps:
	test/install-deps.sh
test: all
	test/run-all.sh

# The main job, on a throwaway cluster: see README "The demo".
demo:
	demo/run.sh

# Speed against the floor of what durability costs; not part of the tests.
bench:
	bench/run.sh $(BENCH_ARGS)

print-%:
	@echo $($*)
