-- Bulk replays: snapshot, runner lease, items (jobfence.review.replays).

-- name: replay_create
INSERT INTO core_replays (created_at, created_by, partner, filter, total, expires_at)
VALUES ({NOW}, :actor, :partner, json(:filter), 0, {NOW} + :expires_in)
RETURNING id

-- name: replay_snapshot
INSERT INTO core_replay_items (replay_id, dead_letter_id)
SELECT :replay_id, id
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
ORDER BY id
LIMIT :limit

-- name: replay_set_total
UPDATE core_replays
SET total = (SELECT count(*) FROM core_replay_items WHERE replay_id = :replay_id)
WHERE id = :replay_id
RETURNING total

-- name: replay_breakdown
SELECT d.queue, d.error_category AS category, count(*) AS letters,
       sum(d.payload_truncated) AS truncated,
       sum(EXISTS (SELECT 1 FROM core_processed_jobs AS p
                   WHERE p.consumer = d.consumer AND p.job_id = d.job_id)) AS applied
FROM core_replay_items AS i
JOIN core_dead_letters AS d ON d.id = i.dead_letter_id
WHERE i.replay_id = :replay_id
GROUP BY d.queue, d.error_category
ORDER BY letters DESC, d.queue, d.error_category

-- name: replay_sample
SELECT d.id, d.queue, d.consumer, d.job_id, d.error_category, d.last_error, d.failed_at
FROM core_replay_items AS i
JOIN core_dead_letters AS d ON d.id = i.dead_letter_id
WHERE i.replay_id = :replay_id
ORDER BY d.id
LIMIT :limit

-- name: replay_get
SELECT id, created_at, created_by, partner, filter, total, state, expires_at, confirmed_by,
       confirmed_at, runner, runner_until, finished_at, (expires_at <= {NOW}) AS expired,
       (runner_until IS NOT NULL AND runner_until <= {NOW}) AS runner_lost
FROM core_replays
WHERE id = :id

-- name: replay_claim
UPDATE core_replays SET
    state = 'running',
    confirmed_by = coalesce(confirmed_by, :actor),
    confirmed_at = coalesce(confirmed_at, {NOW}),
    runner = :runner,
    runner_until = {NOW} + :lease
WHERE id = :id
  AND ((state = 'previewed' AND expires_at > {NOW})
       OR (state = 'running' AND (runner = :runner OR runner_until <= {NOW})))
RETURNING id

-- name: replay_renew
UPDATE core_replays SET runner_until = {NOW} + :lease
WHERE id = :id AND runner = :runner AND state = 'running'
RETURNING id

-- name: replay_todo
SELECT dead_letter_id AS id
FROM core_replay_items
WHERE replay_id = :id AND outcome IS NULL
ORDER BY dead_letter_id
LIMIT :limit

-- name: replay_items_done
UPDATE core_replay_items SET outcome = :outcome, detail = :detail, done_at = {NOW}
WHERE replay_id = :replay_id AND dead_letter_id IN (SELECT value FROM json_each(:ids))
  AND outcome IS NULL

-- name: replay_finish
UPDATE core_replays SET state = 'done', finished_at = {NOW}, runner_until = NULL
WHERE id = :id AND runner = :runner AND state = 'running'
  AND NOT EXISTS (SELECT 1 FROM core_replay_items WHERE replay_id = :id AND outcome IS NULL)
RETURNING id

-- name: replay_counts
SELECT coalesce(outcome, 'pending') AS outcome, count(*) AS items
FROM core_replay_items
WHERE replay_id = :id
GROUP BY outcome

-- name: replay_items_list
SELECT i.dead_letter_id, coalesce(i.outcome, 'pending') AS outcome, i.detail, i.done_at,
       d.queue, d.job_id
FROM core_replay_items AS i
JOIN core_dead_letters AS d ON d.id = i.dead_letter_id
WHERE i.replay_id = :id
  AND (:outcome IS NULL OR coalesce(i.outcome, 'pending') = :outcome)
  AND (:after IS NULL OR i.dead_letter_id > :after)
ORDER BY i.dead_letter_id
LIMIT :limit
