-- Bulk replays: snapshot, runner lease, items (jobfence.review.replays).

-- name: replay_create
INSERT INTO core.replays (created_by, partner, filter, total, expires_at)
VALUES (%(actor)s, %(partner)s, %(filter)s::jsonb, 0,
        now() + make_interval(secs => %(expires_in)s))
RETURNING id

-- name: replay_snapshot
INSERT INTO core.replay_items (replay_id, dead_letter_id)
SELECT %(replay_id)s, id
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
ORDER BY id
LIMIT %(limit)s

-- name: replay_set_total
UPDATE core.replays
SET total = (SELECT count(*) FROM core.replay_items WHERE replay_id = %(replay_id)s)
WHERE id = %(replay_id)s
RETURNING total

-- name: replay_breakdown
SELECT d.queue, d.error_category AS category, count(*) AS letters,
       count(*) FILTER (WHERE d.payload_truncated) AS truncated,
       count(*) FILTER (WHERE EXISTS (
           SELECT 1 FROM core.processed_jobs AS p
           WHERE p.consumer = d.consumer AND p.job_id = d.job_id)) AS applied
FROM core.replay_items AS i
JOIN core.dead_letters AS d ON d.id = i.dead_letter_id
WHERE i.replay_id = %(replay_id)s
GROUP BY d.queue, d.error_category
ORDER BY letters DESC, d.queue, d.error_category

-- name: replay_sample
SELECT d.id, d.queue, d.consumer, d.job_id, d.error_category, d.last_error, d.failed_at
FROM core.replay_items AS i
JOIN core.dead_letters AS d ON d.id = i.dead_letter_id
WHERE i.replay_id = %(replay_id)s
ORDER BY d.id
LIMIT %(limit)s

-- name: replay_get
SELECT id, created_at, created_by, partner, filter, total, state, expires_at, confirmed_by,
       confirmed_at, runner, runner_until, finished_at, (expires_at <= now()) AS expired,
       (runner_until IS NOT NULL AND runner_until <= now()) AS runner_lost
FROM core.replays
WHERE id = %(id)s

-- name: replay_claim
UPDATE core.replays SET
    state = 'running',
    confirmed_by = coalesce(confirmed_by, %(actor)s),
    confirmed_at = coalesce(confirmed_at, now()),
    runner = %(runner)s,
    runner_until = now() + make_interval(secs => %(lease)s)
WHERE id = %(id)s
  AND ((state = 'previewed' AND expires_at > now())
       OR (state = 'running' AND (runner = %(runner)s OR runner_until <= now())))
RETURNING id

-- name: replay_renew
UPDATE core.replays SET runner_until = now() + make_interval(secs => %(lease)s)
WHERE id = %(id)s AND runner = %(runner)s AND state = 'running'
RETURNING id

-- name: replay_todo
SELECT dead_letter_id AS id
FROM core.replay_items
WHERE replay_id = %(id)s AND outcome IS NULL
ORDER BY dead_letter_id
LIMIT %(limit)s

-- name: replay_items_done
UPDATE core.replay_items SET outcome = %(outcome)s, detail = %(detail)s, done_at = now()
WHERE replay_id = %(replay_id)s AND dead_letter_id = ANY(%(ids)s) AND outcome IS NULL

-- name: replay_finish
UPDATE core.replays SET state = 'done', finished_at = now(), runner_until = NULL
WHERE id = %(id)s AND runner = %(runner)s AND state = 'running'
  AND NOT EXISTS (SELECT 1 FROM core.replay_items
                  WHERE replay_id = %(id)s AND outcome IS NULL)
RETURNING id

-- name: replay_counts
SELECT coalesce(outcome, 'pending') AS outcome, count(*) AS items
FROM core.replay_items
WHERE replay_id = %(id)s
GROUP BY outcome

-- name: replay_items_list
SELECT i.dead_letter_id, coalesce(i.outcome, 'pending') AS outcome, i.detail, i.done_at,
       d.queue, d.job_id
FROM core.replay_items AS i
JOIN core.dead_letters AS d ON d.id = i.dead_letter_id
WHERE i.replay_id = %(id)s
  AND (%(outcome)s::text IS NULL OR coalesce(i.outcome, 'pending') = %(outcome)s)
  AND (%(after)s::bigint IS NULL OR i.dead_letter_id > %(after)s)
ORDER BY i.dead_letter_id
LIMIT %(limit)s
