-- The database queue: enqueue, claim, leases, retries, acks (jobfence.transports.database).

-- name: enqueue
INSERT INTO core_jobs (queue, job_id, correlation_id, payload, run_at, enqueued_at, partner,
                       trace_context, priority, flow_key)
VALUES (:queue, :job_id, :correlation_id, :payload, {NOW} + :delay, {NOW}, :partner,
        :trace_context, :priority, :flow_key)

-- name: claim
-- Highest priority first, then oldest. Each served queue is one range of
-- core_jobs_priority_idx read in its order, so the sort for the LIMIT stops after :limit
-- entries of each queue; left to itself the planner would take the due range of
-- core_jobs_available_idx (run_at is unary-plussed so that it does not) and sort every due
-- job of the queue.
UPDATE core_jobs SET
    state = 'running',
    attempts = attempts + 1,
    lease_token = lower(hex(randomblob(16))),
    lease_expires_at = {NOW} + :lease,
    worker_id = :worker_id
WHERE id IN (
    SELECT id FROM core_jobs INDEXED BY core_jobs_priority_idx
    WHERE state = 'available' AND queue IN (SELECT value FROM json_each(:queues))
      AND queue NOT IN (SELECT queue FROM core_queue_pauses)
      AND +run_at <= {NOW}
    ORDER BY priority DESC, run_at, id
    LIMIT :limit
)
RETURNING id, queue, job_id, correlation_id, payload, attempts, enqueued_at, lease_token,
          history, trace_context, priority

-- name: claim_by_age
-- By age alone, priorities aside: a worker's every AGE_ROUND_EVERY-th claim round
-- (docs/flow-control.md "Priorities"). Otherwise as claim.
UPDATE core_jobs SET
    state = 'running',
    attempts = attempts + 1,
    lease_token = lower(hex(randomblob(16))),
    lease_expires_at = {NOW} + :lease,
    worker_id = :worker_id
WHERE id IN (
    SELECT id FROM core_jobs
    WHERE state = 'available' AND queue IN (SELECT value FROM json_each(:queues))
      AND queue NOT IN (SELECT queue FROM core_queue_pauses)
      AND run_at <= {NOW}
    ORDER BY run_at, id
    LIMIT :limit
)
RETURNING id, queue, job_id, correlation_id, payload, attempts, enqueued_at, lease_token,
          history, trace_context, priority

-- name: flow_claim
-- The claim of one queue with a Limit (jobfence.runtime.flow); SQLite's one writer makes it,
-- reap_expired before it and the starts the caller records next (flow_record_starts) one step.
-- Due jobs of keys that are not held and have room, at most room per key (concurrency:
-- running jobs; rate: starts in the window of `per` that ends now), the oldest first;
-- saturated keys are filtered out before the LIMIT of the scan.
WITH busy AS (
    SELECT flow_key AS key, count(*) AS n FROM core_jobs
    WHERE queue = :queue AND state = 'running' AND flow_key IS NOT NULL
    GROUP BY flow_key
),
recent AS (
    SELECT key, count(*) AS n FROM core_flow_starts
    WHERE :rate IS NOT NULL AND queue = :queue AND started_at > {NOW} - :per
    GROUP BY key
),
blocked AS (
    SELECT key FROM busy WHERE n >= :concurrency
    UNION SELECT key FROM recent WHERE n >= :rate
    UNION SELECT key FROM core_flow_holds
          WHERE queue = :queue AND (until IS NULL OR until > {NOW})
),
candidates AS (
    SELECT j.id, j.flow_key, j.run_at FROM core_jobs AS j
    WHERE j.state = 'available' AND j.queue = :queue AND j.run_at <= {NOW}
      AND j.flow_key IS NOT NULL
      AND j.flow_key NOT IN (SELECT key FROM blocked)
      AND :queue NOT IN (SELECT queue FROM core_queue_pauses)
    ORDER BY j.run_at, j.id
    LIMIT :scan
),
picked AS (
    SELECT r.id FROM (
        SELECT c.id, c.flow_key, c.run_at,
               row_number() OVER (PARTITION BY c.flow_key ORDER BY c.run_at, c.id) AS rank
        FROM candidates AS c
    ) AS r
    LEFT JOIN busy AS b ON b.key = r.flow_key
    LEFT JOIN recent AS s ON s.key = r.flow_key
    WHERE r.rank <= coalesce(:concurrency - coalesce(b.n, 0), 1000000000)
      AND r.rank <= coalesce(:rate - coalesce(s.n, 0), 1000000000)
    ORDER BY r.run_at, r.id
    LIMIT :limit
)
UPDATE core_jobs SET
    state = 'running',
    attempts = attempts + 1,
    lease_token = lower(hex(randomblob(16))),
    lease_expires_at = {NOW} + :lease,
    worker_id = :worker_id
WHERE id IN (SELECT id FROM picked) AND state = 'available'
RETURNING id, queue, job_id, correlation_id, payload, attempts, enqueued_at, lease_token,
          history, trace_context, flow_key, priority, {NOW} AS claimed_at

-- name: flow_next_run
-- When a limited queue can next give a job, in seconds from now (NULL: no keyed job waits;
-- 1e18: only paused keys wait): per key with available jobs, the latest of its first job's
-- run_at, its back-off's end, the moment its oldest start leaves the rate's window (when
-- the window is full) and its first lease's end (when its slots are all taken).
WITH waiting AS (
    SELECT flow_key AS key, min(run_at) AS first_run FROM core_jobs
    WHERE queue = :queue AND state = 'available' AND flow_key IS NOT NULL
      AND :queue NOT IN (SELECT queue FROM core_queue_pauses)
    GROUP BY flow_key
),
busy AS (
    SELECT flow_key AS key, count(*) AS n,
           coalesce(min(CASE WHEN lease_expires_at > {NOW} THEN lease_expires_at END), 1e18)
               AS first_end
    FROM core_jobs
    WHERE queue = :queue AND state = 'running' AND flow_key IS NOT NULL
    GROUP BY flow_key
),
recent AS (
    SELECT key, count(*) AS n, min(started_at) AS oldest FROM core_flow_starts
    WHERE :rate IS NOT NULL AND queue = :queue AND started_at > {NOW} - :per
    GROUP BY key
),
held AS (
    SELECT key, max(coalesce(until, 1e18)) AS until FROM core_flow_holds
    WHERE queue = :queue GROUP BY key
)
SELECT min(max(
    w.first_run,
    coalesce(h.until, 0),
    CASE WHEN s.n >= :rate THEN s.oldest + :per ELSE 0 END,
    CASE WHEN b.n >= :concurrency THEN b.first_end ELSE 0 END
)) - {NOW} AS wait
FROM waiting AS w
LEFT JOIN held AS h ON h.key = w.key
LEFT JOIN recent AS s ON s.key = w.key
LEFT JOIN busy AS b ON b.key = w.key

-- name: next_run_at
SELECT min(run_at) - {NOW} AS wait
FROM core_jobs WHERE state = 'available' AND queue IN (SELECT value FROM json_each(:queues))
  AND queue NOT IN (SELECT queue FROM core_queue_pauses)

-- name: reap_expired
-- Running jobs whose lease ran out (their worker was killed or lost; no job transaction is
-- open while this one writes) go back to available: at most `limit`, of every queue
-- (maintenance) or of `queue` alone (first in a limited claim's transaction).
UPDATE core_jobs SET
    state = 'available',
    run_at = {NOW},
    lease_token = NULL,
    lease_expires_at = NULL,
    history = json_insert(history, '$[#]', json_object(
        'attempt', attempts,
        'at', {NOW_ISO},
        'category', 'TECHNICAL_ERROR',
        'error', 'lease expired: the worker ' || coalesce(worker_id, '?')
                 || ' stopped renewing it (killed or lost)')),
    worker_id = NULL
WHERE id IN (
    SELECT id FROM core_jobs
    WHERE state = 'running' AND lease_expires_at < {NOW}
      AND (:queue IS NULL OR queue = :queue)
    ORDER BY lease_expires_at
    LIMIT :limit
)
RETURNING id, queue

-- name: extend_leases
UPDATE core_jobs SET lease_expires_at = {NOW} + :lease
WHERE state = 'running'
  AND id IN (SELECT value FROM json_each(:ids))
  AND lease_token IN (SELECT value FROM json_each(:tokens))

-- name: ack
DELETE FROM core_jobs WHERE id = :id AND lease_token = :token RETURNING id

-- name: retry
UPDATE core_jobs SET
    state = 'available',
    run_at = {NOW} + :delay,
    lease_token = NULL,
    lease_expires_at = NULL,
    worker_id = NULL,
    history = json_insert(history, '$[#]', json_patch(json_object(
        'attempt', attempts,
        'at', {NOW_ISO},
        'category', :category,
        'error', :error,
        'retry_at', strftime('%Y-%m-%dT%H:%M:%fZ', {NOW} + :delay, 'unixepoch')),
        json_object('trace', :trace)))
WHERE id = :id AND lease_token = :token

-- name: defer
-- A job that may not run yet (its key backs off): available again at now + delay with its
-- attempt refunded; with a note, its history records the deferral (category DEFERRED,
-- attempt: the attempts consumed so far).
UPDATE core_jobs SET
    state = 'available',
    run_at = {NOW} + :delay,
    attempts = max(attempts - 1, 0),
    lease_token = NULL,
    lease_expires_at = NULL,
    worker_id = NULL,
    history = CASE WHEN :note IS NULL THEN history
              ELSE json_insert(history, '$[#]', json_object(
        'attempt', max(attempts - 1, 0),
        'at', {NOW_ISO},
        'category', 'DEFERRED',
        'error', :note,
        'retry_at', strftime('%Y-%m-%dT%H:%M:%fZ', {NOW} + :delay, 'unixepoch'))) END
WHERE id = :id AND lease_token = :token

-- name: release
UPDATE core_jobs SET
    state = 'available',
    run_at = {NOW},
    attempts = max(attempts - :refund, 0),
    lease_token = NULL,
    lease_expires_at = NULL,
    worker_id = NULL
WHERE id = :id AND lease_token = :token

-- name: queue_depth
SELECT queue, state, count(*) AS jobs FROM core_jobs GROUP BY queue, state ORDER BY queue, state

-- name: queue_backlog
-- per queue: jobs waiting (due or not) and running, and the age of the oldest waiting job
SELECT queue,
       sum(state = 'available') AS waiting,
       sum(state = 'running') AS running,
       {NOW} - min(CASE WHEN state = 'available' THEN enqueued_at END) AS oldest_waiting_s
FROM core_jobs GROUP BY queue ORDER BY queue
