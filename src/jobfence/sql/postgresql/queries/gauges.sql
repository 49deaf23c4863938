-- The database gauges (SPEC K1; docs/metrics.md), read every Maintenance.gauges_interval by
-- each worker and on each scrape of the ops API's /metrics. Each reads a backlog through a
-- partial index (jobs_available_idx, outbox_pending_id_idx, outbox_failed_idx) or the
-- catalogue, never a whole table of finished work.

-- name: gauge_queue_lag
-- Per queue: jobs due now, and how long the oldest of them has waited since it fell due.
SELECT queue,
       count(*) AS due,
       EXTRACT(EPOCH FROM clock_timestamp() - min(run_at)) AS oldest_due_s
FROM core.jobs
WHERE state = 'available' AND run_at <= clock_timestamp()
GROUP BY queue

-- name: gauge_outbox_backlog
-- Unpublished outbox events per queue and state, and the age of the oldest of each.
SELECT queue, state, count(*) AS events,
       EXTRACT(EPOCH FROM clock_timestamp() - min(created_at)) AS oldest_s
FROM core.outbox
WHERE state IN ('PENDING', 'PUBLISH_FAILED_RETRY')
GROUP BY queue, state

-- name: gauge_fences
-- The fence table's rows (the planner's estimate, exact while the table was never analysed)
-- and its size on disk with indexes.
SELECT CASE WHEN c.reltuples < 0 THEN (SELECT count(*) FROM core.processed_jobs)
            ELSE c.reltuples::bigint END AS fences,
       pg_total_relation_size(c.oid) AS bytes
FROM pg_class AS c
WHERE c.oid = 'core.processed_jobs'::regclass
