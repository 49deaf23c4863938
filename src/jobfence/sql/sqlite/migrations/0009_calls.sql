-- 0009: the call ledger (issue 25, SPEC E1–E4): a handler's call to a system outside the
-- database as a recorded step of its job — intent before the request leaves, outcome after,
-- in-doubt calls resolved or parked, settled by operators (jobfence.calls).
CREATE TABLE core_calls (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer        TEXT NOT NULL,
    queue           TEXT NOT NULL,
    job_id          TEXT NOT NULL,
    step            TEXT NOT NULL CHECK (length(step) BETWEEN 1 AND 200),
    idem_key        TEXT NOT NULL CHECK (length(idem_key) BETWEEN 1 AND 255),
    partner         TEXT,
    state           TEXT NOT NULL DEFAULT 'pending' CHECK (state IN (
                        'pending', 'succeeded', 'failed', 'in_doubt', 'applied', 'not_applied')),
    attempts        INTEGER NOT NULL DEFAULT 1 CHECK (attempts >= 0),
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL,
    outcome         TEXT CHECK (
                        outcome IS NULL
                        OR (json_valid(outcome) AND length(CAST(outcome AS BLOB)) <= 8192)),
    reference       TEXT CHECK (length(reference) <= 500),
    last_error      TEXT,
    settled_by      TEXT,
    settled_reason  TEXT,
    settled_at      REAL,
    CONSTRAINT calls_job_step_uq UNIQUE (consumer, job_id, step),
    CONSTRAINT calls_settled CHECK (
        state NOT IN ('applied', 'not_applied') OR settled_at IS NOT NULL)
);
CREATE INDEX core_calls_open_idx ON core_calls (created_at)
    WHERE state IN ('pending', 'in_doubt');
