-- Declared schema for job control (issue 14; on top of 1_core.sql and 2_review.sql):
-- migrations/0006_job_control.sql produces exactly this (with the alert trigger's WHEN in
-- 2_review.sql).

-- The partner (tenant) of a job, read from its payload at enqueue (jobfence.core.jobs.partner_of).
ALTER TABLE core.jobs
    ADD COLUMN partner text CHECK (partner <> '' AND length(partner) <= 200);
CREATE INDEX jobs_job_id_idx ON core.jobs (job_id);
CREATE INDEX jobs_correlation_idx ON core.jobs (correlation_id) WHERE correlation_id IS NOT NULL;
CREATE INDEX jobs_partner_idx ON core.jobs (partner, id) WHERE partner IS NOT NULL;

-- A paused queue: workers claim nothing from it until it is resumed (the claim skips it).
CREATE TABLE core.queue_pauses (
    queue      text PRIMARY KEY CHECK (queue <> '' AND length(queue) <= 200),
    paused_at  timestamptz NOT NULL DEFAULT now(),
    paused_by  text NOT NULL CHECK (paused_by ~ '[^[:space:]]' AND length(paused_by) <= 200),
    reason     text CHECK (length(reason) <= 4000)
);
