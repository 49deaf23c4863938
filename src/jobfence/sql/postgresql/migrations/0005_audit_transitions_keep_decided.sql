-- 0005: audit rows record the transition they made; decided dead letters cannot be deleted.

-- Each audit row says which state the thing it touched was in and which it is in now
-- (a letter pending_review → replayed, a replay previewed → running, an outbox event
-- PUBLISH_FAILED_RETRY → PENDING…). Rows written before this migration have neither.
ALTER TABLE core.audit_log
    ADD COLUMN old_state text CHECK (old_state <> '' AND length(old_state) <= 100),
    ADD COLUMN new_state text CHECK (new_state <> '' AND length(new_state) <= 100);

-- A decided letter (replayed, discarded) is evidence, like the audit log: no role can
-- DELETE it, and the table cannot be TRUNCATEd. A letter still pending review can be deleted
-- by a role that has DELETE (jobfence itself never deletes letters; the application role of
-- docs/dead-letters.md has no DELETE on them). Only the table's owner can switch this off
-- (ALTER TABLE … DISABLE TRIGGER), or a superuser (session_replication_role = replica).
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
