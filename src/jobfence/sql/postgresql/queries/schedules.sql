-- Periodic jobs (jobfence.runtime.scheduler, jobfence.review.schedules): the schedules'
-- definitions, the tick each is at, and what the doors show.

-- name: schedule_define
-- A scheduler declaring this definition (when it starts, and every DECLARE_EVERY while it
-- runs): the row is made (counting from now), or its definition replaced when it changed;
-- the tick it is at stays; defined_at says a running scheduler still declares it.
INSERT INTO core.schedules (name, cron, tz, queue, consumer, missed)
VALUES (%(name)s, %(cron)s, %(tz)s, %(queue)s, %(consumer)s, %(missed)s)
ON CONFLICT (name) DO UPDATE SET
    cron = EXCLUDED.cron, tz = EXCLUDED.tz, queue = EXCLUDED.queue,
    consumer = EXCLUDED.consumer, missed = EXCLUDED.missed, defined_at = now()

-- name: schedules_claim
-- A round's due schedules, locked until the enqueue of their ticks commits. A row another
-- scheduler holds is skipped, not waited for: two schedulers split a round's schedules, and
-- the one skipping a row reads where the other moved it in its next round.
SELECT name, last_slot, created_at, now() AS now FROM core.schedules
WHERE name = ANY(%(names)s::text[])
ORDER BY name
FOR UPDATE SKIP LOCKED

-- name: schedules_present
-- Which of these schedules have a row (a name missing from a claim: held, or deleted).
SELECT name FROM core.schedules WHERE name = ANY(%(names)s::text[])

-- name: schedules_advance
-- Every schedule of a round's transaction moved at once: names[i] to slots[i], and its last
-- tick enqueued is job_ids[i] (NULL: the policy dropped its ticks, the last one stays).
UPDATE core.schedules s SET
    last_slot = m.slot,
    last_job_id = coalesce(m.job_id, s.last_job_id),
    last_enqueued_at = CASE WHEN m.job_id IS NULL THEN s.last_enqueued_at ELSE now() END,
    defined_at = now()
FROM unnest(%(names)s::text[], %(slots)s::timestamptz[], %(job_ids)s::text[])
    AS m(name, slot, job_id)
WHERE s.name = m.name

-- name: schedules_prune
-- Rows of schedules no running scheduler has declared for `seconds` seconds: deleted, their names
-- returned.
DELETE FROM core.schedules WHERE defined_at < now() - make_interval(secs => %(seconds)s)
RETURNING name

-- name: schedules_list
-- Every schedule with what became of its last tick enqueued: in the queue (the newest row
-- with its job_id in its queue), processed (its fence, while kept), or a dead letter.
SELECT s.name, s.cron, s.tz, s.queue, s.consumer, s.missed, s.created_at, s.defined_at,
       s.last_slot, s.last_job_id, s.last_enqueued_at, now() AS now,
       (SELECT j.state || ':' || j.attempts FROM core.jobs j
         WHERE j.queue = s.queue AND j.job_id = s.last_job_id ORDER BY j.id DESC LIMIT 1)
           AS queued,
       (SELECT max(p.processed_at) FROM core.processed_jobs p
         WHERE p.consumer = s.consumer AND p.job_id = s.last_job_id) AS processed_at,
       (SELECT max(d.id) FROM core.dead_letters d
         WHERE d.job_id = s.last_job_id AND d.consumer = s.consumer) AS dead_letter_id
FROM core.schedules s
ORDER BY s.name
