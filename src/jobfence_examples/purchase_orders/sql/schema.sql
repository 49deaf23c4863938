-- The purchase-order reference service (SPEC A2, seed 004 §10.2), PostgreSQL only, in its own
-- schema next to jobfence's `core`. Applied by `jobfence_examples.purchase_orders.migrate()`
-- (idempotent, under an advisory lock); `core` is migrated first because request rows and
-- outbox events are written in one transaction.
CREATE SCHEMA IF NOT EXISTS purchase_orders;

-- Partners are tenants, identified by their own bearer tokens (stored as SHA-256).
CREATE TABLE IF NOT EXISTS purchase_orders.partners (
    partner_id  text PRIMARY KEY CHECK (partner_id ~ '^[A-Za-z0-9_.-]{1,100}$'),
    name        text NOT NULL,
    token_hash  text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per accepted request. current_event_id is the outbox event (= job_id) the consumer
-- acts on; an operator retry replaces it, which makes older events stale.
CREATE TABLE IF NOT EXISTS purchase_orders.requests (
    request_id         uuid PRIMARY KEY,
    partner_id         text NOT NULL REFERENCES purchase_orders.partners (partner_id),
    idempotency_key    text,
    -- the key's window (the middleware's, when it named the key): until then the key names
    -- this request; after it the key is new and another request may take it, which releases
    -- it here (the key stays on this row as history)
    idempotency_expires_at  timestamptz,
    idempotency_released_at timestamptz,
    company_id         text NOT NULL,
    document_type      text NOT NULL,
    external_reference text,
    document           jsonb NOT NULL,
    state              text NOT NULL CHECK (state IN (
                           'RECEIVED', 'PUBLISHED', 'SENT_TO_ERP', 'COMPLETED', 'RETRY_PENDING',
                           'VALIDATION_FAILED', 'REJECTED', 'FAILED')),
    current_event_id   text NOT NULL UNIQUE,
    attempts           integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    operator_retries   integer NOT NULL DEFAULT 0 CHECK (operator_retries >= 0),
    erp_order_id       text,
    error_code         text,
    error_category     text,
    last_error         text,
    dead_letter_id     bigint,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT requests_completed_has_order CHECK ((state = 'COMPLETED') = (erp_order_id IS NOT NULL))
);
-- Databases made before keys expired here (issue 10 §3.1) get the two columns.
ALTER TABLE purchase_orders.requests ADD COLUMN IF NOT EXISTS idempotency_expires_at timestamptz;
ALTER TABLE purchase_orders.requests ADD COLUMN IF NOT EXISTS idempotency_released_at timestamptz;
-- E1: a client re-sending its POST (the HTTP layer answers it; this survives a server crash).
-- Unique among keys not yet released: a key whose window is over can name a new request.
DROP INDEX IF EXISTS purchase_orders.requests_idempotency_uq;
CREATE UNIQUE INDEX IF NOT EXISTS requests_idempotency_live_uq
    ON purchase_orders.requests (partner_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND idempotency_released_at IS NULL;
-- E2 / SPEC I3: the same source document twice.
CREATE UNIQUE INDEX IF NOT EXISTS requests_document_uq
    ON purchase_orders.requests (partner_id, company_id, document_type, external_reference)
    WHERE external_reference IS NOT NULL;
CREATE INDEX IF NOT EXISTS requests_state_idx ON purchase_orders.requests (state);

CREATE TABLE IF NOT EXISTS purchase_orders.request_history (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    request_id  uuid NOT NULL REFERENCES purchase_orders.requests (request_id),
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    state       text NOT NULL,
    event_id    text,
    detail      jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS request_history_request_idx
    ON purchase_orders.request_history (request_id, id);

-- Operator actions (seed 004 §10.5: "registra auditoría"). Append-only.
CREATE TABLE IF NOT EXISTS purchase_orders.audit (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text NOT NULL,
    role        text NOT NULL,
    scope       text,
    action      text NOT NULL,
    request_id  uuid NOT NULL REFERENCES purchase_orders.requests (request_id),
    detail      jsonb NOT NULL DEFAULT '{}'
);
