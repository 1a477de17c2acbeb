-- Monthly budgets (`gpurent budget set`): one per tenant (a user or a team), in micro-units,
-- with the percentages at which alerts are sent (a comma-separated list), whether running
-- reservations are stopped at the limit (1) and the low-balance horizon in hours (0: none).
CREATE TABLE budgets (
    tenant_id         TEXT PRIMARY KEY REFERENCES users (id),
    monthly           BIGINT NOT NULL CHECK (monthly > 0),
    alert_at          TEXT NOT NULL,
    stop_at_limit     INTEGER NOT NULL,
    low_balance_hours INTEGER NOT NULL,
    set_at            BIGINT NOT NULL
);
-- Each alert fired, once per tenant, month (`2026-12`) and alert (a threshold's percentage,
-- or `low_balance`): the primary key makes two replicas that fire the same one record it once.
CREATE TABLE budget_alerts (
    tenant_id TEXT NOT NULL,
    month     TEXT NOT NULL,
    alert     TEXT NOT NULL,
    spent     BIGINT NOT NULL,
    fired_at  BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, month, alert)
);
-- The month in which the tenant's spend reached its budget: its new reservations are refused
-- while it is the current month (read with its caps, in the reserve transaction).
ALTER TABLE users ADD COLUMN over_budget TEXT;
