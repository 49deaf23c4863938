-- Dead letters: the record and its review (jobfence.review.letters, jobfence.review.deadletters).

-- name: insert_dead_letter
INSERT INTO core_dead_letters (
    queue, consumer, job_id, correlation_id, payload, payload_size, payload_truncated,
    attempts, error_category, error_code, last_error, history, enqueued_at, failed_at, partner,
    previous_id, trace_context)
VALUES (
    :queue, :consumer, :job_id, :correlation_id, :payload, :payload_size, :payload_truncated,
    :attempts, :category, :error_code, :error,
    json_insert(:history, '$[#]', json_patch(json_object(
        'attempt', :attempts, 'at', {NOW_ISO}, 'category', :category, 'error', :error),
        json_object('trace', :trace))),
    :enqueued_at, {NOW}, :partner,
    -- a replayed job that fails again links to the letter it was replayed from
    (SELECT max(id) FROM core_dead_letters
     WHERE job_id = :job_id AND consumer = :consumer AND status = 'replayed'),
    :trace_context)
ON CONFLICT DO NOTHING
RETURNING id

-- name: get_dead_letter
SELECT id, queue, consumer, job_id, correlation_id, payload, payload_size, payload_truncated,
       attempts, error_category, error_code, last_error, history, status, enqueued_at,
       failed_at, partner, previous_id, reviewed_at, reviewed_by, review_reason
FROM core_dead_letters WHERE id = :id

-- name: dead_letter_pending_id
-- The letter a repeated dead-lettering of the same delivery met (insert_dead_letter did nothing)
SELECT id FROM core_dead_letters
WHERE consumer = :consumer AND job_id = :job_id AND status = 'pending_review'

-- name: dl_search
SELECT id, queue, consumer, job_id, correlation_id, payload_size, payload_truncated,
       attempts, error_category, error_code, last_error, status, enqueued_at, failed_at,
       partner, previous_id, reviewed_at, reviewed_by, review_reason
FROM core_dead_letters
WHERE (:status IS NULL OR status = :status)
  AND (:queue IS NULL OR queue = :queue)
  AND (:consumer IS NULL OR consumer = :consumer)
  AND (:category IS NULL OR error_category = :category)
  AND (:job_id IS NULL OR job_id = :job_id)
  AND (:error IS NULL OR last_error LIKE :error ESCAPE '\')
  AND (:since IS NULL OR failed_at >= :since)
  AND (:until IS NULL OR failed_at < :until)
  AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
  AND (:partner IS NULL OR partner = :partner)
  AND (:before IS NULL OR id < :before)
ORDER BY id DESC
LIMIT :limit

-- name: dl_followers
SELECT id FROM core_dead_letters
WHERE job_id = :job_id AND previous_id = :id
ORDER BY id

-- name: dl_lock_for_review
SELECT d.id, d.status, d.partner, d.payload_truncated, d.queue, d.consumer, d.job_id,
       d.reviewed_by, d.reviewed_at,
       EXISTS (SELECT 1 FROM core_processed_jobs AS p
               WHERE p.consumer = d.consumer AND p.job_id = d.job_id) AS applied
FROM core_dead_letters AS d
WHERE d.id IN (SELECT value FROM json_each(:ids))
ORDER BY d.id

-- name: dl_mark_replayed
UPDATE core_dead_letters
SET status = 'replayed', reviewed_at = {NOW}, reviewed_by = :actor, review_reason = :reason
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'pending_review'
RETURNING id

-- name: dl_payloads
SELECT id, queue, job_id, correlation_id, payload, trace_context
FROM core_dead_letters
WHERE id IN (SELECT value FROM json_each(:ids))
ORDER BY id

-- name: dl_trace_contexts
-- The trace contexts of letters being replayed: the replay's span links to them.
SELECT id, queue, trace_context
FROM core_dead_letters
WHERE id IN (SELECT value FROM json_each(:ids))
ORDER BY id

-- name: dl_discard
UPDATE core_dead_letters
SET status = 'discarded', reviewed_at = {NOW}, reviewed_by = :actor, review_reason = :reason
WHERE id = :id AND status = 'pending_review' AND (:scope IS NULL OR partner = :scope)
RETURNING id

-- name: dl_stats
SELECT queue, error_category AS category, status, count(*) AS letters
FROM core_dead_letters
WHERE (:partner IS NULL OR partner = :partner)
GROUP BY queue, error_category, status
ORDER BY queue, error_category, status

-- name: dl_pending_counts
SELECT queue, error_category AS category, count(*) AS letters
FROM core_dead_letters
WHERE status = 'pending_review'
GROUP BY queue, error_category
