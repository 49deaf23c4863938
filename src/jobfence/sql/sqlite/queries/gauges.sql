-- The database gauges (SPEC K1; docs/metrics.md); see the PostgreSQL twin.

-- name: gauge_queue_lag
SELECT queue, {NOW} - min(run_at) AS oldest_due_s
FROM core_jobs
WHERE state = 'available' AND run_at <= {NOW}
GROUP BY queue

-- name: gauge_outbox_backlog
SELECT queue, state, count(*) AS events,
       {NOW} - min(created_at) AS oldest_s
FROM core_outbox
WHERE state IN ('PENDING', 'PUBLISH_FAILED_RETRY')
GROUP BY queue, state

-- name: gauge_fences
-- SQLite keeps no row estimate and no per-table size: an exact count, no size.
SELECT count(*) AS fences, NULL AS bytes FROM core_processed_jobs
