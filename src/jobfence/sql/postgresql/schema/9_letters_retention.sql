-- Decided dead letters past the owner's retention (issue 27). A letter pending review is
-- never removed (SPEC D, seed 000: every failure stays until someone decides it); a decided
-- one is evidence of that decision, kept for ever unless the *owner* sets a retention here
-- (one row; the application role can read it, not write it). Then the workers' cleanup
-- removes, in batches, the letters decided and failed longer ago than that, with their
-- replay items — never one a later letter replays (previous_id), which goes with or after it.
CREATE TABLE core.dead_letter_retention (
    only_row     boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    decided_for  interval NOT NULL CHECK (decided_for >= interval '1 day'),
    set_at       timestamptz NOT NULL DEFAULT now(),
    set_by       text NOT NULL DEFAULT current_user
);
CREATE INDEX dead_letters_previous_idx ON core.dead_letters (previous_id)
    WHERE previous_id IS NOT NULL;

-- The decided letters removed by core.dead_letters_expire() pass the trigger that keeps
-- decided letters: only inside that function (it runs as the owner and marks its
-- transaction), never a DELETE of any role, the owner's included.
CREATE OR REPLACE FUNCTION core.dead_letters_keep_decided() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'core.dead_letters cannot be truncated: decided letters are evidence'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF current_setting('jobfence.expiring_letters', true) = 'on'
       AND (SELECT c.relowner FROM pg_class AS c WHERE c.oid = TG_RELID)
           = (SELECT r.oid FROM pg_roles AS r WHERE r.rolname = current_user) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'dead letter % is %: a decided letter is evidence and cannot be deleted',
        OLD.id, OLD.status
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

-- Removes up to batch decided letters older than the retention (none when the owner set
-- none), oldest first: each decided and failed more than decided_for before now() (the
-- database's clock: a caller cannot move it). Returns how many went. SECURITY DEFINER: the
-- application role's cleanup runs it, and can neither choose the letters nor the retention.
CREATE FUNCTION core.dead_letters_expire(batch integer)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    keep interval;
    ids bigint[];
BEGIN
    SELECT r.decided_for INTO keep FROM core.dead_letter_retention AS r;
    IF keep IS NULL THEN
        RETURN 0;
    END IF;
    SELECT array_agg(d.id) INTO ids FROM (
        SELECT l.id FROM core.dead_letters AS l
        WHERE l.status IN ('replayed', 'discarded')
          AND l.failed_at < now() - keep AND l.reviewed_at < now() - keep
          AND NOT EXISTS (SELECT 1 FROM core.dead_letters AS n WHERE n.previous_id = l.id)
        ORDER BY l.failed_at
        LIMIT batch
        FOR UPDATE SKIP LOCKED
    ) AS d;
    IF ids IS NULL THEN
        RETURN 0;
    END IF;
    DELETE FROM core.replay_items WHERE dead_letter_id = ANY (ids);
    PERFORM set_config('jobfence.expiring_letters', 'on', true);
    DELETE FROM core.dead_letters WHERE id = ANY (ids);
    PERFORM set_config('jobfence.expiring_letters', '', true);
    RETURN cardinality(ids);
END $$;
