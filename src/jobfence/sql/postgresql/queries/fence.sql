-- The fence (SPEC F, H5, T2): insert with the ack, group commit, the lent transaction, cleanup (jobfence.core.fence, jobfence.runtime.cleanup).

-- name: fence_and_ack
WITH acked AS (
    DELETE FROM core.jobs WHERE id = %(id)s AND lease_token = %(token)s RETURNING id
), fenced AS (
    INSERT INTO core.processed_jobs (consumer, job_id, expires_at)
    SELECT %(consumer)s, %(job_id)s, now() + make_interval(secs => %(ttl)s) FROM acked
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM acked) AS acked, (SELECT count(*) FROM fenced) AS fenced

-- name: fence
INSERT INTO core.processed_jobs (consumer, job_id, expires_at)
VALUES (%(consumer)s, %(job_id)s, now() + make_interval(secs => %(ttl)s))
ON CONFLICT DO NOTHING
RETURNING 1 AS fenced

-- name: batch_fence_and_ack
-- Group commit: ack a batch of claimed jobs and fence them, in one statement at the start of
-- one transaction. Keys are locked in (consumer, job_id) order so that concurrent batches
-- cannot deadlock on each other's fences. A job_id twice in the batch is fenced once.
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(consumers)s::text[],
                         %(job_ids)s::text[]) AS i(id, token, consumer, job_id)
), acked AS (
    DELETE FROM core.jobs AS j USING input AS i
    WHERE j.id = i.id AND j.lease_token = i.token
    RETURNING j.id
), fenced AS (
    INSERT INTO core.processed_jobs (consumer, job_id, expires_at)
    SELECT DISTINCT i.consumer, i.job_id, now() + make_interval(secs => %(ttl)s)
    FROM input AS i JOIN acked AS a ON a.id = i.id
    ORDER BY i.consumer, i.job_id
    ON CONFLICT DO NOTHING
    RETURNING consumer, job_id
)
SELECT i.id, a.id IS NOT NULL AS acked, f.job_id IS NOT NULL AS fenced
FROM input AS i
LEFT JOIN acked AS a ON a.id = i.id
LEFT JOIN fenced AS f ON f.consumer = i.consumer AND f.job_id = i.job_id

-- name: unfence
-- A job of a batch failed: its savepoint rolled back its work, this removes its fence row.
DELETE FROM core.processed_jobs WHERE consumer = %(consumer)s AND job_id = %(job_id)s

-- name: lend_begin
-- Names the transaction jobfence lends a handler (SPEC H5): core.fence_commit() checks it,
-- and the fence's deferred guard trigger fires only for fences written under this name.
SELECT core.fence_begin(%(jobfence_tx)s)

-- name: lend_commit
SELECT core.fence_commit(%(jobfence_tx)s)

-- name: lend_commit_and_commit
SELECT core.fence_commit(%(jobfence_tx)s); COMMIT

-- name: cleanup_fences
-- Expired fences, oldest first, except: younger than min_age (a retry window), of a job_id
-- with a letter pending review or replayed within min_age, or of a job still retrying here.
-- The DELETE finds the locked rows by ctid (a TID scan): joined on the key, the planner
-- hashed the whole table for every batch up to a few million rows (bench: fences workload).
-- A batch starts at the previous one's last expires_at (after): the index entries of the
-- rows deleted before it (dead until vacuumed) and of the rows kept are not read again.
WITH doomed AS (
    SELECT p.ctid
    FROM core.processed_jobs AS p
    WHERE p.expires_at <= coalesce(%(now)s::timestamptz, now())
      AND p.expires_at >= coalesce(%(after)s::timestamptz, '-infinity')
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
    DELETE FROM core.processed_jobs
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))
    RETURNING expires_at
)
SELECT count(*) AS deleted, max(expires_at) AS last FROM deleted

-- name: cleanup_due
SELECT EXISTS (SELECT 1 FROM core.processed_jobs
               WHERE expires_at <= coalesce(%(now)s::timestamptz, now())) AS due
