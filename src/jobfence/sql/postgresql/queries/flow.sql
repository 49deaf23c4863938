-- Flow control (jobfence.runtime.flow): broker admissions (slots, starts, holds), the keying
-- pass, back-offs and pauses of a key, pruning, and what operators read. The database
-- queue's limited claim itself is in jobs.sql (flow_claim).

-- name: flow_lock
-- Limited claims and admissions of one queue take turns, so two of them cannot both take
-- the last slot or the last start of a window (released at commit).
SELECT pg_advisory_xact_lock(hashtextextended('jobfence.flow ' || %(queue)s, 0))

-- name: flow_admit
-- A broker delivery's admission in one round trip (core.flow_admit, 0018_flow_admit.sql):
-- the queue's flow lock, the key's state, and when it has room a slot and a start.
SELECT paused, backoff_for, slots, slot_free_in, starts, start_free_in, counted_at AS now,
       admitted, slot
FROM core.flow_admit(%(queue)s, %(key)s, %(job_id)s, %(holder)s, %(lease)s::float8,
                     %(concurrency)s::int, %(count)s::int, %(per)s::float8)

-- name: flow_release_slot
DELETE FROM core.flow_slots WHERE id = %(id)s

-- name: flow_extend_slots
UPDATE core.flow_slots SET expires_at = clock_timestamp() + make_interval(secs => %(lease)s)
WHERE id = ANY(%(ids)s::bigint[]) AND expires_at > clock_timestamp()

-- name: flow_record_starts
-- A start per key given (a key twice: two starts) at `at`, the database clock's time when
-- the admission or the claim counted the window; recorded in its transaction, under
-- flow_lock (so the next one's `at` is later).
INSERT INTO core.flow_starts (queue, key, started_at)
SELECT %(queue)s, k.key, %(at)s::timestamptz FROM unnest(%(keys)s::text[]) AS k(key)

-- name: flow_hold
-- Hold a key: a back-off until now + seconds (a longer one already there stays), or a pause
-- (seconds NULL) until resumed. Returns how long the key is held from now (NULL: paused).
INSERT INTO core.flow_holds AS h (queue, key, kind, until, reason, held_by)
VALUES (%(queue)s, %(key)s, %(kind)s,
        clock_timestamp() + make_interval(secs => %(seconds)s::float8), %(reason)s, %(held_by)s)
ON CONFLICT (queue, key, kind) DO UPDATE SET
    until = greatest(h.until, excluded.until),
    reason = CASE WHEN excluded.until IS NULL OR h.until IS NULL OR excluded.until >= h.until
                  THEN excluded.reason ELSE h.reason END,
    held_by = CASE WHEN excluded.until IS NULL OR h.until IS NULL OR excluded.until >= h.until
                   THEN excluded.held_by ELSE h.held_by END,
    held_at = clock_timestamp()
RETURNING extract(epoch FROM h.until - clock_timestamp())::float8 AS held_for

-- name: flow_unhold
DELETE FROM core.flow_holds WHERE queue = %(queue)s AND key = %(key)s AND kind = %(kind)s
RETURNING key

-- name: flow_unkeyed
-- The keying pass: available jobs of a limited queue enqueued without their key.
SELECT id, payload FROM core.jobs
WHERE queue = %(queue)s AND state = 'available' AND flow_key IS NULL
ORDER BY id
LIMIT %(limit)s

-- name: flow_set_keys
UPDATE core.jobs AS j SET flow_key = k.key
FROM unnest(%(ids)s::bigint[], %(keys)s::text[]) AS k(id, key)
WHERE j.id = k.id AND j.flow_key IS NULL

-- name: flow_prune_starts
-- Forget starts older than the queue's rate period.
DELETE FROM core.flow_starts
WHERE queue = %(queue)s AND started_at < clock_timestamp() - make_interval(secs => %(per)s)

-- name: flow_prune_slots
DELETE FROM core.flow_slots WHERE queue = %(queue)s AND expires_at < clock_timestamp()

-- name: flow_prune_holds
DELETE FROM core.flow_holds
WHERE queue = %(queue)s AND kind = 'backoff' AND until < clock_timestamp()

-- name: flow_status_keys
-- Per key of a queue: jobs running (live leases) or slots held, jobs waiting, starts in the
-- rate's window; the busiest keys first.
WITH clock AS (SELECT clock_timestamp() AS now),
j AS (
    SELECT flow_key AS key,
           count(*) FILTER (WHERE state = 'running' AND lease_expires_at > c.now) AS running,
           count(*) FILTER (WHERE state = 'available') AS waiting
    FROM core.jobs, clock AS c
    WHERE queue = %(queue)s AND flow_key IS NOT NULL
    GROUP BY flow_key
),
s AS (
    SELECT key, count(*) AS slots FROM core.flow_slots, clock AS c
    WHERE queue = %(queue)s AND expires_at > c.now GROUP BY key
),
r AS (
    SELECT key, count(*) AS starts FROM core.flow_starts, clock AS c
    WHERE queue = %(queue)s AND started_at > c.now - make_interval(secs => %(per)s)
    GROUP BY key
),
k AS (SELECT key FROM j UNION SELECT key FROM s UNION SELECT key FROM r)
SELECT k.key, coalesce(j.running, 0) + coalesce(s.slots, 0) AS in_use,
       coalesce(j.waiting, 0) AS waiting, coalesce(r.starts, 0) AS starts
FROM k LEFT JOIN j ON j.key = k.key LEFT JOIN s ON s.key = k.key LEFT JOIN r ON r.key = k.key
ORDER BY in_use DESC, waiting DESC, k.key
LIMIT %(limit)s

-- name: flow_status_unkeyed
SELECT count(*) AS jobs FROM core.jobs
WHERE queue = %(queue)s AND state = 'available' AND flow_key IS NULL

-- name: flow_status_holds
SELECT key, kind, extract(epoch FROM until - clock_timestamp())::float8 AS held_for, reason,
       held_by, extract(epoch FROM held_at)::float8 AS held_at
FROM core.flow_holds
WHERE queue = %(queue)s AND (until IS NULL OR until > clock_timestamp())
ORDER BY key, kind
