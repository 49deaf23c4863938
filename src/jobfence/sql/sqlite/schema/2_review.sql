-- Declared schema for dead-letter review, audit, replays, fence cleanup, alerts and ops
-- tokens (on top of schema/1_core.sql). migrations/0002_review_alerts_ops.sql and
-- 0005_audit_transitions_keep_decided.sql produce exactly this.

-- Review of a dead letter: pending_review → replayed | discarded, final once decided.
ALTER TABLE core_dead_letters ADD COLUMN partner TEXT
    CHECK (partner <> '' AND length(partner) <= 200);
ALTER TABLE core_dead_letters ADD COLUMN previous_id INTEGER REFERENCES core_dead_letters (id);
ALTER TABLE core_dead_letters ADD COLUMN reviewed_at REAL
    CHECK ((status = 'pending_review') = (reviewed_at IS NULL));
ALTER TABLE core_dead_letters ADD COLUMN reviewed_by TEXT
    CHECK ((status = 'pending_review') = (reviewed_by IS NULL)
           AND trim(reviewed_by, ' ' || char(9, 10, 11, 12, 13)) <> ''
           AND length(reviewed_by) <= 200);
ALTER TABLE core_dead_letters ADD COLUMN review_reason TEXT
    CHECK (length(review_reason) <= 4000
           AND (status <> 'discarded' OR (review_reason IS NOT NULL
                AND trim(review_reason, ' ' || char(9, 10, 11, 12, 13)) <> '')));
CREATE INDEX core_dead_letters_job_idx ON core_dead_letters (job_id);
CREATE INDEX core_dead_letters_partner_idx ON core_dead_letters (partner, id)
    WHERE partner IS NOT NULL;

-- A decided letter is evidence: it never changes again (not even back to pending_review).
CREATE TRIGGER core_dead_letters_review_final BEFORE UPDATE ON core_dead_letters
    WHEN OLD.status <> 'pending_review'
BEGIN
    SELECT RAISE(ABORT, 'a reviewed dead letter is final: its review decision cannot change');
END;

-- …and it is never deleted.
CREATE TRIGGER core_dead_letters_keep_decided BEFORE DELETE ON core_dead_letters
    WHEN OLD.status <> 'pending_review'
BEGIN
    SELECT RAISE(ABORT, 'a decided dead letter is evidence and cannot be deleted');
END;

-- Who did what, when and why: append-only.
CREATE TABLE core_audit_log (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    at              REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    actor           TEXT NOT NULL CHECK (trim(actor, ' ' || char(9, 10, 11, 12, 13)) <> ''
                                         AND length(actor) <= 200),
    via             TEXT NOT NULL CHECK (via IN ('cli', 'api', 'library', 'console')),
    action          TEXT NOT NULL CHECK (action <> '' AND action NOT GLOB '*[^a-z0-9_.]*'),
    partner         TEXT,
    dead_letter_id  INTEGER,
    replay_id       INTEGER,
    reason          TEXT,
    details         TEXT NOT NULL DEFAULT '{}' CHECK (json_type(details) = 'object')
);
-- The transition an action made (old_state → new_state), added by migration 0005.
ALTER TABLE core_audit_log ADD COLUMN old_state TEXT
    CHECK (old_state <> '' AND length(old_state) <= 100);
ALTER TABLE core_audit_log ADD COLUMN new_state TEXT
    CHECK (new_state <> '' AND length(new_state) <= 100);
CREATE INDEX core_audit_log_dead_letter_idx ON core_audit_log (dead_letter_id)
    WHERE dead_letter_id IS NOT NULL;
CREATE TRIGGER core_audit_log_no_update BEFORE UPDATE ON core_audit_log
BEGIN
    SELECT RAISE(ABORT, 'core_audit_log is append-only');
END;
CREATE TRIGGER core_audit_log_no_delete BEFORE DELETE ON core_audit_log
BEGIN
    SELECT RAISE(ABORT, 'core_audit_log is append-only');
END;

-- Bulk replay: a previewed, fixed snapshot of letter ids, then run (resumably) item by item.
CREATE TABLE core_replays (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at    REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    created_by    TEXT NOT NULL,
    partner       TEXT,
    filter        TEXT NOT NULL CHECK (json_type(filter) = 'object'),
    total         INTEGER NOT NULL CHECK (total >= 0),
    state         TEXT NOT NULL DEFAULT 'previewed'
                      CHECK (state IN ('previewed', 'running', 'done')),
    expires_at    REAL NOT NULL,
    confirmed_by  TEXT,
    confirmed_at  REAL,
    runner        TEXT,
    runner_until  REAL,
    finished_at   REAL,
    CHECK ((state = 'previewed') = (confirmed_at IS NULL))
);
CREATE TABLE core_replay_items (
    replay_id       INTEGER NOT NULL REFERENCES core_replays (id),
    dead_letter_id  INTEGER NOT NULL REFERENCES core_dead_letters (id),
    outcome         TEXT CHECK (outcome IN ('published', 'already_applied', 'not_pending',
                                            'truncated')),
    detail          TEXT,
    done_at         REAL,
    PRIMARY KEY (replay_id, dead_letter_id),
    CHECK ((outcome IS NULL) = (done_at IS NULL))
) WITHOUT ROWID;
CREATE INDEX core_replay_items_todo_idx ON core_replay_items (replay_id, dead_letter_id)
    WHERE outcome IS NULL;

-- Fence cleanup (SPEC T2): a fence of a job still retrying is kept; this finds them fast.
CREATE INDEX core_jobs_retrying_idx ON core_jobs (job_id) WHERE history <> '[]';

-- One holder at a time for background duties (the fence cleaner, the alert dispatcher).
CREATE TABLE core_leases (
    name         TEXT PRIMARY KEY,
    holder       TEXT NOT NULL,
    acquired_at  REAL NOT NULL,
    expires_at   REAL NOT NULL
) WITHOUT ROWID;

-- Alerts (SPEC D4). A dead letter's alert event is written by a trigger in the same
-- transaction (never lost, never an HTTP call on the dead-letter path); the dispatcher groups
-- events into alerts and delivers each alert to each sink with retries.
CREATE TABLE core_alert_events (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at      REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    source          TEXT NOT NULL,
    queue           TEXT NOT NULL,
    category        TEXT NOT NULL,
    fingerprint     TEXT,
    title           TEXT,
    details         TEXT CHECK (json_type(details) = 'object'),
    dead_letter_id  INTEGER
);
-- (a letter written already decided — a cancelled job, see jobfence.review.jobctl — raises none)
CREATE TRIGGER core_dead_letters_alert AFTER INSERT ON core_dead_letters
WHEN NEW.status = 'pending_review'
BEGIN
    INSERT INTO core_alert_events (created_at, source, queue, category, dead_letter_id)
    VALUES (NEW.failed_at, 'dead_letter', NEW.queue, NEW.error_category, NEW.id);
END;

CREATE TABLE core_alerts (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at    REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    kind          TEXT NOT NULL CHECK (kind IN ('first', 'summary')),
    source        TEXT NOT NULL,
    queue         TEXT NOT NULL,
    category      TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,
    title         TEXT NOT NULL,
    details       TEXT NOT NULL CHECK (json_type(details) = 'object'),
    count         INTEGER NOT NULL CHECK (count >= 1),
    window_start  REAL NOT NULL,
    window_end    REAL NOT NULL,
    ready_at      REAL NOT NULL
);
CREATE TABLE core_alert_groups (
    source        TEXT NOT NULL,
    queue         TEXT NOT NULL,
    category      TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,
    window_start  REAL NOT NULL,
    window_end    REAL NOT NULL,
    summary_id    INTEGER REFERENCES core_alerts (id),
    PRIMARY KEY (source, queue, category, fingerprint)
) WITHOUT ROWID;
CREATE TABLE core_alert_deliveries (
    alert_id         INTEGER NOT NULL REFERENCES core_alerts (id),
    sink             TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  REAL NOT NULL,
    delivered_at     REAL,
    last_error       TEXT,
    PRIMARY KEY (alert_id, sink)
) WITHOUT ROWID;
CREATE INDEX core_alert_deliveries_due_idx ON core_alert_deliveries (next_attempt_at)
    WHERE delivered_at IS NULL;

-- Ops API bearer tokens (SPEC K3): only a hash is stored; the token is shown once.
CREATE TABLE core_ops_tokens (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL CHECK (trim(name, ' ' || char(9, 10, 11, 12, 13)) <> ''
                                     AND length(name) <= 200),
    token_hash  TEXT NOT NULL UNIQUE,
    role        TEXT NOT NULL CHECK (role IN ('viewer', 'operator')),
    partner     TEXT CHECK (partner <> '' AND length(partner) <= 200),
    created_at  REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    expires_at  REAL,
    revoked_at  REAL
);
CREATE UNIQUE INDEX core_ops_tokens_active_name_uq ON core_ops_tokens (name)
    WHERE revoked_at IS NULL;
