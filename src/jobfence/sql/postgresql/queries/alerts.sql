-- Alert events, grouping and delivery (jobfence.alerts).

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

-- name: alert_work
SELECT EXISTS (SELECT 1 FROM core.alert_events)
       OR EXISTS (SELECT 1 FROM core.alert_deliveries
                  WHERE delivered_at IS NULL AND next_attempt_at <= %(now)s) AS work
