-- Bulk discard (jobfence.review.discards): the mirror of bulk replay. The filter is dl_search's;
-- the snapshot is "pending letters matching it with id <= upto" (a letter that leaves
-- pending_review never comes back, and later letters have higher ids).

-- name: discard_breakdown
SELECT queue, error_category AS category, count(*) AS letters, max(id) AS upto
FROM core.dead_letters
WHERE status = 'pending_review'
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(consumer)s::text IS NULL OR consumer = %(consumer)s)
  AND (%(category)s::text IS NULL OR error_category = %(category)s)
  AND (%(job_id)s::text IS NULL OR job_id = %(job_id)s)
  AND (%(error)s::text IS NULL OR last_error ILIKE %(error)s ESCAPE '\')
  AND (%(since)s::timestamptz IS NULL OR failed_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR failed_at < %(until)s)
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s))
  AND (%(partner)s::text IS NULL OR partner = %(partner)s)
GROUP BY queue, error_category
ORDER BY queue, error_category

-- name: discard_matching
UPDATE core.dead_letters
SET status = 'discarded', reviewed_at = now(), reviewed_by = %(actor)s,
    review_reason = %(reason)s
WHERE status = 'pending_review' AND id <= %(upto)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(consumer)s::text IS NULL OR consumer = %(consumer)s)
  AND (%(category)s::text IS NULL OR error_category = %(category)s)
  AND (%(job_id)s::text IS NULL OR job_id = %(job_id)s)
  AND (%(error)s::text IS NULL OR last_error ILIKE %(error)s ESCAPE '\')
  AND (%(since)s::timestamptz IS NULL OR failed_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR failed_at < %(until)s)
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s))
  AND (%(partner)s::text IS NULL OR partner = %(partner)s)
RETURNING id
