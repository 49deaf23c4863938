-- The call ledger (SPEC E1–E4; jobfence.calls). Each statement runs in a short transaction of
-- its own (autocommit), never in the job's: the intent is durable before the request leaves.

-- ---- the runtime: a handler's recorded step (jobfence.calls.ledger) ------------------------

-- name: calls_intent
-- The intent of a first call, committed before the request leaves (the happy path's first
-- round trip). Nothing comes back when the step is already recorded: read it (calls_get).
INSERT INTO core.calls (consumer, queue, job_id, step, idem_key, partner)
VALUES (%(consumer)s, %(queue)s, %(job_id)s, %(step)s, %(key)s, %(partner)s)
ON CONFLICT (consumer, job_id, step) DO NOTHING
RETURNING id, idem_key, state, attempts, outcome, reference, last_error

-- name: calls_get
SELECT id, idem_key, state, attempts, outcome, reference, last_error
FROM core.calls
WHERE consumer = %(consumer)s AND job_id = %(job_id)s AND step = %(step)s

-- name: calls_resend
-- The intent of another call with the same key, from the state the caller read (a row an
-- operator settled meanwhile is not taken over: nothing comes back, read it again).
UPDATE core.calls
SET state = 'pending', attempts = attempts + 1, updated_at = now()
WHERE id = %(id)s AND state = %(from_state)s
RETURNING id, idem_key, state, attempts, outcome, reference, last_error

-- name: calls_record
-- A definitive outcome (succeeded: the answer's summary; failed: rejected or never sent),
-- written whatever the row says: the answer is what happened downstream.
UPDATE core.calls
SET state = %(state)s, outcome = %(outcome)s::jsonb, reference = %(reference)s,
    last_error = %(error)s, updated_at = now()
WHERE id = %(id)s

-- name: calls_doubt
-- The request may have left and no answer came: in doubt (unless settled meanwhile).
UPDATE core.calls
SET state = 'in_doubt', last_error = %(error)s, updated_at = now()
WHERE id = %(id)s AND state = 'pending'

-- name: calls_note
-- Why an in-doubt call is still in doubt (its reconcile failed).
UPDATE core.calls
SET last_error = %(error)s, updated_at = now()
WHERE id = %(id)s AND state = 'in_doubt'

-- name: calls_open_gauges
-- The calls whose outcome nobody knows yet, by state, with the oldest one's age (seconds).
SELECT state, count(*) AS calls,
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest
FROM core.calls
WHERE state IN ('pending', 'in_doubt')
GROUP BY state

-- ---- operators: list, show, settle (jobfence.calls.review) -----------------------------------

-- Operators (jobfence.calls.review): list, show and settle recorded calls. Lists are keyset
-- pages on the primary key (id > after), oldest first; ages come from the database's clock.

-- name: calls_list
SELECT id, consumer, queue, job_id, step, idem_key, partner, state, attempts, created_at,
       updated_at, extract(epoch FROM now() - created_at)::float8 AS age_seconds, reference,
       last_error, settled_by, settled_reason, settled_at
FROM core.calls
WHERE (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(consumer)s::text IS NULL OR consumer = %(consumer)s)
  AND (%(step)s::text IS NULL OR step = %(step)s)
  AND (%(job_id)s::text IS NULL OR job_id = %(job_id)s)
  AND (%(older_than)s::float8 IS NULL
       OR created_at <= now() - make_interval(secs => %(older_than)s::float8))
  AND (%(partner)s::text IS NULL OR partner = %(partner)s)
  AND (%(after)s::bigint IS NULL OR id > %(after)s)
ORDER BY id
LIMIT %(limit)s

-- name: calls_show
SELECT id, consumer, queue, job_id, step, idem_key, partner, state, attempts, created_at,
       updated_at, extract(epoch FROM now() - created_at)::float8 AS age_seconds, reference,
       last_error, settled_by, settled_reason, settled_at, outcome
FROM core.calls WHERE id = %(id)s

-- name: calls_lock
SELECT id, consumer, queue, job_id, step, idem_key, partner, state, settled_by, settled_at
FROM core.calls WHERE id = %(id)s
FOR UPDATE

-- name: calls_settle
-- An operator's decision on an in-doubt call (final: only in_doubt is settled).
UPDATE core.calls
SET state = %(state)s, reference = %(reference)s, outcome = %(outcome)s::jsonb,
    settled_by = %(actor)s, settled_reason = %(reason)s, settled_at = now(), updated_at = now()
WHERE id = %(id)s AND state = 'in_doubt'
RETURNING id

-- name: calls_parked_letter
-- The job's dead letter pending review (at most one per consumer and job_id).
SELECT id FROM core.dead_letters
WHERE consumer = %(consumer)s AND job_id = %(job_id)s AND status = 'pending_review'
