-- 0005: audit rows record the transition they made; decided dead letters cannot be deleted.
-- See the PostgreSQL migration for the rules. (SQLite has no roles: whoever can write the
-- file can drop a trigger; this guards against mistakes, not against the file's owner.)
ALTER TABLE core_audit_log ADD COLUMN old_state TEXT
    CHECK (old_state <> '' AND length(old_state) <= 100);
ALTER TABLE core_audit_log ADD COLUMN new_state TEXT
    CHECK (new_state <> '' AND length(new_state) <= 100);

CREATE TRIGGER core_dead_letters_keep_decided BEFORE DELETE ON core_dead_letters
    WHEN OLD.status <> 'pending_review'
BEGIN
    SELECT RAISE(ABORT, 'a decided dead letter is evidence and cannot be deleted');
END;
