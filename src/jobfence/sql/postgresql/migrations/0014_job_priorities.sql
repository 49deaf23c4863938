-- 0014: job priorities (issue 26 §3): 0 (the default) to 9, higher runs first. A claim takes
-- a queue's ready jobs by priority, then age, through jobs_priority_idx (one index range per
-- queue); every 10th claim round of a worker takes them by age alone through
-- jobs_available_idx, so a low priority is never starved (docs/flow-control.md). The outbox
-- keeps an event's priority for its job.
ALTER TABLE core.jobs ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CONSTRAINT jobs_priority_range CHECK (priority BETWEEN 0 AND 9);
CREATE INDEX jobs_priority_idx ON core.jobs (queue, priority DESC, run_at, id)
    WHERE state = 'available';
ALTER TABLE core.outbox ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CONSTRAINT outbox_priority_range CHECK (priority BETWEEN 0 AND 9);
