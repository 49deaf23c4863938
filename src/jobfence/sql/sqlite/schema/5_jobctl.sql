-- Declared schema for job control (issue 14; on top of 1_core.sql and 2_review.sql):
-- migrations/0006_job_control.sql produces exactly this (with the alert trigger's WHEN in
-- 2_review.sql).

-- The partner (tenant) of a job, read from its payload at enqueue (jobfence.core.jobs.partner_of).
ALTER TABLE core_jobs ADD COLUMN partner TEXT CHECK (partner <> '' AND length(partner) <= 200);
CREATE INDEX core_jobs_job_id_idx ON core_jobs (job_id);
CREATE INDEX core_jobs_correlation_idx ON core_jobs (correlation_id)
    WHERE correlation_id IS NOT NULL;
CREATE INDEX core_jobs_partner_idx ON core_jobs (partner, id) WHERE partner IS NOT NULL;

-- A paused queue: workers claim nothing from it until it is resumed (the claim skips it).
CREATE TABLE core_queue_pauses (
    queue      TEXT PRIMARY KEY CHECK (queue <> '' AND length(queue) <= 200),
    paused_at  REAL NOT NULL,
    paused_by  TEXT NOT NULL CHECK (trim(paused_by) <> '' AND length(paused_by) <= 200),
    reason     TEXT CHECK (length(reason) <= 4000)
) WITHOUT ROWID;
