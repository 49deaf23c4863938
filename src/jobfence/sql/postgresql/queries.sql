-- Every runtime statement of jobfence on PostgreSQL, as named blocks ("-- name: x").
-- Parameters use psycopg's %(name)s style. Loaded once by jobfence.sql.

-- name: create_migrations_table
CREATE SCHEMA IF NOT EXISTS core;
CREATE TABLE IF NOT EXISTS core.schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: lock_migrations
SELECT pg_advisory_xact_lock(7283611042)

-- name: applied_migrations
SELECT version FROM core.schema_migrations ORDER BY version

-- name: record_migration
INSERT INTO core.schema_migrations (version, name) VALUES (%(version)s, %(name)s)

-- name: schema_version
SELECT coalesce(max(version), 0) AS version FROM core.schema_migrations

-- name: schema_present
SELECT to_regclass('core.schema_migrations') IS NOT NULL AS present

-- name: enqueue
INSERT INTO core.jobs (queue, job_id, correlation_id, payload, run_at)
VALUES (%(queue)s, %(job_id)s, %(correlation_id)s, %(payload)s,
        now() + make_interval(secs => %(delay)s))

-- name: claim
-- One ordered index range per queue (an ANY(...) over the queues would read every available
-- row and sort them), the oldest first across queues.
WITH candidates AS (
    SELECT c.id, c.run_at
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT id, run_at FROM core.jobs
        WHERE state = 'available' AND queue = q.name AND run_at <= now()
        ORDER BY run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.run_at, c.id
    LIMIT %(limit)s
)
UPDATE core.jobs AS j SET
    state = 'running',
    attempts = j.attempts + 1,
    lease_token = gen_random_uuid(),
    lease_expires_at = now() + make_interval(secs => %(lease)s),
    worker_id = %(worker_id)s
FROM candidates AS c
WHERE j.id = c.id
RETURNING j.id, j.queue, j.job_id, j.correlation_id, j.payload, j.attempts,
          j.enqueued_at, j.lease_token, j.history

-- name: next_run_at
SELECT extract(epoch FROM (min(n.run_at) - now()))::float8 AS wait
FROM unnest(%(queues)s::text[]) AS q(name)
CROSS JOIN LATERAL (
    SELECT run_at FROM core.jobs
    WHERE state = 'available' AND queue = q.name
    ORDER BY run_at
    LIMIT 1
) AS n

-- name: reap_expired
WITH expired AS (
    SELECT id FROM core.jobs
    WHERE state = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE core.jobs AS j SET
    state = 'available',
    run_at = now(),
    lease_token = NULL,
    lease_expires_at = NULL,
    history = j.history || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempts,
        'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'category', 'TECHNICAL_ERROR',
        'error', 'lease expired: the worker ' || coalesce(j.worker_id, '?')
                 || ' stopped renewing it (killed or lost)')),
    worker_id = NULL
FROM expired AS e
WHERE j.id = e.id
RETURNING j.queue

-- name: extend_leases
UPDATE core.jobs SET lease_expires_at = now() + make_interval(secs => %(lease)s)
WHERE id IN (
    SELECT id FROM core.jobs
    WHERE id = ANY(%(ids)s) AND lease_token = ANY(%(tokens)s) AND state = 'running'
    FOR UPDATE SKIP LOCKED
)

-- name: fence_and_ack
WITH acked AS (
    DELETE FROM core.jobs WHERE id = %(id)s AND lease_token = %(token)s RETURNING id
), fenced AS (
    INSERT INTO core.processed_jobs (consumer, job_id, expires_at)
    SELECT %(consumer)s, %(job_id)s, now() + make_interval(secs => %(ttl)s) FROM acked
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM acked) AS acked, (SELECT count(*) FROM fenced) AS fenced

-- name: fence
INSERT INTO core.processed_jobs (consumer, job_id, expires_at)
VALUES (%(consumer)s, %(job_id)s, now() + make_interval(secs => %(ttl)s))
ON CONFLICT DO NOTHING
RETURNING 1 AS fenced

-- name: ack
DELETE FROM core.jobs WHERE id = %(id)s AND lease_token = %(token)s RETURNING id

-- name: retry
UPDATE core.jobs SET
    state = 'available',
    run_at = now() + make_interval(secs => %(delay)s),
    lease_token = NULL,
    lease_expires_at = NULL,
    worker_id = NULL,
    history = history || jsonb_build_array(jsonb_build_object(
        'attempt', attempts,
        'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'category', %(category)s::text,
        'error', %(error)s::text,
        'retry_at', to_char((now() + make_interval(secs => %(delay)s)) AT TIME ZONE 'UTC',
                            'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')))
WHERE id = %(id)s AND lease_token = %(token)s

-- name: release
UPDATE core.jobs SET
    state = 'available',
    run_at = now(),
    attempts = greatest(attempts - %(refund)s, 0),
    lease_token = NULL,
    lease_expires_at = NULL,
    worker_id = NULL
WHERE id = %(id)s AND lease_token = %(token)s

-- name: now
SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS now

-- name: insert_dead_letter
INSERT INTO core.dead_letters (
    queue, consumer, job_id, correlation_id, payload, payload_size, payload_truncated,
    attempts, error_category, error_code, last_error, history, enqueued_at, partner,
    previous_id)
VALUES (
    %(queue)s, %(consumer)s, %(job_id)s, %(correlation_id)s, %(payload)s, %(payload_size)s,
    %(payload_truncated)s, %(attempts)s, %(category)s, %(error_code)s, %(error)s,
    %(history)s::jsonb || jsonb_build_array(jsonb_build_object(
        'attempt', %(attempts)s::int,
        'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'category', %(category)s::text,
        'error', %(error)s::text)),
    %(enqueued_at)s, %(partner)s,
    -- a replayed job that fails again links to the letter it was replayed from
    (SELECT max(id) FROM core.dead_letters
     WHERE job_id = %(job_id)s AND consumer = %(consumer)s AND status = 'replayed'))
ON CONFLICT DO NOTHING
RETURNING id

-- name: get_dead_letter
SELECT id, queue, consumer, job_id, correlation_id, payload, payload_size, payload_truncated,
       attempts, error_category, error_code, last_error, history, status, enqueued_at,
       failed_at, partner, previous_id, reviewed_at, reviewed_by, review_reason
FROM core.dead_letters WHERE id = %(id)s

-- name: queue_depth
SELECT queue, state, count(*) AS jobs FROM core.jobs GROUP BY queue, state ORDER BY queue, state

-- name: notify_queues
SELECT pg_notify('jobfence_jobs', q) FROM unnest(%(queues)s::text[]) AS q

-- name: batch_fence_and_ack
-- Group commit: ack a batch of claimed jobs and fence them, in one statement at the start of
-- one transaction. Keys are locked in (consumer, job_id) order so that concurrent batches
-- cannot deadlock on each other's fences. A job_id twice in the batch is fenced once.
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(consumers)s::text[],
                         %(job_ids)s::text[]) AS i(id, token, consumer, job_id)
), acked AS (
    DELETE FROM core.jobs AS j USING input AS i
    WHERE j.id = i.id AND j.lease_token = i.token
    RETURNING j.id
), fenced AS (
    INSERT INTO core.processed_jobs (consumer, job_id, expires_at)
    SELECT DISTINCT i.consumer, i.job_id, now() + make_interval(secs => %(ttl)s)
    FROM input AS i JOIN acked AS a ON a.id = i.id
    ORDER BY i.consumer, i.job_id
    ON CONFLICT DO NOTHING
    RETURNING consumer, job_id
)
SELECT i.id, a.id IS NOT NULL AS acked, f.job_id IS NOT NULL AS fenced
FROM input AS i
LEFT JOIN acked AS a ON a.id = i.id
LEFT JOIN fenced AS f ON f.consumer = i.consumer AND f.job_id = i.job_id

-- name: batch_ack
-- batch_fence_and_ack without the fence (benchmarks measure the fence's cost with it)
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS i(id, token)
), acked AS (
    DELETE FROM core.jobs AS j USING input AS i
    WHERE j.id = i.id AND j.lease_token = i.token
    RETURNING j.id
)
SELECT i.id, a.id IS NOT NULL AS acked, a.id IS NOT NULL AS fenced
FROM input AS i LEFT JOIN acked AS a ON a.id = i.id

-- name: unfence
-- A job of a batch failed: its savepoint rolled back its work, this removes its fence row.
DELETE FROM core.processed_jobs WHERE consumer = %(consumer)s AND job_id = %(job_id)s

-- name: requeue
-- A job of a batch failed and will be retried: its queue row (deleted by the batch's ack) is
-- written again, scheduled, with this attempt in its history.
INSERT INTO core.jobs (queue, job_id, correlation_id, payload, attempts, run_at, enqueued_at,
                       history)
VALUES (%(queue)s, %(job_id)s, %(correlation_id)s, %(payload)s, %(attempts)s,
        now() + make_interval(secs => %(delay)s), coalesce(%(enqueued_at)s, now()),
        %(history)s::jsonb || jsonb_build_array(jsonb_build_object(
            'attempt', %(attempts)s::int,
            'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'category', %(category)s::text,
            'error', %(error)s::text,
            'retry_at', to_char((now() + make_interval(secs => %(delay)s)) AT TIME ZONE 'UTC',
                                'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))))

-- name: copy_jobs
-- Bulk enqueue (no delays): binary COPY; run_at and enqueued_at take their defaults.
COPY core.jobs (queue, job_id, correlation_id, payload) FROM STDIN (FORMAT BINARY)

-- name: lend_begin
-- Names the transaction jobfence lends a handler (SPEC H5): core.fence_commit() checks it,
-- and the fence's deferred guard trigger fires only for fences written under this name.
SELECT core.fence_begin(%(jobfence_tx)s)

-- name: lend_commit
SELECT core.fence_commit(%(jobfence_tx)s)

-- name: lend_commit_and_commit
SELECT core.fence_commit(%(jobfence_tx)s); COMMIT

-- name: dead_letter_pending_id
-- The letter a repeated dead-lettering of the same delivery met (insert_dead_letter did nothing)
SELECT id FROM core.dead_letters
WHERE consumer = %(consumer)s AND job_id = %(job_id)s AND status = 'pending_review'
