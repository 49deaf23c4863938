-- Dead letters for people (review, replay, audit), fence cleanup, alerts and ops tokens, on
-- SQLite. Named blocks ("-- name: x"), :name parameters, {NOW} is SQLite's clock (epoch s).

-- name: ops_token_insert
INSERT INTO core_ops_tokens (name, token_hash, role, partner, created_at, expires_at)
VALUES (:name, :hash, :role, :partner, {NOW}, {NOW} + :expires_in)
RETURNING id

-- name: ops_token_lookup
SELECT id, name, role, partner, (expires_at IS NOT NULL AND expires_at <= {NOW}) AS expired
FROM core_ops_tokens
WHERE token_hash = :hash AND revoked_at IS NULL

-- name: ops_tokens_list
SELECT id, name, role, partner, created_at, expires_at, revoked_at
FROM core_ops_tokens
WHERE :all OR revoked_at IS NULL
ORDER BY id

-- name: ops_token_revoke
UPDATE core_ops_tokens SET revoked_at = {NOW}
WHERE name = :name AND revoked_at IS NULL
RETURNING id

-- name: db_now
SELECT {NOW} AS now

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

-- name: dl_requeue
INSERT INTO core_jobs (queue, job_id, correlation_id, payload, run_at, enqueued_at)
SELECT queue, job_id, correlation_id, payload, {NOW}, {NOW}
FROM core_dead_letters
WHERE id IN (SELECT value FROM json_each(:ids))
ORDER BY id

-- name: dl_payloads
SELECT id, queue, job_id, correlation_id, payload
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

-- name: audit_insert
INSERT INTO core_audit_log (at, actor, via, action, partner, dead_letter_id, replay_id, reason,
                            details, old_state, new_state)
VALUES ({NOW}, :actor, :via, :action, :partner, :dead_letter_id, :replay_id, :reason,
        json(:details), :old_state, :new_state)
RETURNING id

-- name: audit_letters
-- One row per letter, after the statement that decided them: new_state is the state each
-- letter is in now, old_state the one it was decided from.
INSERT INTO core_audit_log (at, actor, via, action, partner, dead_letter_id, replay_id, reason,
                            details, old_state, new_state)
SELECT {NOW}, :actor, :via, :action, d.partner, d.id, :replay_id, :reason, json(:details),
       :old_state, d.status
FROM core_dead_letters AS d
WHERE d.id IN (SELECT value FROM json_each(:ids))
ORDER BY d.id

-- name: audit_list
SELECT id, at, actor, via, action, partner, dead_letter_id, replay_id, reason, details,
       old_state, new_state
FROM core_audit_log
WHERE (:partner IS NULL OR partner = :partner)
  AND (:dead_letter_id IS NULL OR dead_letter_id = :dead_letter_id)
  AND (:replay_id IS NULL OR replay_id = :replay_id)
  AND (:actor IS NULL OR actor = :actor)
  AND (:before IS NULL OR id < :before)
ORDER BY id DESC
LIMIT :limit

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

-- name: lease_acquire
INSERT INTO core_leases (name, holder, acquired_at, expires_at)
VALUES (:name, :holder, {NOW}, {NOW} + :ttl)
ON CONFLICT (name) DO UPDATE SET
    holder = excluded.holder,
    acquired_at = CASE WHEN core_leases.holder = excluded.holder
                       THEN core_leases.acquired_at ELSE excluded.acquired_at END,
    expires_at = excluded.expires_at
WHERE core_leases.holder = excluded.holder OR core_leases.expires_at < {NOW}
RETURNING holder

-- name: lease_renew
UPDATE core_leases SET expires_at = {NOW} + :ttl
WHERE name = :name AND holder = :holder
RETURNING holder

-- name: lease_holder
SELECT holder, expires_at FROM core_leases WHERE name = :name

-- name: lease_release
DELETE FROM core_leases WHERE name = :name AND holder = :holder

-- name: cleanup_fences
-- Expired fences, oldest first, except: younger than min_age (a retry window), of a job_id
-- with a letter pending review or replayed within min_age, or of a job still retrying here.
DELETE FROM core_processed_jobs
WHERE (consumer, job_id) IN (
    SELECT p.consumer, p.job_id
    FROM core_processed_jobs AS p
    WHERE p.expires_at <= coalesce(:now, {NOW})
      AND p.processed_at <= coalesce(:now, {NOW}) - :min_age
      AND NOT EXISTS (
          SELECT 1 FROM core_dead_letters AS d
          WHERE d.job_id = p.job_id AND d.consumer = p.consumer
            AND (d.status = 'pending_review'
                 OR (d.status = 'replayed'
                     AND d.reviewed_at > coalesce(:now, {NOW}) - :min_age)))
      AND NOT EXISTS (
          SELECT 1 FROM core_jobs AS j
          WHERE j.job_id = p.job_id AND j.history <> '[]')
    ORDER BY p.expires_at
    LIMIT :limit
)

-- name: changes
SELECT changes() AS changed

-- name: alert_event_insert
INSERT INTO core_alert_events (created_at, source, queue, category, fingerprint, title, details)
VALUES ({NOW}, :source, :queue, :category, :fingerprint, :title, json(:details))

-- name: alert_events_batch
SELECT e.id, e.created_at, e.source, e.queue, e.category, e.fingerprint, e.title, e.details,
       e.dead_letter_id, d.consumer, d.job_id, d.correlation_id, d.attempts, d.error_code,
       d.last_error
FROM core_alert_events AS e
LEFT JOIN core_dead_letters AS d ON d.id = e.dead_letter_id
ORDER BY e.id
LIMIT :limit

-- name: alert_events_delete
DELETE FROM core_alert_events WHERE id IN (SELECT value FROM json_each(:ids))

-- name: alert_group_get
SELECT window_start, window_end, summary_id
FROM core_alert_groups
WHERE source = :source AND queue = :queue AND category = :category
  AND fingerprint = :fingerprint

-- name: alert_group_put
INSERT INTO core_alert_groups (source, queue, category, fingerprint, window_start, window_end,
                               summary_id)
VALUES (:source, :queue, :category, :fingerprint, :window_start, :window_end, :summary_id)
ON CONFLICT (source, queue, category, fingerprint) DO UPDATE SET
    window_start = excluded.window_start,
    window_end = excluded.window_end,
    summary_id = excluded.summary_id

-- name: alert_insert
INSERT INTO core_alerts (created_at, kind, source, queue, category, fingerprint, title, details,
                         count, window_start, window_end, ready_at)
VALUES ({NOW}, :kind, :source, :queue, :category, :fingerprint, :title, json(:details), :count,
        :window_start, :window_end, :ready_at)
RETURNING id

-- name: alert_set_count
UPDATE core_alerts SET count = :count WHERE id = :id

-- name: alert_delivery_insert
INSERT INTO core_alert_deliveries (alert_id, sink, next_attempt_at)
VALUES (:alert_id, :sink, :at)
ON CONFLICT DO NOTHING

-- name: alert_due
SELECT d.alert_id, d.sink, d.attempts, a.kind, a.source, a.queue, a.category, a.fingerprint,
       a.title, a.details, a.count, a.window_start, a.window_end, a.created_at
FROM core_alert_deliveries AS d
JOIN core_alerts AS a ON a.id = d.alert_id
WHERE d.delivered_at IS NULL
  AND d.next_attempt_at <= :now
  AND a.ready_at <= :now
  -- a summary follows its window's first alert: not before that reached the same sink
  AND NOT (a.kind = 'summary' AND EXISTS (
      SELECT 1 FROM core_alerts AS f
      JOIN core_alert_deliveries AS fd ON fd.alert_id = f.id AND fd.sink = d.sink
      WHERE f.kind = 'first' AND f.source = a.source AND f.queue = a.queue
        AND f.category = a.category AND f.fingerprint = a.fingerprint
        AND f.window_start = a.window_start AND fd.delivered_at IS NULL))
ORDER BY d.next_attempt_at, d.alert_id
LIMIT :limit

-- name: alert_delivered
UPDATE core_alert_deliveries
SET delivered_at = {NOW}, attempts = attempts + 1, last_error = NULL
WHERE alert_id = :alert_id AND sink = :sink

-- name: alert_failed
UPDATE core_alert_deliveries
SET attempts = attempts + 1, last_error = :error, next_attempt_at = :now + :delay
WHERE alert_id = :alert_id AND sink = :sink

-- name: alerts_recent
SELECT a.id, a.created_at, a.kind, a.queue, a.category, a.fingerprint, a.title, a.count,
       a.window_start, a.window_end, a.ready_at,
       d.sink, d.attempts, d.delivered_at, d.next_attempt_at, d.last_error
FROM core_alerts AS a
LEFT JOIN core_alert_deliveries AS d ON d.alert_id = a.id
WHERE a.id > (SELECT coalesce(max(id), 0) - :limit FROM core_alerts)
ORDER BY a.id DESC, d.sink

-- name: alerts_undelivered
SELECT count(*) AS deliveries FROM core_alert_deliveries WHERE delivered_at IS NULL

-- name: alert_summary_state
SELECT a.count,
       EXISTS (SELECT 1 FROM core_alert_deliveries AS d
               WHERE d.alert_id = a.id AND (d.attempts > 0 OR d.delivered_at IS NOT NULL))
           AS started
FROM core_alerts AS a
WHERE a.id = :id

-- name: cleanup_due
SELECT EXISTS (SELECT 1 FROM core_processed_jobs WHERE expires_at <= coalesce(:now, {NOW}))
    AS due

-- name: alert_work
SELECT EXISTS (SELECT 1 FROM core_alert_events)
       OR EXISTS (SELECT 1 FROM core_alert_deliveries
                  WHERE delivered_at IS NULL AND next_attempt_at <= :now) AS work
