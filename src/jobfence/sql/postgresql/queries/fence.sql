-- The fence (SPEC F, H5, T2): insert with the ack, group commit, the lent transaction, cleanup (jobfence.core.fence, jobfence.runtime.cleanup).

-- name: fence_and_ack
-- core.fence() keeps the key unique across the day partitions (9_fence_partitions.sql).
WITH acked AS (
    DELETE FROM core.jobs WHERE id = %(id)s AND lease_token = %(token)s RETURNING id
)
SELECT count(*) AS acked,
       count(*) FILTER (WHERE core.fence(%(consumer)s, %(job_id)s, %(ttl)s)) AS fenced
FROM acked

-- name: fence
SELECT 1 AS fenced WHERE core.fence(%(consumer)s, %(job_id)s, %(ttl)s)

-- name: batch_fence_and_ack
-- Group commit: ack a batch of claimed jobs and fence them, in one statement at the start of
-- one transaction. core.fence_many() locks the keys in one order, so that concurrent batches
-- cannot deadlock on each other's fences. A job_id twice in the batch is fenced once.
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(consumers)s::text[],
                         %(job_ids)s::text[]) AS i(id, token, consumer, job_id)
), acked AS (
    DELETE FROM core.jobs AS j USING input AS i
    WHERE j.id = i.id AND j.lease_token = i.token
    RETURNING j.id
), todo AS MATERIALIZED (
    SELECT i.consumer, i.job_id FROM input AS i JOIN acked AS a ON a.id = i.id
), fenced AS MATERIALIZED (
    SELECT f.fenced_consumer AS consumer, f.fenced_job_id AS job_id
    FROM core.fence_many(ARRAY(SELECT consumer FROM todo), ARRAY(SELECT job_id FROM todo),
                         %(ttl)s) AS f
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

-- name: fence_partitions_add
-- The day partitions from first to last (UTC days) that do not exist yet (cleanup.py).
SELECT core.fence_partitions_add(%(first)s::date, %(last)s::date) AS made

-- name: fence_partitions_detach
-- Every day partition that expired min_age ago, detached (the fences cleanup keeps moved out
-- first), one row each; dropped by fence_partitions_purge in the next transaction.
SELECT detached, fences, kept
FROM core.fence_partitions_detach(coalesce(%(now)s::timestamptz, now()), %(min_age)s)

-- name: fence_partitions_purge
-- The detached days dropped (their files go at this transaction's commit).
SELECT core.fence_partitions_purge() AS dropped

-- name: cleanup_fences
-- The default partition's expired fences (the day partitions go whole: fence_partitions_detach),
-- oldest first, except: younger than min_age (a retry window), of a job_id
-- with a letter pending review or replayed within min_age, or of a job still retrying here.
-- The DELETE finds the locked rows by ctid (a TID scan; ctid is unique within one partition):
-- joined on the key, the planner hashed the whole table for every batch up to a few million
-- rows (bench: fences workload).
-- A batch starts at the previous one's last expires_at (after): the index entries of the
-- rows deleted before it (dead until vacuumed) and of the rows kept are not read again.
WITH doomed AS (
    SELECT p.ctid
    FROM core.processed_jobs_default AS p
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
    DELETE FROM core.processed_jobs_default
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))
    RETURNING expires_at
)
SELECT count(*) AS deleted, max(expires_at) AS last FROM deleted

-- name: cleanup_due
SELECT EXISTS (SELECT 1 FROM core.processed_jobs_default
               WHERE expires_at <= coalesce(%(now)s::timestamptz, now()))
       OR EXISTS (SELECT 1 FROM core.fence_partitions() AS p
                  WHERE NOT p.is_default
                    AND p.upper_bound <= coalesce(%(now)s::timestamptz, now())
                                         - make_interval(secs => %(min_age)s))
       OR EXISTS (SELECT 1 FROM core.fence_partitions_detached()) AS due

-- name: fence_find
-- The fence rows of one job_id among the given consumers (a job looked up by its job_id
-- that is no longer queued: finished, and when). One index probe per consumer and day.
SELECT consumer, processed_at, expires_at FROM core.processed_jobs
WHERE consumer = ANY(%(consumers)s) AND job_id = %(job_id)s
ORDER BY processed_at, consumer
