-- The transactional outbox (SPEC O1–O3). An application writes its domain row and an event
-- here in one transaction; a relay publishes the event to its queue with job_id = event_id,
-- so the consumer's fence absorbs a second publish.
--
--   PENDING ──publish ok──► PUBLISHED ──retention──► (deleted)
--      │ ▲
--      │ └── failure, attempts left (backoff: next_attempt_at)
--      └── failure, 5th attempt ──► PUBLISH_FAILED_RETRY ──operator re-drive──► PENDING
CREATE TABLE core.outbox (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id         text NOT NULL CHECK (event_id <> '' AND length(event_id) <= 255),
    queue            text NOT NULL CHECK (queue <> '' AND length(queue) <= 200),
    ordering_key     text CHECK (ordering_key <> '' AND length(ordering_key) <= 255),
    correlation_id   text,
    payload          bytea NOT NULL,
    state            text NOT NULL DEFAULT 'PENDING'
                         CHECK (state IN ('PENDING', 'PUBLISHED', 'PUBLISH_FAILED_RETRY')),
    attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    claim_token      uuid,
    claim_expires_at timestamptz,
    relay_id         text,
    last_error       text,
    history          jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(history) = 'array'),
    created_at       timestamptz NOT NULL DEFAULT now(),
    published_at     timestamptz,
    CONSTRAINT outbox_event_id_uq UNIQUE (event_id),
    CONSTRAINT outbox_published_at CHECK ((state = 'PUBLISHED') = (published_at IS NOT NULL)),
    CONSTRAINT outbox_claim CHECK ((claim_token IS NULL) = (claim_expires_at IS NULL))
);
CREATE INDEX outbox_pending_idx ON core.outbox (next_attempt_at, id) WHERE state = 'PENDING';
CREATE INDEX outbox_pending_id_idx ON core.outbox (id) WHERE state = 'PENDING';
CREATE INDEX outbox_key_idx ON core.outbox (ordering_key, id)
    WHERE state <> 'PUBLISHED' AND ordering_key IS NOT NULL;
CREATE INDEX outbox_published_idx ON core.outbox (published_at) WHERE state = 'PUBLISHED';
CREATE INDEX outbox_failed_idx ON core.outbox (queue, id) WHERE state = 'PUBLISH_FAILED_RETRY';

-- Wake idle relays: one notification per inserting statement, delivered at commit, only
-- while a relay waits (core.outbox_waiters): a NOTIFY takes a database-wide lock at commit
-- that serialises every notifying writer.
CREATE TABLE core.outbox_waiters (
    relay_id text PRIMARY KEY CHECK (relay_id <> '' AND length(relay_id) <= 200),
    until timestamptz NOT NULL
);
CREATE FUNCTION core.outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A relay about to wait registers, then takes this lock exclusively (waiting for every
    -- writer that holds it shared, i.e. that saw no waiter), then looks for events again:
    -- a writer that cannot take it shared, or sees a waiter, notifies.
    IF NOT pg_try_advisory_xact_lock_shared(1785292399, 1)
       OR EXISTS (SELECT 1 FROM core.outbox_waiters WHERE until > now()) THEN
        PERFORM pg_notify('jobfence_outbox', '');
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER outbox_notify AFTER INSERT ON core.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION core.outbox_notify();
