-- 0006: job control (issue 14): a job's partner, list indexes, paused queues; a letter
-- written already decided (a cancelled job) raises no alert.

-- The partner (tenant) of a job, read from its payload at enqueue (jobfence.jobs.partner_of).
-- Jobs enqueued before this migration have none (only unscoped operators see them).
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

-- A cancelled job becomes a dead letter that is discarded at once: no alert for it.
DROP TRIGGER core_dead_letters_alert;
CREATE TRIGGER core_dead_letters_alert AFTER INSERT ON core_dead_letters
WHEN NEW.status = 'pending_review'
BEGIN
    INSERT INTO core_alert_events (created_at, source, queue, category, dead_letter_id)
    VALUES (NEW.failed_at, 'dead_letter', NEW.queue, NEW.error_category, NEW.id);
END;
