-- Settlement writes each running reservation's meter every period and a transfer for each.
-- Transfers are found by the account they debit and their time (statements), host earnings by
-- the account they credit; the ledger check scans them all. One index less per transfer.
DROP INDEX transfers_debit;
DROP INDEX transfers_credit;
CREATE INDEX transfers_debit_time ON transfers (debit_account, created_at);
CREATE INDEX transfers_earnings ON transfers (credit_account, created_at) WHERE kind = 'earning';

-- What settlement reads and writes every period lives in a table of its own: rewriting a few
-- numbers does not copy a whole reservation row (its command, environment, GPU list), and a
-- period is computed from this table alone. One row per reservation from its creation on, with
-- its rate and tenant copied (they never change); settled_until is set exactly while the
-- reservation runs: a stop, an expiry or a preemption clears it, so that a settlement that read
-- it before cannot charge past the stop, and `finish` charges the rest.
CREATE TABLE meters (
    reservation_id  TEXT PRIMARY KEY REFERENCES reservations (id),
    tenant_id       TEXT NOT NULL,
    node_id         TEXT,
    prepaid_block   BIGINT NOT NULL,
    price_per_hour  BIGINT NOT NULL,
    price_step_s    BIGINT,
    price_after     BIGINT,
    duration_s      BIGINT NOT NULL,
    host_share_bps  BIGINT NOT NULL,
    started_at      BIGINT,
    charged         BIGINT NOT NULL,
    held            BIGINT NOT NULL,
    settled_until   BIGINT
);
INSERT INTO meters (reservation_id, tenant_id, node_id, prepaid_block, price_per_hour,
        price_step_s, price_after, duration_s, host_share_bps, started_at, charged, held,
        settled_until)
    SELECT id, tenant_id, node_id, CASE WHEN tier = 'reserved' THEN 1 ELSE 0 END, price_per_hour,
           price_step_s, price_after, duration_s, host_share_bps, started_at, charged, held,
           CASE WHEN status = 'running' THEN settled_until END
    FROM reservations;
ALTER TABLE reservations DROP COLUMN charged;
ALTER TABLE reservations DROP COLUMN held;
ALTER TABLE reservations DROP COLUMN settled_until;
-- postgres only below
-- Free room on every page lets PostgreSQL rewrite a meter in place (a HOT update).
ALTER TABLE meters SET (fillfactor = 70);
-- Each transfer's accounts are moved in the same transaction, which fails when one is missing
-- (see ledger.rs and settlement.rs), and `ledger-check` names any transfer whose account does
-- not exist; the foreign keys cost two lookups (and on PostgreSQL two row locks) per transfer
-- on top. Both databases drop them.
ALTER TABLE transfers DROP CONSTRAINT transfers_debit_account_fkey;
ALTER TABLE transfers DROP CONSTRAINT transfers_credit_account_fkey;
-- sqlite only below
-- SQLite cannot drop a constraint: the transfers table is rebuilt without the foreign keys.
CREATE TABLE transfers_rebuilt (
    id              TEXT PRIMARY KEY,
    debit_account   TEXT NOT NULL,
    credit_account  TEXT NOT NULL,
    amount          BIGINT NOT NULL CHECK (amount > 0),
    reservation_id  TEXT,
    created_at      BIGINT NOT NULL,
    kind            TEXT NOT NULL DEFAULT 'charge',
    node_id         TEXT
);
INSERT INTO transfers_rebuilt (id, debit_account, credit_account, amount, reservation_id,
        created_at, kind, node_id)
    SELECT id, debit_account, credit_account, amount, reservation_id, created_at, kind, node_id
    FROM transfers;
DROP TABLE transfers;
ALTER TABLE transfers_rebuilt RENAME TO transfers;
CREATE INDEX transfers_debit_time ON transfers (debit_account, created_at);
CREATE INDEX transfers_earnings ON transfers (credit_account, created_at) WHERE kind = 'earning';
CREATE INDEX transfers_node ON transfers (node_id, created_at) WHERE node_id IS NOT NULL;
