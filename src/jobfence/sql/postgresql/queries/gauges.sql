-- The database gauges (SPEC K1; docs/metrics.md), read every Maintenance.gauges_interval by
-- each worker and on each scrape of the ops API's /metrics. Each reads a backlog through a
-- partial index (jobs_available_idx, outbox_pending_id_idx, outbox_failed_idx) or the
-- catalogue, never a whole table of finished work.

-- name: gauge_queue_lag
-- Per queue with available jobs: how long its oldest due job has waited since it fell due.
-- The queues are found by a skip scan of jobs_available_idx (queue, run_at, id) and each
-- queue's earliest run_at is its first index entry: a few index probes per queue, however
-- long the backlog.
WITH RECURSIVE queues AS (
    (SELECT queue FROM core.jobs WHERE state = 'available' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM core.jobs AS j
            WHERE j.state = 'available' AND j.queue > q.queue
            ORDER BY j.queue LIMIT 1)
    FROM queues AS q
    WHERE q.queue IS NOT NULL
)
SELECT q.queue,
       EXTRACT(EPOCH FROM clock_timestamp() - first.run_at) AS oldest_due_s
FROM queues AS q
CROSS JOIN LATERAL (
    SELECT j.run_at FROM core.jobs AS j
    WHERE j.state = 'available' AND j.queue = q.queue
    ORDER BY j.run_at LIMIT 1
) AS first
WHERE q.queue IS NOT NULL AND first.run_at <= clock_timestamp()

-- name: gauge_outbox_backlog
-- Unpublished outbox events per queue and state, and the age of the oldest of each: one
-- branch per state, so that each reads its own partial index (the published events, kept
-- for the retention, are never read).
SELECT queue, 'PENDING' AS state, count(*) AS events,
       EXTRACT(EPOCH FROM clock_timestamp() - min(created_at)) AS oldest_s
FROM core.outbox WHERE state = 'PENDING' GROUP BY queue
UNION ALL
SELECT queue, 'PUBLISH_FAILED_RETRY', count(*),
       EXTRACT(EPOCH FROM clock_timestamp() - min(created_at))
FROM core.outbox WHERE state = 'PUBLISH_FAILED_RETRY' GROUP BY queue

-- name: gauge_fences
-- The fence table's rows (each partition's planner estimate, counted while it was never
-- analysed: core.fence_count) and its size on disk with indexes.
SELECT core.fence_count() AS fences,
       (SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)
        FROM pg_partition_tree('core.processed_jobs') AS t WHERE t.isleaf)::bigint AS bytes
