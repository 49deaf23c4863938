-- The call ledger (SPEC E1–E4; jobfence.calls). Each statement runs in a short transaction of
-- its own, never in the job's: on SQLite in the ledger's own file (``<store>-calls``), whose
-- write lock is not the one the job's transaction holds.

-- ---- the runtime: a handler's recorded step (jobfence.calls.ledger) ------------------------

-- name: calls_intent
-- The intent of a first call, committed before the request leaves (the happy path's first
-- round trip). Nothing comes back when the step is already recorded: read it (calls_get).
INSERT INTO core_calls (consumer, queue, job_id, step, idem_key, partner, created_at,
                        updated_at)
VALUES (:consumer, :queue, :job_id, :step, :key, :partner, {NOW}, {NOW})
ON CONFLICT (consumer, job_id, step) DO NOTHING
RETURNING id, idem_key, state, attempts, outcome, reference, last_error

-- name: calls_get
SELECT id, idem_key, state, attempts, outcome, reference, last_error
FROM core_calls
WHERE consumer = :consumer AND job_id = :job_id AND step = :step

-- name: calls_resend
-- The intent of another call with the same key, from the state the caller read (a row an
-- operator settled meanwhile is not taken over: nothing comes back, read it again).
UPDATE core_calls
SET state = 'pending', attempts = attempts + 1, updated_at = {NOW}
WHERE id = :id AND state = :from_state
RETURNING id, idem_key, state, attempts, outcome, reference, last_error

-- name: calls_record
-- A definitive outcome (succeeded: the answer's summary; failed: rejected or never sent),
-- written whatever the row says: the answer is what happened downstream.
UPDATE core_calls
SET state = :state, outcome = :outcome, reference = :reference, last_error = :error,
    updated_at = {NOW}
WHERE id = :id

-- name: calls_doubt
-- The request may have left and no answer came: in doubt (unless settled meanwhile).
UPDATE core_calls
SET state = 'in_doubt', last_error = :error, updated_at = {NOW}
WHERE id = :id AND state = 'pending'

-- name: calls_note
-- Why an in-doubt call is still in doubt (its reconcile failed).
UPDATE core_calls
SET last_error = :error, updated_at = {NOW}
WHERE id = :id AND state = 'in_doubt'

-- name: calls_open_gauges
-- The calls whose outcome nobody knows yet, by state, with the oldest one's age (seconds).
SELECT state, count(*) AS calls, coalesce({NOW} - min(created_at), 0.0) AS oldest
FROM core_calls
WHERE state IN ('pending', 'in_doubt')
GROUP BY state

-- ---- operators: list, show, settle (jobfence.calls.review) -----------------------------------

-- Operators (jobfence.calls.review): list, show and settle recorded calls. See the
-- PostgreSQL file.

-- name: calls_list
SELECT id, consumer, queue, job_id, step, idem_key, partner, state, attempts, created_at,
       updated_at, {NOW} - created_at AS age_seconds, reference, last_error, settled_by,
       settled_reason, settled_at
FROM core_calls
WHERE (:state IS NULL OR state = :state)
  AND (:queue IS NULL OR queue = :queue)
  AND (:consumer IS NULL OR consumer = :consumer)
  AND (:step IS NULL OR step = :step)
  AND (:job_id IS NULL OR job_id = :job_id)
  AND (:older_than IS NULL OR created_at <= {NOW} - :older_than)
  AND (:partner IS NULL OR partner = :partner)
  AND (:after IS NULL OR id > :after)
ORDER BY id
LIMIT :limit

-- name: calls_show
SELECT id, consumer, queue, job_id, step, idem_key, partner, state, attempts, created_at,
       updated_at, {NOW} - created_at AS age_seconds, reference, last_error, settled_by,
       settled_reason, settled_at, outcome
FROM core_calls WHERE id = :id

-- name: calls_lock
-- SQLite has one writer: the settling transaction holds the write lock.
SELECT id, consumer, queue, job_id, step, idem_key, partner, state, settled_by, settled_at
FROM core_calls WHERE id = :id

-- name: calls_settle
UPDATE core_calls
SET state = :state, reference = :reference, outcome = json(:outcome),
    settled_by = :actor, settled_reason = :reason, settled_at = {NOW}, updated_at = {NOW}
WHERE id = :id AND state = 'in_doubt'
RETURNING id

-- name: calls_parked_letter
SELECT id FROM core_dead_letters
WHERE consumer = :consumer AND job_id = :job_id AND status = 'pending_review'
