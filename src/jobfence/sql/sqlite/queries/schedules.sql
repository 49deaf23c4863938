-- Periodic jobs (jobfence.runtime.scheduler, jobfence.review.schedules): see the PostgreSQL
-- file. SQLite's one writer serialises schedulers: BEGIN IMMEDIATE holds the write lock from
-- schedule_lock on.

-- name: schedule_define
INSERT INTO core_schedules (name, cron, tz, queue, consumer, missed)
VALUES (:name, :cron, :tz, :queue, :consumer, :missed)
ON CONFLICT (name) DO UPDATE SET
    cron = excluded.cron, tz = excluded.tz, queue = excluded.queue,
    consumer = excluded.consumer, missed = excluded.missed, defined_at = {NOW}
WHERE (core_schedules.cron, core_schedules.tz, core_schedules.queue, core_schedules.consumer,
       core_schedules.missed)
      IS NOT (excluded.cron, excluded.tz, excluded.queue, excluded.consumer, excluded.missed)

-- name: schedule_lock
SELECT last_slot, created_at, {NOW} AS now FROM core_schedules WHERE name = :name

-- name: schedule_advance
UPDATE core_schedules SET
    last_slot = :slot,
    last_job_id = coalesce(:job_id, last_job_id),
    last_enqueued_at = CASE WHEN :job_id IS NULL THEN last_enqueued_at ELSE {NOW} END
WHERE name = :name

-- name: schedules_list
SELECT s.name, s.cron, s.tz, s.queue, s.consumer, s.missed, s.created_at, s.defined_at,
       s.last_slot, s.last_job_id, s.last_enqueued_at, {NOW} AS now,
       (SELECT j.state || ':' || j.attempts FROM core_jobs j
         WHERE j.queue = s.queue AND j.job_id = s.last_job_id ORDER BY j.id DESC LIMIT 1)
           AS queued,
       (SELECT max(p.processed_at) FROM core_processed_jobs p
         WHERE p.consumer = s.consumer AND p.job_id = s.last_job_id) AS processed_at,
       (SELECT max(d.id) FROM core_dead_letters d
         WHERE d.job_id = s.last_job_id AND d.consumer = s.consumer) AS dead_letter_id
FROM core_schedules s
ORDER BY s.name
