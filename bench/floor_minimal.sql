-- The minimal floor: an intent row with its audit row, then the completion
-- with its audit row, in tables with the ledger's columns and one primary key
-- each (no other index, no copy of unsettled).  What the ledger costs above
-- it, before and after a change, is the access section of make bench.
CREATE TABLE minimal_effects (LIKE durable_ledger.effects INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
                              PRIMARY KEY (key)) WITH (fillfactor = 85);
CREATE TABLE minimal_audit (LIKE durable_ledger.audit_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
                            PRIMARY KEY (id));
CREATE SEQUENCE minimal_audit_id_seq OWNED BY minimal_audit.id;
ALTER TABLE minimal_audit ALTER COLUMN id SET DEFAULT nextval('minimal_audit_id_seq');
