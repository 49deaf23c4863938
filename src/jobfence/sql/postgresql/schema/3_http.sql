-- HTTP idempotency keys (SPEC I1–I4): one row per (partner_id, key). While a request runs the
-- row is in_progress under a lease the server renews; a server that dies stops renewing and
-- the key frees when the lease runs out. A completed row keeps the response to replay until
-- expires_at (default 24 h after the first request), then cleanup deletes it.
CREATE TABLE core.idempotency_keys (
    partner_id        text NOT NULL CHECK (length(partner_id) <= 255),
    key               text NOT NULL CHECK (key <> '' AND length(key) <= 255),
    fingerprint       text NOT NULL,
    state             text NOT NULL CHECK (state IN ('in_progress', 'completed')),
    lease_token       uuid,
    lease_expires_at  timestamptz,
    status_code       integer CHECK (status_code BETWEEN 100 AND 599),
    response_headers  jsonb,
    response_body     bytea,
    created_at        timestamptz NOT NULL DEFAULT now(),
    completed_at      timestamptz,
    expires_at        timestamptz NOT NULL,
    PRIMARY KEY (partner_id, key),
    CONSTRAINT idempotency_keys_state CHECK (
        (state = 'in_progress' AND lease_token IS NOT NULL AND lease_expires_at IS NOT NULL
             AND status_code IS NULL)
        OR (state = 'completed' AND lease_token IS NULL AND status_code IS NOT NULL
             AND response_headers IS NOT NULL AND response_body IS NOT NULL
             AND completed_at IS NOT NULL)
    )
);
CREATE INDEX idempotency_keys_expires_idx ON core.idempotency_keys (expires_at);
