-- Dead letters: the record and its review (jobfence.review.letters, jobfence.review.deadletters).

-- name: insert_dead_letter
INSERT INTO core.dead_letters (
    queue, consumer, job_id, correlation_id, payload, payload_size, payload_truncated,
    attempts, error_category, error_code, last_error, history, enqueued_at, partner,
    previous_id, trace_context)
VALUES (
    %(queue)s, %(consumer)s, %(job_id)s, %(correlation_id)s, %(payload)s, %(payload_size)s,
    %(payload_truncated)s, %(attempts)s, %(category)s, %(error_code)s, %(error)s,
    %(history)s::jsonb || jsonb_build_array(jsonb_build_object(
        'attempt', %(attempts)s::int,
        'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'category', %(category)s::text,
        'error', %(error)s::text)
        || jsonb_strip_nulls(jsonb_build_object('trace', %(trace)s::text))),
    %(enqueued_at)s, %(partner)s,
    -- a replayed job that fails again links to the letter it was replayed from
    (SELECT max(id) FROM core.dead_letters
     WHERE job_id = %(job_id)s AND consumer = %(consumer)s AND status = 'replayed'),
    %(trace_context)s)
ON CONFLICT DO NOTHING
RETURNING id

-- name: get_dead_letter
SELECT id, queue, consumer, job_id, correlation_id, payload, payload_size, payload_truncated,
       attempts, error_category, error_code, last_error, history, status, enqueued_at,
       failed_at, partner, previous_id, reviewed_at, reviewed_by, review_reason
FROM core.dead_letters WHERE id = %(id)s

-- name: dead_letter_pending_id
-- The letter a repeated dead-lettering of the same delivery met (insert_dead_letter did nothing)
SELECT id FROM core.dead_letters
WHERE consumer = %(consumer)s AND job_id = %(job_id)s AND status = 'pending_review'

-- name: dl_search
SELECT id, queue, consumer, job_id, correlation_id, payload_size, payload_truncated,
       attempts, error_category, error_code, last_error, status, enqueued_at, failed_at,
       partner, previous_id, reviewed_at, reviewed_by, review_reason
FROM core.dead_letters
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(consumer)s::text IS NULL OR consumer = %(consumer)s)
  AND (%(category)s::text IS NULL OR error_category = %(category)s)
  AND (%(job_id)s::text IS NULL OR job_id = %(job_id)s)
  AND (%(error)s::text IS NULL OR last_error ILIKE %(error)s ESCAPE '\')
  AND (%(since)s::timestamptz IS NULL OR failed_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR failed_at < %(until)s)
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s))
  AND (%(partner)s::text IS NULL OR partner = %(partner)s)
  AND (%(before)s::bigint IS NULL OR id < %(before)s)
ORDER BY id DESC
LIMIT %(limit)s

-- name: dl_search_window
-- dl_search with a time window (since and/or until). The window's lowest and highest ids come
-- from an index-only scan of dead_letters_failed_id_idx (O(letters in the window); `id + 0`
-- keeps the planner from answering min/max by walking the primary key, which reads every
-- newer letter), and the page walks the primary key down between them. Letters are written
-- in id order give or take concurrent transactions, so the range holds little besides the
-- window's own letters; the result is exact in any order (the window is also a filter). An
-- empty window has no lowest id: no rows. The cursor (before) is folded into the highest id,
-- so that a generic plan (prepared statements) still starts the walk at the cursor.
WITH win AS MATERIALIZED (
    SELECT min(id + 0) AS lo,
           LEAST(max(id + 0), COALESCE(%(before)s::bigint - 1, 9223372036854775807)) AS hi
    FROM core.dead_letters
    WHERE failed_at >= COALESCE(%(since)s::timestamptz, '-infinity')
      AND failed_at < COALESCE(%(until)s::timestamptz, 'infinity')
)
SELECT id, queue, consumer, job_id, correlation_id, payload_size, payload_truncated,
       attempts, error_category, error_code, last_error, status, enqueued_at, failed_at,
       partner, previous_id, reviewed_at, reviewed_by, review_reason
FROM core.dead_letters
WHERE id >= (SELECT lo FROM win) AND id <= (SELECT hi FROM win)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(consumer)s::text IS NULL OR consumer = %(consumer)s)
  AND (%(category)s::text IS NULL OR error_category = %(category)s)
  AND (%(job_id)s::text IS NULL OR job_id = %(job_id)s)
  AND (%(error)s::text IS NULL OR last_error ILIKE %(error)s ESCAPE '\')
  AND (%(since)s::timestamptz IS NULL OR failed_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR failed_at < %(until)s)
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s))
  AND (%(partner)s::text IS NULL OR partner = %(partner)s)
ORDER BY id DESC
LIMIT %(limit)s

-- name: dl_followers
SELECT id FROM core.dead_letters
WHERE job_id = %(job_id)s AND previous_id = %(id)s
ORDER BY id

-- name: dl_lock_for_review
SELECT d.id, d.status, d.partner, d.payload_truncated, d.queue, d.consumer, d.job_id,
       d.reviewed_by, d.reviewed_at,
       EXISTS (SELECT 1 FROM core.processed_jobs AS p
               WHERE p.consumer = d.consumer AND p.job_id = d.job_id) AS applied
FROM core.dead_letters AS d
WHERE d.id = ANY(%(ids)s)
ORDER BY d.id
FOR UPDATE OF d

-- name: dl_mark_replayed
UPDATE core.dead_letters
SET status = 'replayed', reviewed_at = now(), reviewed_by = %(actor)s,
    review_reason = %(reason)s
WHERE id = ANY(%(ids)s) AND status = 'pending_review'
RETURNING id

-- name: dl_payloads
SELECT id, queue, job_id, correlation_id, payload, trace_context
FROM core.dead_letters
WHERE id = ANY(%(ids)s)
ORDER BY id

-- name: dl_trace_contexts
-- The trace contexts of letters being replayed: the replay's span links to them.
SELECT id, queue, trace_context
FROM core.dead_letters
WHERE id = ANY(%(ids)s)
ORDER BY id

-- name: dl_discard
UPDATE core.dead_letters
SET status = 'discarded', reviewed_at = now(), reviewed_by = %(actor)s,
    review_reason = %(reason)s
WHERE id = %(id)s AND status = 'pending_review'
  AND (%(scope)s::text IS NULL OR partner = %(scope)s)
RETURNING id

-- name: dl_stats
SELECT queue, error_category AS category, status, count(*) AS letters
FROM core.dead_letters
WHERE (%(partner)s::text IS NULL OR partner = %(partner)s)
GROUP BY queue, error_category, status
ORDER BY queue, error_category, status

-- name: dl_pending_counts
SELECT queue, error_category AS category, count(*) AS letters
FROM core.dead_letters
WHERE status = 'pending_review'
GROUP BY queue, error_category

-- name: dead_letters_expire
-- Up to batch decided letters past the retention the owner set (none set: none), with their
-- replay items; never a letter pending review (9_letters_retention.sql).
SELECT core.dead_letters_expire(%(batch)s) AS expired
