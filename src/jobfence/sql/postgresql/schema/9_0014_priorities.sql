-- Declared schema for job priorities (issue 26 §3): migrations/0014_job_priorities.sql
-- produces exactly this. 0 (the default) to 9, higher runs first; the claim reads
-- jobs_priority_idx, and every 10th claim round of a worker jobs_available_idx (by age), so
-- a low priority is never starved (docs/flow-control.md).
ALTER TABLE core.jobs ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CONSTRAINT jobs_priority_range CHECK (priority BETWEEN 0 AND 9);
CREATE INDEX jobs_priority_idx ON core.jobs (queue, priority DESC, run_at, id)
    WHERE state = 'available';
ALTER TABLE core.outbox ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CONSTRAINT outbox_priority_range CHECK (priority BETWEEN 0 AND 9);
