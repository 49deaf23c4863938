-- The physical reference for the durable-effect workload: one job per transaction, in the
-- same statements jobfence sends for it (claim; BEGIN; fence + ack in one statement; the
-- effect's INSERT; COMMIT), against a jobfence-migrated database holding the jobs.
-- bench/run.py runs it as: pgbench -n -M prepared -c C -j 2 -t N/C -f durable.sql
-- The claim reads one ordered index range of the one queue, as jobfence's claim does per queue
-- since 1597919 (before it, an ANY(...) over the queues read and sorted every available row).
WITH candidates AS (
    SELECT id FROM core.jobs
    WHERE state = 'available' AND queue = 'bench' AND run_at <= now()
    ORDER BY run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED
)
UPDATE core.jobs AS j SET state = 'running', attempts = j.attempts + 1,
    lease_token = gen_random_uuid(), lease_expires_at = now() + make_interval(secs => 30),
    worker_id = 'pgbench'
FROM candidates AS c WHERE j.id = c.id
RETURNING j.id AS job_ref, j.job_id AS job_key, j.lease_token AS token, j.payload AS payload \gset
BEGIN;
WITH acked AS (
    DELETE FROM core.jobs WHERE id = :job_ref AND lease_token = :token RETURNING id
), fenced AS (
    INSERT INTO core.processed_jobs (consumer, job_id, expires_at)
    SELECT 'bench', :job_key, now() + make_interval(secs => 604800) FROM acked
    ON CONFLICT DO NOTHING RETURNING 1
)
SELECT (SELECT count(*) FROM acked) AS acked, (SELECT count(*) FROM fenced) AS fenced;
INSERT INTO bench_effects (job_id, t_enq) VALUES (:job_key, NULL);
COMMIT;
