-- Dead letters for people (review, replay, audit), fence cleanup, alerts and ops tokens, on
-- PostgreSQL. Named blocks ("-- name: x"), psycopg %(name)s parameters.

-- name: ops_token_insert
INSERT INTO core.ops_tokens (name, token_hash, role, partner, expires_at)
VALUES (%(name)s, %(hash)s, %(role)s, %(partner)s,
        now() + make_interval(secs => %(expires_in)s::float8))
RETURNING id

-- name: ops_token_lookup
SELECT id, name, role, partner, (expires_at IS NOT NULL AND expires_at <= now()) AS expired
FROM core.ops_tokens
WHERE token_hash = %(hash)s AND revoked_at IS NULL

-- name: ops_tokens_list
SELECT id, name, role, partner, created_at, expires_at, revoked_at
FROM core.ops_tokens
WHERE %(all)s OR revoked_at IS NULL
ORDER BY id

-- name: ops_token_revoke
UPDATE core.ops_tokens SET revoked_at = now()
WHERE name = %(name)s AND revoked_at IS NULL
RETURNING id

-- name: db_now
SELECT now() AS now

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

-- name: dl_requeue
INSERT INTO core.jobs (queue, job_id, correlation_id, payload)
SELECT queue, job_id, correlation_id, payload
FROM core.dead_letters
WHERE id = ANY(%(ids)s)
ORDER BY id

-- name: dl_payloads
SELECT id, queue, job_id, correlation_id, payload
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

-- name: audit_insert
INSERT INTO core.audit_log (actor, via, action, partner, dead_letter_id, replay_id, reason,
                            details, old_state, new_state)
VALUES (%(actor)s, %(via)s, %(action)s, %(partner)s, %(dead_letter_id)s, %(replay_id)s,
        %(reason)s, %(details)s::jsonb, %(old_state)s, %(new_state)s)
RETURNING id

-- name: audit_letters
-- One row per letter, after the statement that decided them: new_state is the state each
-- letter is in now (read in the same transaction), old_state the one it was decided from.
INSERT INTO core.audit_log (actor, via, action, partner, dead_letter_id, replay_id, reason,
                            details, old_state, new_state)
SELECT %(actor)s, %(via)s, %(action)s, d.partner, d.id, %(replay_id)s, %(reason)s,
       %(details)s::jsonb, %(old_state)s, d.status
FROM core.dead_letters AS d
WHERE d.id = ANY(%(ids)s)
ORDER BY d.id

-- name: audit_list
SELECT id, at, actor, via, action, partner, dead_letter_id, replay_id, reason, details,
       old_state, new_state
FROM core.audit_log
WHERE (%(partner)s::text IS NULL OR partner = %(partner)s)
  AND (%(dead_letter_id)s::bigint IS NULL OR dead_letter_id = %(dead_letter_id)s)
  AND (%(replay_id)s::bigint IS NULL OR replay_id = %(replay_id)s)
  AND (%(actor)s::text IS NULL OR actor = %(actor)s)
  AND (%(before)s::bigint IS NULL OR id < %(before)s)
ORDER BY id DESC
LIMIT %(limit)s

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

-- name: lease_acquire
INSERT INTO core.leases AS l (name, holder, expires_at)
VALUES (%(name)s, %(holder)s, now() + make_interval(secs => %(ttl)s))
ON CONFLICT (name) DO UPDATE SET
    holder = excluded.holder,
    acquired_at = CASE WHEN l.holder = excluded.holder THEN l.acquired_at ELSE now() END,
    expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at < now()
RETURNING holder

-- name: lease_renew
UPDATE core.leases SET expires_at = now() + make_interval(secs => %(ttl)s)
WHERE name = %(name)s AND holder = %(holder)s
RETURNING holder

-- name: lease_holder
SELECT holder, expires_at FROM core.leases WHERE name = %(name)s

-- name: lease_release
DELETE FROM core.leases WHERE name = %(name)s AND holder = %(holder)s

-- name: cleanup_fences
-- Expired fences, oldest first, except: younger than min_age (a retry window), of a job_id
-- with a letter pending review or replayed within min_age, or of a job still retrying here.
WITH doomed AS (
    SELECT p.consumer, p.job_id
    FROM core.processed_jobs AS p
    WHERE p.expires_at <= coalesce(%(now)s::timestamptz, now())
      AND p.processed_at <= coalesce(%(now)s::timestamptz, now())
                            - make_interval(secs => %(min_age)s)
      AND NOT EXISTS (
          SELECT 1 FROM core.dead_letters AS d
          WHERE d.job_id = p.job_id AND d.consumer = p.consumer
            AND (d.status = 'pending_review'
                 OR (d.status = 'replayed'
                     AND d.reviewed_at > coalesce(%(now)s::timestamptz, now())
                                         - make_interval(secs => %(min_age)s))))
      AND NOT EXISTS (
          SELECT 1 FROM core.jobs AS j
          WHERE j.job_id = p.job_id AND j.history <> '[]'::jsonb)
    ORDER BY p.expires_at
    LIMIT %(limit)s
    FOR UPDATE OF p SKIP LOCKED
), deleted AS (
    DELETE FROM core.processed_jobs AS p
    USING doomed AS d
    WHERE p.consumer = d.consumer AND p.job_id = d.job_id
    RETURNING 1
)
SELECT count(*) AS deleted FROM deleted

-- name: alert_event_insert
INSERT INTO core.alert_events (source, queue, category, fingerprint, title, details)
VALUES (%(source)s, %(queue)s, %(category)s, %(fingerprint)s, %(title)s, %(details)s::jsonb)

-- name: alert_events_batch
SELECT e.id, e.created_at, e.source, e.queue, e.category, e.fingerprint, e.title, e.details,
       e.dead_letter_id, d.consumer, d.job_id, d.correlation_id, d.attempts, d.error_code,
       d.last_error
FROM core.alert_events AS e
LEFT JOIN core.dead_letters AS d ON d.id = e.dead_letter_id
ORDER BY e.id
LIMIT %(limit)s

-- name: alert_events_delete
DELETE FROM core.alert_events WHERE id = ANY(%(ids)s)

-- name: alert_group_get
SELECT window_start, window_end, summary_id
FROM core.alert_groups
WHERE source = %(source)s AND queue = %(queue)s AND category = %(category)s
  AND fingerprint = %(fingerprint)s

-- name: alert_group_put
INSERT INTO core.alert_groups (source, queue, category, fingerprint, window_start, window_end,
                               summary_id)
VALUES (%(source)s, %(queue)s, %(category)s, %(fingerprint)s, %(window_start)s,
        %(window_end)s, %(summary_id)s)
ON CONFLICT (source, queue, category, fingerprint) DO UPDATE SET
    window_start = excluded.window_start,
    window_end = excluded.window_end,
    summary_id = excluded.summary_id

-- name: alert_insert
INSERT INTO core.alerts (kind, source, queue, category, fingerprint, title, details, count,
                         window_start, window_end, ready_at)
VALUES (%(kind)s, %(source)s, %(queue)s, %(category)s, %(fingerprint)s, %(title)s,
        %(details)s::jsonb, %(count)s, %(window_start)s, %(window_end)s, %(ready_at)s)
RETURNING id

-- name: alert_set_count
UPDATE core.alerts SET count = %(count)s WHERE id = %(id)s

-- name: alert_delivery_insert
INSERT INTO core.alert_deliveries (alert_id, sink, next_attempt_at)
VALUES (%(alert_id)s, %(sink)s, %(at)s)
ON CONFLICT DO NOTHING

-- name: alert_due
SELECT d.alert_id, d.sink, d.attempts, a.kind, a.source, a.queue, a.category, a.fingerprint,
       a.title, a.details, a.count, a.window_start, a.window_end, a.created_at
FROM core.alert_deliveries AS d
JOIN core.alerts AS a ON a.id = d.alert_id
WHERE d.delivered_at IS NULL
  AND d.next_attempt_at <= %(now)s
  AND a.ready_at <= %(now)s
  -- a summary follows its window's first alert: not before that reached the same sink
  AND NOT (a.kind = 'summary' AND EXISTS (
      SELECT 1 FROM core.alerts AS f
      JOIN core.alert_deliveries AS fd ON fd.alert_id = f.id AND fd.sink = d.sink
      WHERE f.kind = 'first' AND f.source = a.source AND f.queue = a.queue
        AND f.category = a.category AND f.fingerprint = a.fingerprint
        AND f.window_start = a.window_start AND fd.delivered_at IS NULL))
ORDER BY d.next_attempt_at, d.alert_id
LIMIT %(limit)s

-- name: alert_delivered
UPDATE core.alert_deliveries
SET delivered_at = now(), attempts = attempts + 1, last_error = NULL
WHERE alert_id = %(alert_id)s AND sink = %(sink)s

-- name: alert_failed
UPDATE core.alert_deliveries
SET attempts = attempts + 1, last_error = %(error)s,
    next_attempt_at = %(now)s + make_interval(secs => %(delay)s)
WHERE alert_id = %(alert_id)s AND sink = %(sink)s

-- name: alerts_recent
SELECT a.id, a.created_at, a.kind, a.queue, a.category, a.fingerprint, a.title, a.count,
       a.window_start, a.window_end, a.ready_at,
       d.sink, d.attempts, d.delivered_at, d.next_attempt_at, d.last_error
FROM core.alerts AS a
LEFT JOIN core.alert_deliveries AS d ON d.alert_id = a.id
WHERE a.id > (SELECT coalesce(max(id), 0) - %(limit)s FROM core.alerts)
ORDER BY a.id DESC, d.sink

-- name: alerts_undelivered
SELECT count(*) AS deliveries FROM core.alert_deliveries WHERE delivered_at IS NULL

-- name: alert_summary_state
SELECT a.count,
       EXISTS (SELECT 1 FROM core.alert_deliveries AS d
               WHERE d.alert_id = a.id AND (d.attempts > 0 OR d.delivered_at IS NOT NULL))
           AS started
FROM core.alerts AS a
WHERE a.id = %(id)s

-- name: cleanup_due
SELECT EXISTS (SELECT 1 FROM core.processed_jobs
               WHERE expires_at <= coalesce(%(now)s::timestamptz, now())) AS due

-- name: alert_work
SELECT EXISTS (SELECT 1 FROM core.alert_events)
       OR EXISTS (SELECT 1 FROM core.alert_deliveries
                  WHERE delivered_at IS NULL AND next_attempt_at <= %(now)s) AS work
