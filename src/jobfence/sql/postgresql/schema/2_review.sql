-- Declared schema for dead-letter review, audit, replays, fence cleanup, alerts and ops
-- tokens (on top of schema/1_core.sql). migrations/0002_review_alerts_ops.sql and
-- 0005_audit_transitions_keep_decided.sql produce exactly this.

-- Review of a dead letter: pending_review → replayed | discarded, final once decided.
ALTER TABLE core.dead_letters
    ADD COLUMN partner       text CHECK (partner <> '' AND length(partner) <= 200),
    ADD COLUMN previous_id   bigint REFERENCES core.dead_letters (id),
    ADD COLUMN reviewed_at   timestamptz,
    ADD COLUMN reviewed_by   text CHECK (reviewed_by ~ '[^[:space:]]' AND length(reviewed_by) <= 200),
    ADD COLUMN review_reason text CHECK (length(review_reason) <= 4000),
    ADD CONSTRAINT dead_letters_review_recorded CHECK (
        (status = 'pending_review') = (reviewed_at IS NULL AND reviewed_by IS NULL)),
    ADD CONSTRAINT dead_letters_discard_has_reason CHECK (
        status <> 'discarded' OR coalesce(review_reason ~ '[^[:space:]]', false));
CREATE INDEX dead_letters_job_idx ON core.dead_letters (job_id);
CREATE INDEX dead_letters_partner_idx ON core.dead_letters (partner, id) WHERE partner IS NOT NULL;

-- A decided letter is evidence: it never changes again (not even back to pending_review).
CREATE FUNCTION core.dead_letters_review_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'dead letter % is already %; a review decision is final', OLD.id, OLD.status
        USING ERRCODE = 'check_violation';
END;
$$;
CREATE TRIGGER dead_letters_review_final BEFORE UPDATE ON core.dead_letters
    FOR EACH ROW WHEN (OLD.status <> 'pending_review')
    EXECUTE FUNCTION core.dead_letters_review_final();

-- …and it is never deleted (no role can; TRUNCATE neither). Only the owner can switch this
-- off (ALTER TABLE … DISABLE TRIGGER), or a superuser; see docs/dead-letters.md.
CREATE FUNCTION core.dead_letters_keep_decided() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'core.dead_letters cannot be truncated: decided letters are evidence'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RAISE EXCEPTION 'dead letter % is %: a decided letter is evidence and cannot be deleted',
        OLD.id, OLD.status
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER dead_letters_keep_decided BEFORE DELETE ON core.dead_letters
    FOR EACH ROW WHEN (OLD.status <> 'pending_review')
    EXECUTE FUNCTION core.dead_letters_keep_decided();
CREATE TRIGGER dead_letters_no_truncate BEFORE TRUNCATE ON core.dead_letters
    FOR EACH STATEMENT EXECUTE FUNCTION core.dead_letters_keep_decided();

-- Who did what, when and why, and the transition it made (old_state → new_state; NULL
-- where there is none, e.g. before a thing existed): append-only.
CREATE TABLE core.audit_log (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT now(),
    actor           text NOT NULL CHECK (actor ~ '[^[:space:]]' AND length(actor) <= 200),
    via             text NOT NULL CHECK (via IN ('cli', 'api', 'library', 'console')),
    action          text NOT NULL CHECK (action ~ '^[a-z][a-z0-9_.]*$'),
    partner         text,
    dead_letter_id  bigint,
    replay_id       bigint,
    reason          text,
    details         jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(details) = 'object'),
    old_state       text CHECK (old_state <> '' AND length(old_state) <= 100),
    new_state       text CHECK (new_state <> '' AND length(new_state) <= 100)
);
CREATE INDEX audit_log_dead_letter_idx ON core.audit_log (dead_letter_id)
    WHERE dead_letter_id IS NOT NULL;
CREATE FUNCTION core.audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'core.audit_log is append-only' USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON core.audit_log
    FOR EACH ROW EXECUTE FUNCTION core.audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON core.audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION core.audit_log_append_only();

-- Bulk replay: a previewed, fixed snapshot of letter ids, then run (resumably) item by item.
CREATE TABLE core.replays (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at    timestamptz NOT NULL DEFAULT now(),
    created_by    text NOT NULL,
    partner       text,
    filter        jsonb NOT NULL CHECK (jsonb_typeof(filter) = 'object'),
    total         integer NOT NULL CHECK (total >= 0),
    state         text NOT NULL DEFAULT 'previewed'
                      CHECK (state IN ('previewed', 'running', 'done')),
    expires_at    timestamptz NOT NULL,
    confirmed_by  text,
    confirmed_at  timestamptz,
    runner        text,
    runner_until  timestamptz,
    finished_at   timestamptz,
    CHECK ((state = 'previewed') = (confirmed_at IS NULL))
);
CREATE TABLE core.replay_items (
    replay_id       bigint NOT NULL REFERENCES core.replays (id),
    dead_letter_id  bigint NOT NULL REFERENCES core.dead_letters (id),
    outcome         text CHECK (outcome IN ('published', 'already_applied', 'not_pending',
                                            'truncated')),
    detail          text,
    done_at         timestamptz,
    PRIMARY KEY (replay_id, dead_letter_id),
    CHECK ((outcome IS NULL) = (done_at IS NULL))
);
CREATE INDEX replay_items_todo_idx ON core.replay_items (replay_id, dead_letter_id)
    WHERE outcome IS NULL;

-- Fence cleanup (SPEC T2): a fence of a job still retrying is kept; this finds them fast.
CREATE INDEX jobs_retrying_idx ON core.jobs (job_id) WHERE history <> '[]'::jsonb;

-- One holder at a time for background duties (the fence cleaner, the alert dispatcher).
CREATE TABLE core.leases (
    name         text PRIMARY KEY,
    holder       text NOT NULL,
    acquired_at  timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);

-- Alerts (SPEC D4). A dead letter's alert event is written by a trigger in the same
-- transaction (never lost, never an HTTP call on the dead-letter path); the dispatcher groups
-- events into alerts and delivers each alert to each sink with retries.
CREATE TABLE core.alert_events (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at      timestamptz NOT NULL DEFAULT now(),
    source          text NOT NULL,
    queue           text NOT NULL,
    category        text NOT NULL,
    fingerprint     text,
    title           text,
    details         jsonb CHECK (jsonb_typeof(details) = 'object'),
    dead_letter_id  bigint
);
CREATE FUNCTION core.dead_letters_alert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO core.alert_events (created_at, source, queue, category, dead_letter_id)
    VALUES (NEW.failed_at, 'dead_letter', NEW.queue, NEW.error_category, NEW.id);
    RETURN NULL;
END;
$$;
-- (a letter written already decided — a cancelled job, see jobfence.review.jobctl — raises none)
CREATE TRIGGER dead_letters_alert AFTER INSERT ON core.dead_letters
    FOR EACH ROW WHEN (NEW.status = 'pending_review')
    EXECUTE FUNCTION core.dead_letters_alert();

CREATE TABLE core.alerts (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at    timestamptz NOT NULL DEFAULT now(),
    kind          text NOT NULL CHECK (kind IN ('first', 'summary')),
    source        text NOT NULL,
    queue         text NOT NULL,
    category      text NOT NULL,
    fingerprint   text NOT NULL,
    title         text NOT NULL,
    details       jsonb NOT NULL CHECK (jsonb_typeof(details) = 'object'),
    count         integer NOT NULL CHECK (count >= 1),
    window_start  timestamptz NOT NULL,
    window_end    timestamptz NOT NULL,
    ready_at      timestamptz NOT NULL
);
CREATE TABLE core.alert_groups (
    source        text NOT NULL,
    queue         text NOT NULL,
    category      text NOT NULL,
    fingerprint   text NOT NULL,
    window_start  timestamptz NOT NULL,
    window_end    timestamptz NOT NULL,
    summary_id    bigint REFERENCES core.alerts (id),
    PRIMARY KEY (source, queue, category, fingerprint)
);
CREATE TABLE core.alert_deliveries (
    alert_id         bigint NOT NULL REFERENCES core.alerts (id),
    sink             text NOT NULL,
    attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  timestamptz NOT NULL,
    delivered_at     timestamptz,
    last_error       text,
    PRIMARY KEY (alert_id, sink)
);
CREATE INDEX alert_deliveries_due_idx ON core.alert_deliveries (next_attempt_at)
    WHERE delivered_at IS NULL;

-- Ops API bearer tokens (SPEC K3): only a hash is stored; the token is shown once.
CREATE TABLE core.ops_tokens (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL CHECK (name ~ '[^[:space:]]' AND length(name) <= 200),
    token_hash  text NOT NULL UNIQUE,
    role        text NOT NULL CHECK (role IN ('viewer', 'operator')),
    partner     text CHECK (partner <> '' AND length(partner) <= 200),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    revoked_at  timestamptz
);
CREATE UNIQUE INDEX ops_tokens_active_name_uq ON core.ops_tokens (name) WHERE revoked_at IS NULL;
