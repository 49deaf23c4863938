-- The database queue: enqueue, claim, leases, retries, acks (jobfence.transports.database).

-- name: enqueue
INSERT INTO core.jobs (queue, job_id, correlation_id, payload, run_at, partner, trace_context,
                       priority, flow_key)
VALUES (%(queue)s, %(job_id)s, %(correlation_id)s, %(payload)s,
        now() + make_interval(secs => %(delay)s), %(partner)s, %(trace_context)s, %(priority)s,
        %(flow_key)s)

-- name: claim
-- Highest priority first, then oldest (run_at, id). One ordered index range per queue (an ANY(...) over the queues would read every available
-- row and sort them), the oldest first across queues; paused queues are skipped. Each queue's
-- range locks at most per_queue rows (jobfence.transports.database.per_queue_limit): every
-- row a range takes is locked before the outer LIMIT keeps the oldest, so over 100 queues a
-- range of the whole limit each would lock 100 times what the claim returns.
WITH candidates AS (
    SELECT c.id, c.priority, c.run_at
    FROM (SELECT u.name FROM unnest(%(queues)s::text[]) AS u(name)
          WHERE NOT EXISTS (SELECT 1 FROM core.queue_pauses AS p WHERE p.queue = u.name)) AS q
    CROSS JOIN LATERAL (
        -- jobs_priority_idx (queue, priority DESC, run_at, id); run_at <= now() is checked on
        -- the index entries (a job scheduled later is stepped over without reading its row)
        SELECT id, priority, run_at FROM core.jobs
        WHERE state = 'available' AND queue = q.name AND run_at <= now()
        ORDER BY priority DESC, run_at, id
        LIMIT %(per_queue)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority DESC, c.run_at, c.id
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
          j.enqueued_at, j.lease_token, j.history, j.trace_context, j.priority

-- name: claim_by_age
-- The claim by age alone, priorities aside (jobs_available_idx): a worker's every
-- jobfence.transports.database.AGE_ROUND_EVERY-th claim round, so that a low priority is
-- never starved (docs/flow-control.md "Priorities"). Otherwise as claim.
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
          j.enqueued_at, j.lease_token, j.history, j.trace_context, j.priority

-- name: flow_claim
-- The claim of one queue with a Limit (jobfence.runtime.flow), under the queue's flow lock
-- (flow_lock, taken first in the same transaction, then reap_expired for the queue): due jobs of keys that are
-- not held and have room, at most room per key (concurrency: running jobs; rate: starts in
-- the window of `per` that ends now, in core.flow_starts), the oldest first. Saturated keys are filtered
-- out before the LIMIT of the scan, so their jobs never stand in front of other keys'. The
-- caller records the starts at claimed_at, the time the window was counted
-- (flow_record_starts), in the same transaction.
WITH clock AS (SELECT clock_timestamp() AS now),
busy AS (
    SELECT j.flow_key AS key, count(*) AS n
    FROM core.jobs AS j
    WHERE j.queue = %(queue)s AND j.state = 'running' AND j.flow_key IS NOT NULL
    GROUP BY j.flow_key
),
recent AS (
    SELECT f.key, count(*) AS n
    FROM core.flow_starts AS f, clock AS c
    WHERE %(rate)s::int IS NOT NULL AND f.queue = %(queue)s
      AND f.started_at > c.now - make_interval(secs => %(per)s::float8)
    GROUP BY f.key
),
blocked AS (
    SELECT key FROM busy WHERE n >= %(concurrency)s::int
    UNION SELECT key FROM recent WHERE n >= %(rate)s::int
    UNION SELECT h.key FROM core.flow_holds AS h, clock AS c
          WHERE h.queue = %(queue)s AND (h.until IS NULL OR h.until > c.now)
),
candidates AS (
    SELECT j.id, j.flow_key, j.run_at FROM core.jobs AS j
    WHERE j.state = 'available' AND j.queue = %(queue)s AND j.run_at <= now()
      AND j.flow_key IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM blocked AS b WHERE b.key = j.flow_key)
      AND NOT EXISTS (SELECT 1 FROM core.queue_pauses AS p WHERE p.queue = %(queue)s)
    ORDER BY j.run_at, j.id
    LIMIT %(scan)s
),
picked AS (
    SELECT r.id FROM (
        SELECT c.id, c.flow_key, c.run_at,
               row_number() OVER (PARTITION BY c.flow_key ORDER BY c.run_at, c.id) AS rank
        FROM candidates AS c
    ) AS r
    LEFT JOIN busy AS b ON b.key = r.flow_key
    LEFT JOIN recent AS s ON s.key = r.flow_key
    WHERE r.rank <= coalesce(%(concurrency)s::int - coalesce(b.n, 0), 1000000000)
      AND r.rank <= coalesce(%(rate)s::int - coalesce(s.n, 0), 1000000000)
    ORDER BY r.run_at, r.id
    LIMIT %(limit)s
)
UPDATE core.jobs AS j SET
    state = 'running',
    attempts = j.attempts + 1,
    lease_token = gen_random_uuid(),
    lease_expires_at = now() + make_interval(secs => %(lease)s),
    worker_id = %(worker_id)s
WHERE j.id = ANY(ARRAY(SELECT p.id FROM picked AS p)) AND j.state = 'available'
RETURNING j.id, j.queue, j.job_id, j.correlation_id, j.payload, j.attempts,
          j.enqueued_at, j.lease_token, j.history, j.trace_context, j.flow_key,
          j.priority, (SELECT c.now FROM clock AS c) AS claimed_at

-- name: flow_next_run
-- When a limited queue can next give a job, in seconds from now (NULL: no keyed job waits;
-- infinity: only paused keys wait): per key with available jobs, the latest of its first
-- job's run_at, its back-off's end, the moment its oldest start leaves the rate's window
-- (when the window is full) and its first live lease's end (when its slots are all taken;
-- a job working past its lease holds its row locked and renews nothing: no end is known,
-- and a job's end wakes its own worker, the others poll).
WITH clock AS (SELECT clock_timestamp() AS now),
waiting AS (
    SELECT j.flow_key AS key, min(j.run_at) AS first_run
    FROM core.jobs AS j
    WHERE j.queue = %(queue)s AND j.state = 'available' AND j.flow_key IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM core.queue_pauses AS p WHERE p.queue = %(queue)s)
    GROUP BY j.flow_key
),
busy AS (
    SELECT j.flow_key AS key, count(*) AS n,
           coalesce(min(j.lease_expires_at) FILTER (WHERE j.lease_expires_at > c.now),
                    'infinity') AS first_end
    FROM core.jobs AS j, clock AS c
    WHERE j.queue = %(queue)s AND j.state = 'running' AND j.flow_key IS NOT NULL
    GROUP BY j.flow_key
),
recent AS (
    SELECT f.key, count(*) AS n, min(f.started_at) AS oldest
    FROM core.flow_starts AS f, clock AS c
    WHERE %(rate)s::int IS NOT NULL AND f.queue = %(queue)s
      AND f.started_at > c.now - make_interval(secs => %(per)s::float8)
    GROUP BY f.key
),
held AS (
    SELECT h.key, max(coalesce(h.until, 'infinity')) AS until
    FROM core.flow_holds AS h
    WHERE h.queue = %(queue)s
    GROUP BY h.key
)
SELECT CASE WHEN min(t.at) = 'infinity' THEN 'infinity'::float8
            ELSE extract(epoch FROM min(t.at) - c.now)::float8 END AS wait
FROM clock AS c, (
    SELECT greatest(
        w.first_run,
        h.until,
        CASE WHEN s.n >= %(rate)s::int
             THEN s.oldest + make_interval(secs => %(per)s::float8) END,
        CASE WHEN b.n >= %(concurrency)s::int THEN b.first_end END
    ) AS at
    FROM waiting AS w
    LEFT JOIN held AS h ON h.key = w.key
    LEFT JOIN recent AS s ON s.key = w.key
    LEFT JOIN busy AS b ON b.key = w.key
) AS t
GROUP BY c.now

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
-- Running jobs whose lease ran out and that no work transaction holds (their worker was
-- killed or lost) go back to available, the lost delivery in their history: at most `limit`,
-- of every queue (maintenance) or of `queue` alone (first in a limited claim's transaction,
-- so a dead worker's slots are free the moment its lease ends; a job working past its lease
-- holds its row locked: skipped, still counted).
WITH expired AS (
    SELECT id FROM core.jobs
    WHERE state = 'running' AND lease_expires_at < now()
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
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
RETURNING j.id, j.queue

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

-- name: defer
-- A job that may not run yet (its key backs off): available again at now + delay with its
-- attempt refunded; with a note, its history records the deferral (category DEFERRED,
-- attempt: the attempts consumed so far).
UPDATE core.jobs SET
    state = 'available',
    run_at = now() + make_interval(secs => %(delay)s),
    attempts = greatest(attempts - 1, 0),
    lease_token = NULL,
    lease_expires_at = NULL,
    worker_id = NULL,
    history = CASE WHEN %(note)s::text IS NULL THEN history
              ELSE history || jsonb_build_array(jsonb_build_object(
        'attempt', greatest(attempts - 1, 0),
        'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'category', 'DEFERRED',
        'error', %(note)s::text,
        'retry_at', to_char((now() + make_interval(secs => %(delay)s)) AT TIME ZONE 'UTC',
                            'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))) END
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
                       history, partner, trace_context, priority, flow_key)
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
        %(partner)s, %(trace_context)s, %(priority)s, %(flow_key)s)

-- name: copy_jobs
-- Bulk enqueue (no delays): binary COPY; run_at and enqueued_at take their defaults.
COPY core.jobs (queue, job_id, correlation_id, payload, partner, trace_context, priority,
                flow_key)
FROM STDIN (FORMAT BINARY)
