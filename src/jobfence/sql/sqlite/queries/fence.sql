-- The fence (SPEC F, H5, T2): insert with the ack, group commit, the lent transaction, cleanup (jobfence.core.fence, jobfence.runtime.cleanup).

-- name: fence
INSERT INTO core_processed_jobs (consumer, job_id, processed_at, expires_at)
VALUES (:consumer, :job_id, {NOW}, {NOW} + :ttl)
ON CONFLICT DO NOTHING
RETURNING 1 AS fenced

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

-- name: cleanup_due
SELECT EXISTS (SELECT 1 FROM core_processed_jobs WHERE expires_at <= coalesce(:now, {NOW}))
    AS due

-- name: fence_find
SELECT consumer, processed_at, expires_at FROM core_processed_jobs
WHERE consumer IN (SELECT value FROM json_each(:consumers)) AND job_id = :job_id
ORDER BY processed_at, consumer
