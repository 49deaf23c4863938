-- Declared schema for job priorities (issue 26 §3): migrations/0010_job_priorities.sql
-- produces exactly this. 0 (the default) to 9, higher runs first (docs/flow-control.md).
ALTER TABLE core_jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0
    CHECK (priority BETWEEN 0 AND 9);
CREATE INDEX core_jobs_priority_idx ON core_jobs (queue, priority DESC, run_at, id)
    WHERE state = 'available';
ALTER TABLE core_outbox ADD COLUMN priority INTEGER NOT NULL DEFAULT 0
    CHECK (priority BETWEEN 0 AND 9);
