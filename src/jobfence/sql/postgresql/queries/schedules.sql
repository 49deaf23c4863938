-- Periodic jobs (jobfence.runtime.scheduler, jobfence.review.schedules): the schedules'
-- definitions, the tick each is at, and what the doors show.

-- name: schedule_define
-- A scheduler starting with this definition: the row is made (counting from now), or its
-- definition replaced when it changed; the tick it is at stays.
INSERT INTO core.schedules (name, cron, tz, queue, consumer, missed)
VALUES (%(name)s, %(cron)s, %(tz)s, %(queue)s, %(consumer)s, %(missed)s)
ON CONFLICT (name) DO UPDATE SET
    cron = EXCLUDED.cron, tz = EXCLUDED.tz, queue = EXCLUDED.queue,
    consumer = EXCLUDED.consumer, missed = EXCLUDED.missed, defined_at = now()
WHERE (core.schedules.cron, core.schedules.tz, core.schedules.queue, core.schedules.consumer,
       core.schedules.missed)
      IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.tz, EXCLUDED.queue, EXCLUDED.consumer,
                        EXCLUDED.missed)

-- name: schedule_lock
-- The tick a schedule is at, locked until the enqueue of the next ones commits: a second
-- scheduler waits here, then reads the tick the first one moved it to.
SELECT last_slot, created_at, now() AS now FROM core.schedules
WHERE name = %(name)s FOR UPDATE

-- name: schedule_advance
UPDATE core.schedules SET
    last_slot = %(slot)s,
    last_job_id = coalesce(%(job_id)s, last_job_id),
    last_enqueued_at = CASE WHEN %(job_id)s::text IS NULL THEN last_enqueued_at ELSE now() END
WHERE name = %(name)s

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
