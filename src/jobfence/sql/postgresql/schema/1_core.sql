-- The declared schema of jobfence on PostgreSQL. The numbered files in migrations/ must
-- produce exactly this (tests/test_migrations.py proves it).

CREATE SCHEMA IF NOT EXISTS core;

CREATE TABLE core.schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- The queue. A row lives only while its job is waiting or running: success deletes it
-- (leaving only the fence row), exhaustion moves it to core.dead_letters.
CREATE TABLE core.jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text NOT NULL CHECK (queue <> '' AND length(queue) <= 200),
    job_id           text NOT NULL CHECK (job_id <> '' AND length(job_id) <= 255),
    correlation_id   text,
    payload          bytea NOT NULL,
    state            text NOT NULL DEFAULT 'available' CHECK (state IN ('available', 'running')),
    attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    run_at           timestamptz NOT NULL DEFAULT now(),
    enqueued_at      timestamptz NOT NULL DEFAULT now(),
    lease_token      uuid,
    lease_expires_at timestamptz,
    worker_id        text,
    history          jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(history) = 'array'),
    CONSTRAINT jobs_lease_matches_state CHECK (
        (state = 'running') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)
    )
);
CREATE INDEX jobs_available_idx ON core.jobs (queue, run_at, id) WHERE state = 'available';
CREATE INDEX jobs_lease_idx ON core.jobs (lease_expires_at) WHERE state = 'running';

-- Wake idle workers: one notification per inserting statement and queue, delivered at commit.
CREATE FUNCTION core.jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('jobfence_jobs', q.queue) FROM (SELECT DISTINCT queue FROM new_jobs) AS q;
    RETURN NULL;
END;
$$;
CREATE TRIGGER jobs_notify AFTER INSERT ON core.jobs
    REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION core.jobs_notify();

-- The idempotency fence (SPEC F1): one row per (consumer, job_id), written in the same
-- transaction as the handler's work. Partitioned by day of expiry (9_fence_partitions.sql):
-- cleanup drops a whole day. A partition key on expires_at cannot carry a unique index on
-- (consumer, job_id), so core.fence() keeps the key unique (see there); this index finds a
-- key in every partition.
CREATE TABLE core.processed_jobs (
    consumer      text NOT NULL,
    job_id        text NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    CONSTRAINT processed_jobs_check CHECK (expires_at > processed_at)
) PARTITION BY RANGE (expires_at);
CREATE INDEX processed_jobs_key_idx ON core.processed_jobs (job_id, consumer);
-- Whatever no day partition holds (days not created yet, fences moved past their day because
-- cleanup must keep them) lands here, so an insert never fails; cleanup deletes its expired
-- rows in batches through this index.
CREATE TABLE core.processed_jobs_default PARTITION OF core.processed_jobs DEFAULT;
CREATE INDEX processed_jobs_default_expires_idx ON core.processed_jobs_default (expires_at);

-- The transaction boundary (SPEC H5): jobfence lends a handler the transaction that holds the
-- job's fence, and only jobfence may commit it. core.fence_begin(token) names the lent
-- transaction (SET LOCAL, so a ROLLBACK by anyone else forgets the name) and notes the
-- session's default transaction characteristics; core.fence_commit(token) runs in the same
-- round trip as jobfence's COMMIT and refuses a transaction that is not the one it began
-- (JF002) or whose session defaults changed (JF003); the deferred guard trigger refuses any
-- COMMIT of a fence written under a name that core.fence_commit did not approve (JF001), so
-- the fence and the work roll back together. Fences written in a caller's own transaction
-- (no name) are not guarded.
CREATE FUNCTION core.fence_begin(token text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('jobfence.tx', token, true);
    PERFORM set_config('jobfence.session', concat_ws('/',
        current_setting('default_transaction_isolation'),
        current_setting('default_transaction_read_only'),
        current_setting('default_transaction_deferrable')), true);
END $$;

CREATE FUNCTION core.fence_commit(token text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('jobfence.tx', true), '') IS DISTINCT FROM token THEN
        RAISE EXCEPTION 'jobfence: this is not the transaction jobfence lent the handler (it was ended or replaced)'
            USING ERRCODE = 'JF002';
    END IF;
    IF current_setting('jobfence.session', true) IS DISTINCT FROM concat_ws('/',
        current_setting('default_transaction_isolation'),
        current_setting('default_transaction_read_only'),
        current_setting('default_transaction_deferrable')) THEN
        RAISE EXCEPTION 'jobfence: the handler changed the session''s default transaction characteristics'
            USING ERRCODE = 'JF003';
    END IF;
    PERFORM set_config('jobfence.committing', token, true);
END $$;

CREATE FUNCTION core.fence_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('jobfence.committing', true), '')
       IS DISTINCT FROM coalesce(current_setting('jobfence.tx', true), '') THEN
        RAISE EXCEPTION 'jobfence: the transaction holding the fence of job % (consumer %) was committed by someone other than jobfence',
            NEW.job_id, NEW.consumer
            USING ERRCODE = 'JF001',
                  HINT = 'a handler must not commit the transaction it is given; jobfence commits the work with its fence';
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER fence_guard AFTER INSERT ON core.processed_jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (coalesce(current_setting('jobfence.tx', true), '') <> '')
    EXECUTE FUNCTION core.fence_guard();

-- Dead letters (SPEC D1, D1b, D2): evidence for people. The payload is kept as the exact
-- bytes received (up to a configurable limit; larger ones are truncated and say so).
CREATE TABLE core.dead_letters (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue             text NOT NULL,
    consumer          text NOT NULL,
    job_id            text NOT NULL,
    correlation_id    text,
    payload           bytea NOT NULL,
    payload_size      bigint NOT NULL CHECK (payload_size >= 0),
    payload_truncated boolean NOT NULL DEFAULT false,
    attempts          integer NOT NULL CHECK (attempts >= 0),
    error_category    text NOT NULL CHECK (error_category IN (
                          'VALIDATION_ERROR', 'BUSINESS_ERROR', 'TEMPORARY_ERROR',
                          'INTEGRATION_ERROR', 'AUTHENTICATION_ERROR', 'AUTHORIZATION_ERROR',
                          'TECHNICAL_ERROR', 'NON_RETRYABLE_ERROR')),
    error_code        text,
    last_error        text NOT NULL,
    history           jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(history) = 'array'),
    status            text NOT NULL DEFAULT 'pending_review'
                          CHECK (status IN ('pending_review', 'replayed', 'discarded')),
    enqueued_at       timestamptz,
    failed_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT dead_letters_payload_size CHECK (
        payload_truncated = (octet_length(payload) < payload_size)
        AND octet_length(payload) <= payload_size
    )
);
-- At most one letter pending review per (consumer, job_id): dead-lettering the same delivery
-- twice is absorbed.
CREATE UNIQUE INDEX dead_letters_pending_uq ON core.dead_letters (consumer, job_id)
    WHERE status = 'pending_review';
CREATE INDEX dead_letters_status_failed_idx ON core.dead_letters (status, failed_at);
CREATE INDEX dead_letters_queue_idx ON core.dead_letters (queue, failed_at);
