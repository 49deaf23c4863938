-- HTTP idempotency keys (SPEC I1–I4) on SQLite; see the PostgreSQL schema for the rules.
CREATE TABLE core_idempotency_keys (
    partner_id        TEXT NOT NULL CHECK (length(partner_id) <= 255),
    key               TEXT NOT NULL CHECK (key <> '' AND length(key) <= 255),
    fingerprint       TEXT NOT NULL,
    state             TEXT NOT NULL CHECK (state IN ('in_progress', 'completed')),
    lease_token       TEXT,
    lease_expires_at  REAL,
    status_code       INTEGER CHECK (status_code BETWEEN 100 AND 599),
    response_headers  TEXT CHECK (response_headers IS NULL OR json_valid(response_headers)),
    response_body     BLOB,
    created_at        REAL NOT NULL,
    completed_at      REAL,
    expires_at        REAL NOT NULL,
    PRIMARY KEY (partner_id, key),
    CONSTRAINT idempotency_keys_state CHECK (
        (state = 'in_progress' AND lease_token IS NOT NULL AND lease_expires_at IS NOT NULL
             AND status_code IS NULL)
        OR (state = 'completed' AND lease_token IS NULL AND status_code IS NOT NULL
             AND response_headers IS NOT NULL AND response_body IS NOT NULL
             AND completed_at IS NOT NULL)
    )
) WITHOUT ROWID;
CREATE INDEX core_idempotency_keys_expires_idx ON core_idempotency_keys (expires_at);
