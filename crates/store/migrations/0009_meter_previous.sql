-- PostgreSQL settles the due meters in one pass (an UPDATE ... RETURNING, instead of joining
-- the table to itself); RETURNING gives the new values only, so each meter keeps the previous
-- settlement, charge and hold the period's transfers are named and priced from.
ALTER TABLE meters ADD COLUMN prev_settled BIGINT;
ALTER TABLE meters ADD COLUMN prev_charged BIGINT;
ALTER TABLE meters ADD COLUMN prev_held BIGINT;

-- Only charges are looked up by the account they debit (usage and invoices): holds and their
-- releases, one each per reservation, stay out of that index.
DROP INDEX transfers_debit_time;
CREATE INDEX transfers_charges ON transfers (debit_account, created_at) WHERE kind = 'charge';
-- postgres only below
-- Half of every page free: each period rewrites every running meter, and a page with room for
-- a new version of each of its rows rewrites them all in place (HOT), where 70% full pages
-- moved most of them to other pages and into the index the first periods after a busy hour.
ALTER TABLE meters SET (fillfactor = 45);
