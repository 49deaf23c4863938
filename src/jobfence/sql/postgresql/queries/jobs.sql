-- The database queue: enqueue, claim, leases, retries, acks (jobfence.transports.database).

-- name: enqueue
INSERT INTO core.jobs (queue, job_id, correlation_id, payload, run_at, partner, trace_context)
VALUES (%(queue)s, %(job_id)s, %(correlation_id)s, %(payload)s,
        now() + make_interval(secs => %(delay)s), %(partner)s, %(trace_context)s)

-- name: claim
-- One ordered index range per queue (an ANY(...) over the queues would read every available
-- row and sort them), the oldest first across queues; paused queues are skipped. Each queue's
-- range locks at most per_queue rows (jobfence.transports.database.per_queue_limit): every
-- row a range takes is locked before the outer LIMIT keeps the oldest, so over 100 queues a
-- range of the whole limit each would lock 100 times what the claim returns.
WITH candidates AS (
    SELECT c.id, c.run_at
    FROM (SELECT u.name FROM unnest(%(queues)s::text[]) AS u(name)
          WHERE NOT EXISTS (SELECT 1 FROM core.queue_pauses AS p WHERE p.queue = u.name)) AS q
    CROSS JOIN LATERAL (
        SELECT id, run_at FROM core.jobs
        WHERE state = 'available' AND queue = q.name AND run_at <= now()
        ORDER BY run_at, id
        LIMIT %(per_queue)s
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
-- by primary key (= ANY of an array): a join with the candidates is planned as a hash over a
-- sequential scan of core.jobs below ~60 000 rows, every claim reading the whole queue
WHERE j.id = ANY(ARRAY(SELECT c.id FROM candidates AS c))
RETURNING j.id, j.queue, j.job_id, j.correlation_id, j.payload, j.attempts,
          j.enqueued_at, j.lease_token, j.history, j.trace_context

-- name: next_run_at
SELECT extract(epoch FROM (min(n.run_at) - now()))::float8 AS wait
FROM (SELECT u.name FROM unnest(%(queues)s::text[]) AS u(name)
      WHERE NOT EXISTS (SELECT 1 FROM core.queue_pauses AS p WHERE p.queue = u.name)) AS q
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
                            'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
        || jsonb_strip_nulls(jsonb_build_object('trace', %(trace)s::text)))
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

-- name: defer
-- flow control said "not now": back to the queue, due after the delay, the attempt refunded,
-- the note (a back-off's record) appended to the history when there is one
UPDATE core.jobs SET
    state = 'available',
    run_at = now() + make_interval(secs => %(delay)s),
    attempts = greatest(attempts - 1, 0),
    history = CASE WHEN %(note)s::jsonb IS NULL THEN history
                   ELSE history || jsonb_build_array(%(note)s::jsonb) END,
    lease_token = NULL,
    lease_expires_at = NULL,
    worker_id = NULL
WHERE id = %(id)s AND lease_token = %(token)s

-- name: queue_depth
SELECT queue, state, count(*) AS jobs FROM core.jobs GROUP BY queue, state ORDER BY queue, state

-- name: queue_backlog
-- per queue: jobs waiting (due or not) and running, and the age of the oldest waiting job
SELECT queue,
       count(*) FILTER (WHERE state = 'available') AS waiting,
       count(*) FILTER (WHERE state = 'running') AS running,
       EXTRACT(EPOCH FROM clock_timestamp() - min(enqueued_at) FILTER (WHERE state = 'available'))
           AS oldest_waiting_s
FROM core.jobs GROUP BY queue ORDER BY queue

-- name: notify_queues
SELECT pg_notify('jobfence_jobs', q) FROM unnest(%(queues)s::text[]) AS q

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

-- name: requeue
-- A job of a batch failed and will be retried: its queue row (deleted by the batch's ack) is
-- written again, scheduled, with this attempt in its history.
INSERT INTO core.jobs (queue, job_id, correlation_id, payload, attempts, run_at, enqueued_at,
                       history, partner, trace_context)
VALUES (%(queue)s, %(job_id)s, %(correlation_id)s, %(payload)s, %(attempts)s,
        now() + make_interval(secs => %(delay)s), coalesce(%(enqueued_at)s, now()),
        %(history)s::jsonb || jsonb_build_array(jsonb_build_object(
            'attempt', %(attempts)s::int,
            'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'category', %(category)s::text,
            'error', %(error)s::text,
            'retry_at', to_char((now() + make_interval(secs => %(delay)s)) AT TIME ZONE 'UTC',
                                'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
            || jsonb_strip_nulls(jsonb_build_object('trace', %(trace)s::text))),
        %(partner)s, %(trace_context)s)

-- name: copy_jobs
-- Bulk enqueue (no delays): binary COPY; run_at and enqueued_at take their defaults.
COPY core.jobs (queue, job_id, correlation_id, payload, partner, trace_context)
FROM STDIN (FORMAT BINARY)
