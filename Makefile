# durable_ledger: PGXS build.  The version lives only in durable_ledger.control.

EXTENSION  = durable_ledger
EXTVERSION = $(shell sed -n "s/^default_version *= *'\(.*\)'/\1/p" $(EXTENSION).control)
MODULE_big = durable_ledger
OBJS = \
	src/module.o \
	src/names.o \
	src/canonical.o \
	src/digest.o \
	src/keys.o \
	src/call.o \
	src/detail.o \
	src/identity.o \
	src/plans.o \
	src/cache.o \
	src/audit_chain.o \
	src/metrics.o \
	src/tables.o \
	src/reader.o \
	src/rows.o \
	src/index_plans.o \
	src/write_effects.o \
	src/write_runs.o \
	src/write_tokens.o \
	src/write_registry.o \
	src/write_retention.o \
	src/write_divergences.o \
	src/write_budgets.o \
	src/audit.o \
	src/durability.o \
	src/runlock.o \
	src/lease.o \
	src/held_runs.o \
	src/token_lease.o \
	src/liveness.o \
	src/counters.o \
	src/tools.o \
	src/divergence.o \
	src/budgets.o \
	src/models.o \
	src/decide.o \
	src/local.o \
	src/begin_funcs.o \
	src/report_funcs.o \
	src/report.o \
	src/resolve_funcs.o \
	src/approval_funcs.o \
	src/budget_funcs.o \
	src/status_funcs.o \
	src/lease_funcs.o \
	src/token_funcs.o \
	src/key_funcs.o \
	src/tool_funcs.o \
	src/run_funcs.o \
	src/purge_funcs.o \
	src/metrics_funcs.o \
	src/guard_funcs.o \
	src/older_funcs.o
# The default version's install script is built from schema/ (below); the
# released versions' scripts and the update scripts are installed as they are.
DATA_built = $(EXTENSION)--$(EXTVERSION).sql
DATA = $(filter-out $(DATA_built),$(wildcard $(EXTENSION)--*.sql))
PG_CPPFLAGS = -I$(srcdir)/src
# digest.c calls OpenSSL's SHA-256 itself when the server was built with it
# (PGXS's with_ssl); the server links the same library
SHLIB_LINK += $(if $(filter openssl,$(with_ssl)),-lcrypto)

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
	table_writes \
	index_plans \
	privileges \
	bad_input \
	rollback \
	leases \
	liveness \
	token_leases \
	session_attempts \
	tools \
	divergence \
	call_ids \
	unregistered \
	abandon \
	history \
	fork \
	audit_chain \
	purge \
	metrics \
	durability \
	search_path \
	hostile_input \
	unsettled \
	recorded \
	warnings \
	drop_guard \
	retry \
	reconcile \
	approvals \
	budgets \
	local_effects
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
	concurrent_writes \
	token_take_race \
	token_calls_serialised \
	token_call_rollback \
	token_policy_wait \
	token_vs_session \
	token_expiry_race \
	abandon_race \
	fork_race \
	tool_change_race \
	remembered_facts \
	policy_change \
	unsettled_repair \
	purge_race \
	purge_audit_race \
	attention \
	unnamed_report_two_runs \
	verdict_race \
	retry_race \
	reconcile_race \
	approval_race \
	budget_race \
	budget_attempts \
	local_race
ISOLATION_OPTS = --inputdir=$(srcdir)/test --encoding=UTF8 --load-extension=durable_ledger

# TAP tests (test/t/), each with clusters of its own: make prove_installcheck
TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

# the pages of docs/, installed with the extension (share/doc/extension/)
DOCS = $(wildcard docs/*.md)

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# The default version's install script, from its single source (as pgvector
# builds its own).  test/t/014_upgrade.pl proves it equal to the updates.
$(EXTENSION)--$(EXTVERSION).sql: schema/$(EXTENSION).sql
	cp $< $@

# every object depends on the headers (PGXS tracks them only in a server
# configured with --enable-depend): a changed struct must rebuild its users
$(OBJS): $(wildcard $(srcdir)/src/*.h)

# Everything, in throwaway clusters (as root too): see CONTRIBUTING.md.
.PHONY: test prove_installcheck check-clients check-layers deps demo console bench soak
test: all
	test/run-all.sh

# TAP alone (installcheck runs it after the regression and isolation suites).
prove_installcheck:
	$(prove_installcheck)

# The tests of what uses the ledger: the clients, the demo, the cookbook
# (test/apps/, TAP; each starts its own cluster).
APP_TESTS ?= test/apps/*.pl
check-clients:
	$(MAKE) prove_installcheck PROVE_TESTS='$(APP_TESTS)'

# src/ calls only downwards (reads the built objects).
check-layers: all
	test/check-layers.py src

deps:
	test/install-deps.sh

# The main job, on a throwaway cluster: see README "Run the demo".
demo:
	demo/run.sh

# The operator console on a throwaway cluster holding the demo's story, or
# against DATABASE (a postgresql:// URL without a user): docs/console.md.
console:
	console/run.sh $(if $(DATABASE),--database '$(DATABASE)')

# The model check with fresh seeds for SOAK_MINUTES (default 60): test/model/.
soak:
	test/model/soak.sh

# Speed against the floor of what durability costs; not part of the tests.
bench:
	bench/run.sh $(BENCH_ARGS)
