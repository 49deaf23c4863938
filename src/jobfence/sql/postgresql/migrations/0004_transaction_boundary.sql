-- 0004: jobfence owns the transaction it lends a handler (SPEC H5).

-- The transaction boundary (SPEC H5): jobfence lends a handler the transaction that holds the
-- job's fence, and only jobfence may commit it. core.fence_begin(token) names the lent
-- transaction (SET LOCAL, so a ROLLBACK by anyone else forgets the name) and notes the
-- session's default transaction characteristics; core.fence_commit(token) runs in the same
-- round trip as jobfence's COMMIT and refuses a transaction that is not the one it began
-- (JF002) or whose session defaults changed (JF003); the deferred guard trigger refuses any
-- COMMIT of a fence written under a name that core.fence_commit did not approve (JF001), so
-- the fence and the work roll back together. Fences written in a caller's own transaction
-- (no name) are not guarded.
CREATE FUNCTION core.fence_begin(token text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('jobfence.tx', token, true);
    PERFORM set_config('jobfence.session', concat_ws('/',
        current_setting('default_transaction_isolation'),
        current_setting('default_transaction_read_only'),
        current_setting('default_transaction_deferrable')), true);
END $$;

CREATE FUNCTION core.fence_commit(token text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('jobfence.tx', true), '') IS DISTINCT FROM token THEN
        RAISE EXCEPTION 'jobfence: this is not the transaction jobfence lent the handler (it was ended or replaced)'
            USING ERRCODE = 'JF002';
    END IF;
    IF current_setting('jobfence.session', true) IS DISTINCT FROM concat_ws('/',
        current_setting('default_transaction_isolation'),
        current_setting('default_transaction_read_only'),
        current_setting('default_transaction_deferrable')) THEN
        RAISE EXCEPTION 'jobfence: the handler changed the session''s default transaction characteristics'
            USING ERRCODE = 'JF003';
    END IF;
    PERFORM set_config('jobfence.committing', token, true);
END $$;

CREATE FUNCTION core.fence_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('jobfence.committing', true), '')
       IS DISTINCT FROM coalesce(current_setting('jobfence.tx', true), '') THEN
        RAISE EXCEPTION 'jobfence: the transaction holding the fence of job % (consumer %) was committed by someone other than jobfence',
            NEW.job_id, NEW.consumer
            USING ERRCODE = 'JF001',
                  HINT = 'a handler must not commit the transaction it is given; jobfence commits the work with its fence';
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER fence_guard AFTER INSERT ON core.processed_jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (coalesce(current_setting('jobfence.tx', true), '') <> '')
    EXECUTE FUNCTION core.fence_guard();
