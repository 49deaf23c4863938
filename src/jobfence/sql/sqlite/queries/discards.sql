-- Bulk discard (jobfence.review.discards): the mirror of bulk replay; see the PostgreSQL file.

-- name: discard_breakdown
SELECT queue, error_category AS category, count(*) AS letters, max(id) AS upto
FROM core_dead_letters
WHERE status = 'pending_review'
  AND (:queue IS NULL OR queue = :queue)
  AND (:consumer IS NULL OR consumer = :consumer)
  AND (:category IS NULL OR error_category = :category)
  AND (:job_id IS NULL OR job_id = :job_id)
  AND (:error IS NULL OR last_error LIKE :error ESCAPE '\')
  AND (:since IS NULL OR failed_at >= :since)
  AND (:until IS NULL OR failed_at < :until)
  AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
  AND (:partner IS NULL OR partner = :partner)
GROUP BY queue, error_category
ORDER BY queue, error_category

-- name: discard_matching
UPDATE core_dead_letters
SET status = 'discarded', reviewed_at = {NOW}, reviewed_by = :actor, review_reason = :reason
WHERE status = 'pending_review' AND id <= :upto
  AND (:queue IS NULL OR queue = :queue)
  AND (:consumer IS NULL OR consumer = :consumer)
  AND (:category IS NULL OR error_category = :category)
  AND (:job_id IS NULL OR job_id = :job_id)
  AND (:error IS NULL OR last_error LIKE :error ESCAPE '\')
  AND (:since IS NULL OR failed_at >= :since)
  AND (:until IS NULL OR failed_at < :until)
  AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
  AND (:partner IS NULL OR partner = :partner)
RETURNING id
