-- 0006: job control (issue 14): a job's partner, list indexes, paused queues; a letter
-- written already decided (a cancelled job) raises no alert.

-- The partner (tenant) of a job, read from its payload at enqueue like a dead letter's
-- (jobfence.jobs.partner_of), so that a partner-scoped operator sees only its own jobs.
-- Jobs enqueued before this migration have none (only unscoped operators see them).
ALTER TABLE core.jobs
    ADD COLUMN partner text CHECK (partner <> '' AND length(partner) <= 200);
-- Lists and look-ups of waiting jobs stay index scans at millions of rows.
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

-- A cancelled job becomes a dead letter that is discarded at once: no alert for it.
DROP TRIGGER dead_letters_alert ON core.dead_letters;
CREATE TRIGGER dead_letters_alert AFTER INSERT ON core.dead_letters
    FOR EACH ROW WHEN (NEW.status = 'pending_review')
    EXECUTE FUNCTION core.dead_letters_alert();
