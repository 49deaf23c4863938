-- The database queue: enqueue, claim, leases, retries, acks (jobfence.transports.database).

-- name: enqueue
INSERT INTO core_jobs (queue, job_id, correlation_id, payload, run_at, enqueued_at, partner,
                       trace_context)
VALUES (:queue, :job_id, :correlation_id, :payload, {NOW} + :delay, {NOW}, :partner,
        :trace_context)

-- name: claim
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
          history, trace_context

-- name: next_run_at
SELECT min(run_at) - {NOW} AS wait
FROM core_jobs WHERE state = 'available' AND queue IN (SELECT value FROM json_each(:queues))
  AND queue NOT IN (SELECT queue FROM core_queue_pauses)

-- name: reap_expired
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
    ORDER BY lease_expires_at
    LIMIT :limit
)
RETURNING queue

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

-- name: release
UPDATE core_jobs SET
    state = 'available',
    run_at = {NOW},
    attempts = max(attempts - :refund, 0),
    lease_token = NULL,
    lease_expires_at = NULL,
    worker_id = NULL
WHERE id = :id AND lease_token = :token

-- name: defer
-- flow control said "not now": back to the queue, due after the delay, the attempt refunded,
-- the note (a back-off's record) appended to the history when there is one
UPDATE core_jobs SET
    state = 'available',
    run_at = {NOW} + :delay,
    attempts = max(attempts - 1, 0),
    history = CASE WHEN :note IS NULL THEN history
                   ELSE json_insert(history, '$[#]', json(:note)) END,
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
