-- Flow control (jobfence.runtime.flow): broker admissions (slots, starts, holds), the keying
-- pass, back-offs and pauses of a key, pruning, and what operators read. The database
-- queue's limited claim itself is in jobs.sql (flow_claim). SQLite's one writer serialises
-- admissions and claims (PostgreSQL takes flow_lock).

-- name: flow_admit_state
-- One key's state as an admission sees it, times as seconds from now.
SELECT
    (SELECT count(*) > 0 FROM core_flow_holds AS h
     WHERE h.queue = :queue AND h.key = :key AND h.kind = 'pause') AS paused,
    (SELECT max(h.until) - {NOW} FROM core_flow_holds AS h
     WHERE h.queue = :queue AND h.key = :key AND h.kind = 'backoff'
       AND h.until > {NOW}) AS backoff_for,
    (SELECT count(*) FROM core_flow_slots AS s
     WHERE s.queue = :queue AND s.key = :key AND s.expires_at > {NOW}) AS slots,
    (SELECT min(s.expires_at) - {NOW} FROM core_flow_slots AS s
     WHERE s.queue = :queue AND s.key = :key AND s.expires_at > {NOW}) AS slot_free_in,
    (SELECT count(*) FROM core_flow_starts AS f
     WHERE f.queue = :queue AND f.key = :key AND f.started_at > {NOW} - :per) AS starts,
    (SELECT min(f.started_at) + :per - {NOW} FROM core_flow_starts AS f
     WHERE f.queue = :queue AND f.key = :key AND f.started_at > {NOW} - :per) AS start_free_in,
    {NOW} AS now

-- name: flow_take_slot
INSERT INTO core_flow_slots (queue, key, job_id, holder, taken_at, expires_at)
VALUES (:queue, :key, :job_id, :holder, {NOW}, {NOW} + :lease)
RETURNING id

-- name: flow_release_slot
DELETE FROM core_flow_slots WHERE id = :id

-- name: flow_extend_slots
UPDATE core_flow_slots SET expires_at = {NOW} + :lease
WHERE id IN (SELECT value FROM json_each(:ids)) AND expires_at > {NOW}

-- name: flow_record_starts
-- A start per key given (a key twice: two starts) at `at`, the database clock's time when
-- the admission or the claim counted the window; recorded in its transaction (SQLite's one
-- writer: the next one's `at` is later).
INSERT INTO core_flow_starts (queue, key, started_at)
SELECT :queue, k.value, :at FROM json_each(:keys) AS k

-- name: flow_hold
-- Hold a key: a back-off until now + seconds (a longer one already there stays), or a pause
-- (seconds NULL) until resumed. Returns how long the key is held from now (NULL: paused).
INSERT INTO core_flow_holds (queue, key, kind, until, reason, held_by, held_at)
VALUES (:queue, :key, :kind, {NOW} + :seconds, :reason, :held_by, {NOW})
ON CONFLICT (queue, key, kind) DO UPDATE SET
    until = max(until, excluded.until),
    reason = CASE WHEN excluded.until IS NULL OR until IS NULL OR excluded.until >= until
                  THEN excluded.reason ELSE reason END,
    held_by = CASE WHEN excluded.until IS NULL OR until IS NULL OR excluded.until >= until
                   THEN excluded.held_by ELSE held_by END,
    held_at = excluded.held_at
RETURNING until - {NOW} AS held_for

-- name: flow_unhold
DELETE FROM core_flow_holds WHERE queue = :queue AND key = :key AND kind = :kind
RETURNING key

-- name: flow_unkeyed
-- The keying pass: available jobs of a limited queue enqueued without their key.
SELECT id, payload FROM core_jobs
WHERE queue = :queue AND state = 'available' AND flow_key IS NULL
ORDER BY id
LIMIT :limit

-- name: flow_set_keys
UPDATE core_jobs SET flow_key = json_extract(k.value, '$[1]')
FROM json_each(:pairs) AS k
WHERE core_jobs.id = json_extract(k.value, '$[0]') AND core_jobs.flow_key IS NULL

-- name: flow_prune_starts
-- Forget starts older than the queue's rate period.
DELETE FROM core_flow_starts WHERE queue = :queue AND started_at < {NOW} - :per

-- name: flow_prune_slots
DELETE FROM core_flow_slots WHERE queue = :queue AND expires_at < {NOW}

-- name: flow_prune_holds
DELETE FROM core_flow_holds WHERE queue = :queue AND kind = 'backoff' AND until < {NOW}

-- name: flow_status_keys
-- Per key of a queue: jobs running (live leases) or slots held, jobs waiting, starts in the
-- rate's window; the busiest keys first.
WITH j AS (
    SELECT flow_key AS key,
           sum(state = 'running' AND lease_expires_at > {NOW}) AS running,
           sum(state = 'available') AS waiting
    FROM core_jobs
    WHERE queue = :queue AND flow_key IS NOT NULL
    GROUP BY flow_key
),
s AS (
    SELECT key, count(*) AS slots FROM core_flow_slots
    WHERE queue = :queue AND expires_at > {NOW} GROUP BY key
),
r AS (
    SELECT key, count(*) AS starts FROM core_flow_starts
    WHERE queue = :queue AND started_at > {NOW} - :per
    GROUP BY key
),
k AS (SELECT key FROM j UNION SELECT key FROM s UNION SELECT key FROM r)
SELECT k.key, coalesce(j.running, 0) + coalesce(s.slots, 0) AS in_use,
       coalesce(j.waiting, 0) AS waiting, coalesce(r.starts, 0) AS starts
FROM k LEFT JOIN j ON j.key = k.key LEFT JOIN s ON s.key = k.key LEFT JOIN r ON r.key = k.key
ORDER BY in_use DESC, waiting DESC, k.key
LIMIT :limit

-- name: flow_status_unkeyed
SELECT count(*) AS jobs FROM core_jobs
WHERE queue = :queue AND state = 'available' AND flow_key IS NULL

-- name: flow_status_holds
SELECT key, kind, until - {NOW} AS held_for, reason, held_by, held_at
FROM core_flow_holds
WHERE queue = :queue AND (until IS NULL OR until > {NOW})
ORDER BY key, kind
