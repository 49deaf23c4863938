-- 0008: the console's sign-in sessions live in the database (issue 23): see the PostgreSQL
-- migration 0011. And audit rows may say `via console`: SQLite cannot change a CHECK in
-- place, so the audit log is copied aside, made again with the new CHECK (the same text as
-- the declared schema), refilled with the same ids, and its index and triggers made again.
CREATE TABLE core_console_sessions (
    id_hash       TEXT PRIMARY KEY CHECK (length(id_hash) = 64 AND id_hash NOT GLOB '*[^0-9a-f]*'),
    token_hash    TEXT NOT NULL,
    csrf          TEXT NOT NULL CHECK (length(csrf) >= 32),
    created_at    REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    expires_at    REAL NOT NULL,
    seen_at       REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    idle_seconds  REAL NOT NULL CHECK (idle_seconds > 0),
    revoked_at    REAL,
    flash         TEXT NOT NULL DEFAULT '[]' CHECK (json_type(flash) = 'array')
) WITHOUT ROWID;
CREATE INDEX core_console_sessions_expires_idx ON core_console_sessions (expires_at);

CREATE TABLE core_audit_log_0008 AS SELECT * FROM core_audit_log;
DROP TABLE core_audit_log;
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
INSERT INTO core_audit_log SELECT * FROM core_audit_log_0008 ORDER BY id;
DROP TABLE core_audit_log_0008;
