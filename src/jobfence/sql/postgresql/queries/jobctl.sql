-- Job control (jobfence.review.jobctl): list, show, cancel and retry-now jobs of the database
-- queue; pause and resume queues. A job is waiting (available, never failed), retrying
-- (available after a failed attempt: run_at is the next attempt) or running (leased).
-- Lists are keyset pages on the primary key (id > after), oldest first; every filter is an
-- index (jobs_job_id_idx, jobs_correlation_idx, jobs_partner_idx, jobs_available_idx,
-- jobs_lease_idx, jobs_retrying_idx) or a residual condition on that ordered scan.

-- name: jobs_list
SELECT id, queue, job_id, correlation_id, state, attempts, run_at, enqueued_at, worker_id,
       lease_expires_at, partner, priority, octet_length(payload) AS payload_size,
       history -> -1 ->> 'error' AS last_error, history -> -1 ->> 'category' AS last_category,
       history <> '[]'::jsonb AS failed
FROM core.jobs
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(state)s::text IS NULL
       OR (%(state)s = 'running' AND state = 'running')
       OR (%(state)s = 'waiting' AND state = 'available' AND history = '[]'::jsonb)
       OR (%(state)s = 'retrying' AND state = 'available' AND history <> '[]'::jsonb))
  AND (%(job_id)s::text IS NULL OR job_id = %(job_id)s)
  AND (%(correlation_id)s::text IS NULL OR correlation_id = %(correlation_id)s)
  AND (%(error)s::text IS NULL
       OR (history <> '[]'::jsonb AND history -> -1 ->> 'error' ILIKE %(error)s ESCAPE '\'))
  AND (%(since)s::timestamptz IS NULL OR enqueued_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR enqueued_at < %(until)s)
  AND (%(partner)s::text IS NULL OR partner = %(partner)s)
  AND (%(after)s::bigint IS NULL OR id > %(after)s)
ORDER BY id
LIMIT %(limit)s

-- name: job_get
SELECT id, queue, job_id, correlation_id, state, attempts, run_at, enqueued_at, worker_id,
       lease_expires_at, partner, priority, octet_length(payload) AS payload_size,
       history -> -1 ->> 'error' AS last_error, history -> -1 ->> 'category' AS last_category,
       history <> '[]'::jsonb AS failed, payload, history, run_at > now() AS scheduled,
       trace_context
FROM core.jobs WHERE id = %(id)s

-- name: job_lock
-- The job, locked for an operator's action (a worker's claim skips a locked row). A row
-- locked already is skipped, not waited for: a running job's attempt holds its row for as
-- long as the handler works (its transaction acks it first), and an operator's cancel must
-- answer at once ("running"), not wait for the handler.
SELECT id, queue, job_id, correlation_id, state, attempts, run_at, enqueued_at, worker_id,
       lease_expires_at, partner, priority, octet_length(payload) AS payload_size,
       history -> -1 ->> 'error' AS last_error, history -> -1 ->> 'category' AS last_category,
       history <> '[]'::jsonb AS failed, payload, history, run_at > now() AS scheduled,
       trace_context
FROM core.jobs WHERE id = %(id)s
FOR UPDATE SKIP LOCKED

-- name: job_delete
DELETE FROM core.jobs WHERE id = %(id)s AND state = 'available' RETURNING id

-- name: job_run_now
UPDATE core.jobs SET run_at = now()
WHERE id = %(id)s AND state = 'available' AND run_at > now()
RETURNING run_at

-- name: jobs_queue_counts
SELECT queue,
       count(*) FILTER (WHERE state = 'available' AND history = '[]'::jsonb) AS waiting,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE state = 'available' AND history <> '[]'::jsonb) AS retrying
FROM core.jobs
WHERE (%(partner)s::text IS NULL OR partner = %(partner)s)
GROUP BY queue
ORDER BY queue

-- name: dl_insert_cancelled
-- A cancelled job, kept as a letter decided at once (discarded, with who and why).
INSERT INTO core.dead_letters (
    queue, consumer, job_id, correlation_id, payload, payload_size, payload_truncated,
    attempts, error_category, error_code, last_error, history, enqueued_at, partner, status,
    reviewed_at, reviewed_by, review_reason, trace_context)
VALUES (
    %(queue)s, %(consumer)s, %(job_id)s, %(correlation_id)s, %(payload)s, %(payload_size)s,
    false, %(attempts)s, 'NON_RETRYABLE_ERROR', 'CANCELLED', %(error)s, %(history)s::jsonb,
    %(enqueued_at)s, %(partner)s, 'discarded', now(), %(actor)s, %(reason)s, %(trace_context)s)
RETURNING id

-- name: queue_pauses
SELECT queue, paused_at, paused_by, reason FROM core.queue_pauses ORDER BY queue

-- name: queue_pause
INSERT INTO core.queue_pauses (queue, paused_by, reason)
VALUES (%(queue)s, %(actor)s, %(reason)s)
ON CONFLICT (queue) DO NOTHING
RETURNING queue, paused_at, paused_by, reason

-- name: queue_resume
DELETE FROM core.queue_pauses WHERE queue = %(queue)s
RETURNING queue, paused_at, paused_by, reason

-- name: paused_among
SELECT queue, paused_by, reason FROM core.queue_pauses WHERE queue = ANY(%(queues)s)
