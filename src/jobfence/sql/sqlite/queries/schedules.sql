-- Periodic jobs (jobfence.runtime.scheduler, jobfence.review.schedules): see the PostgreSQL
-- file. SQLite's one writer serialises schedulers: BEGIN IMMEDIATE holds the write lock from
-- schedules_claim on.

-- name: schedule_define
INSERT INTO core_schedules (name, cron, tz, queue, consumer, missed)
VALUES (:name, :cron, :tz, :queue, :consumer, :missed)
ON CONFLICT (name) DO UPDATE SET
    cron = excluded.cron, tz = excluded.tz, queue = excluded.queue,
    consumer = excluded.consumer, missed = excluded.missed, defined_at = {NOW}

-- name: schedules_claim
SELECT name, last_slot, created_at, {NOW} AS now FROM core_schedules
WHERE name IN (SELECT value FROM json_each(:names))
ORDER BY name

-- name: schedules_present
SELECT name FROM core_schedules WHERE name IN (SELECT value FROM json_each(:names))

-- name: schedules_advance
UPDATE core_schedules SET
    last_slot = m.slot,
    last_job_id = coalesce(m.job_id, core_schedules.last_job_id),
    last_enqueued_at = CASE WHEN m.job_id IS NULL THEN core_schedules.last_enqueued_at
                            ELSE {NOW} END,
    defined_at = {NOW}
FROM (SELECT n.value AS name, s.value AS slot, j.value AS job_id
      FROM json_each(:names) AS n
      JOIN json_each(:slots) AS s ON s.key = n.key
      JOIN json_each(:job_ids) AS j ON j.key = n.key) AS m
WHERE core_schedules.name = m.name

-- name: schedules_prune
DELETE FROM core_schedules WHERE defined_at < {NOW} - :seconds
RETURNING name

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
