-- The floor: the same writes as the ledger, done by hand.  Tables with the
-- ledger's own columns, constraints and indexes, so that the comparison
-- measures what the extension adds, not a different schema.
CREATE TABLE floor_effects (LIKE durable_ledger.effects INCLUDING ALL) WITH (fillfactor = 85);
CREATE TABLE floor_audit (LIKE durable_ledger.audit_log INCLUDING ALL);
CREATE SEQUENCE floor_audit_id_seq OWNED BY floor_audit.id;
ALTER TABLE floor_audit ALTER COLUMN id SET DEFAULT nextval('floor_audit_id_seq');
CREATE TABLE floor_unsettled (LIKE durable_ledger.unsettled INCLUDING ALL);
-- a run's counter of a budgeted tool (1.3): the budgeted section's floor bumps it
CREATE TABLE floor_run_budgets (LIKE durable_ledger.run_budgets INCLUDING ALL);
