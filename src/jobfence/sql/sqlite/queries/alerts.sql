-- Alert events, grouping and delivery (jobfence.alerts).

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

-- name: alert_work
SELECT EXISTS (SELECT 1 FROM core_alert_events)
       OR EXISTS (SELECT 1 FROM core_alert_deliveries
                  WHERE delivered_at IS NULL AND next_attempt_at <= :now) AS work
