-- Job control (jobfence.review.jobctl): list, show, cancel and retry-now jobs of the database
-- queue; pause and resume queues. See the PostgreSQL file for the states and the indexes.

-- name: jobs_list
SELECT id, queue, job_id, correlation_id, state, attempts, run_at, enqueued_at, worker_id,
       lease_expires_at, partner, priority, length(payload) AS payload_size,
       json_extract(history, '$[#-1].error') AS last_error,
       json_extract(history, '$[#-1].category') AS last_category,
       history <> '[]' AS failed
FROM core_jobs
WHERE (:queue IS NULL OR queue = :queue)
  AND (:state IS NULL
       OR (:state = 'running' AND state = 'running')
       OR (:state = 'waiting' AND state = 'available' AND history = '[]')
       OR (:state = 'retrying' AND state = 'available' AND history <> '[]'))
  AND (:job_id IS NULL OR job_id = :job_id)
  AND (:correlation_id IS NULL OR correlation_id = :correlation_id)
  AND (:error IS NULL
       OR (history <> '[]' AND json_extract(history, '$[#-1].error') LIKE :error ESCAPE '\'))
  AND (:since IS NULL OR enqueued_at >= :since)
  AND (:until IS NULL OR enqueued_at < :until)
  AND (:partner IS NULL OR partner = :partner)
  AND (:after IS NULL OR id > :after)
ORDER BY id
LIMIT :limit

-- name: job_get
SELECT id, queue, job_id, correlation_id, state, attempts, run_at, enqueued_at, worker_id,
       lease_expires_at, partner, priority, length(payload) AS payload_size,
       json_extract(history, '$[#-1].error') AS last_error,
       json_extract(history, '$[#-1].category') AS last_category,
       history <> '[]' AS failed, payload, history, run_at > {NOW} AS scheduled,
       trace_context
FROM core_jobs WHERE id = :id

-- name: job_lock
-- SQLite has one writer: the action's transaction holds the write lock.
SELECT id, queue, job_id, correlation_id, state, attempts, run_at, enqueued_at, worker_id,
       lease_expires_at, partner, priority, length(payload) AS payload_size,
       json_extract(history, '$[#-1].error') AS last_error,
       json_extract(history, '$[#-1].category') AS last_category,
       history <> '[]' AS failed, payload, history, run_at > {NOW} AS scheduled,
       trace_context
FROM core_jobs WHERE id = :id

-- name: job_delete
DELETE FROM core_jobs WHERE id = :id AND state = 'available' RETURNING id

-- name: job_run_now
UPDATE core_jobs SET run_at = {NOW}
WHERE id = :id AND state = 'available' AND run_at > {NOW}
RETURNING run_at

-- name: jobs_queue_counts
SELECT queue,
       sum(state = 'available' AND history = '[]') AS waiting,
       sum(state = 'running') AS running,
       sum(state = 'available' AND history <> '[]') AS retrying
FROM core_jobs
WHERE (:partner IS NULL OR partner = :partner)
GROUP BY queue
ORDER BY queue

-- name: dl_insert_cancelled
-- A cancelled job, kept as a letter decided at once (discarded, with who and why).
INSERT INTO core_dead_letters (
    queue, consumer, job_id, correlation_id, payload, payload_size, payload_truncated,
    attempts, error_category, error_code, last_error, history, enqueued_at, partner, status,
    failed_at, reviewed_at, reviewed_by, review_reason, trace_context)
VALUES (
    :queue, :consumer, :job_id, :correlation_id, :payload, :payload_size, 0, :attempts,
    'NON_RETRYABLE_ERROR', 'CANCELLED', :error, json(:history), :enqueued_at, :partner,
    'discarded', {NOW}, {NOW}, :actor, :reason, :trace_context)
RETURNING id

-- name: queue_pauses
SELECT queue, paused_at, paused_by, reason FROM core_queue_pauses ORDER BY queue

-- name: queue_pause
INSERT INTO core_queue_pauses (queue, paused_at, paused_by, reason)
VALUES (:queue, {NOW}, :actor, :reason)
ON CONFLICT (queue) DO NOTHING
RETURNING queue, paused_at, paused_by, reason

-- name: queue_resume
DELETE FROM core_queue_pauses WHERE queue = :queue
RETURNING queue, paused_at, paused_by, reason

-- name: paused_among
SELECT queue, paused_by, reason FROM core_queue_pauses
WHERE queue IN (SELECT value FROM json_each(:queues))
