-- 0010: job priorities (issue 26 §3): 0 (the default) to 9, higher runs first. A claim takes
-- ready jobs by priority, then age, through core_jobs_priority_idx; every 10th claim round
-- of a worker takes them by age alone, so a low priority is never starved
-- (docs/flow-control.md). The outbox keeps an event's priority for its job.
ALTER TABLE core_jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0
    CHECK (priority BETWEEN 0 AND 9);
CREATE INDEX core_jobs_priority_idx ON core_jobs (queue, priority DESC, run_at, id)
    WHERE state = 'available';
ALTER TABLE core_outbox ADD COLUMN priority INTEGER NOT NULL DEFAULT 0
    CHECK (priority BETWEEN 0 AND 9);
