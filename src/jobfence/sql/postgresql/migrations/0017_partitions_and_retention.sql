-- Issue 27, the fence and dead-letter tables past one machine's comfort:
-- 1. Fence cleanup without holding the fence table while files are removed: expired days are
--    detached (a catalog change, milliseconds under the table's lock), renamed
--    <name>_detached, and dropped in a later transaction that holds nothing the workers need.
-- 2. Decided dead letters past a retention the owner sets (none by default: every letter
--    stays, as before); letters pending review are never removed. Deletes nothing itself.
DROP FUNCTION core.fence_partition_drop(timestamptz, double precision);

-- Detaches every day partition whose fences all expired before moment - min_age (so each is
-- older than min_age too: processed_at < expires_at), oldest first, after moving the fences
-- cleanup must keep (SPEC T2: a letter pending review or replayed within min_age, a job still
-- retrying) to expire a day after moment; each detached table is renamed <name>_detached and
-- core.fence_partitions_purge() drops it in a later transaction. DETACH only changes the
-- catalog, so the whole table is held for milliseconds (its lock waited for at most 1 s, as
-- in fence_partitions_add): a DROP here would hold it while its files are removed at commit
-- (~55 ms per day of 1.4 million fences measured, 0.56 s for 10 million), and every fence
-- insert would wait that long. (DETACH CONCURRENTLY takes no such lock but is refused on a
-- table with a default partition.) Returns one row per day: its name, its fences (the
-- planner's count, exact when never analysed) less the kept ones, and the kept ones.
-- SECURITY DEFINER, as above (a role that may delete fences may drop expired ones).
CREATE FUNCTION core.fence_partitions_detach(moment timestamptz, min_age double precision)
RETURNS TABLE (detached text, fences bigint, kept bigint) LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    part record;
    horizon timestamptz := moment - make_interval(secs => min_age);
    moved bigint;
    more bigint;
    total bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM core.fence_partitions() AS p
                   WHERE NOT p.is_default AND p.upper_bound <= horizon) THEN
        RETURN;
    END IF;
    PERFORM set_config('lock_timeout', '1s', true);
    LOCK TABLE core.processed_jobs IN ACCESS EXCLUSIVE MODE;
    FOR part IN
        SELECT p.name, p.lower_bound, p.upper_bound FROM core.fence_partitions() AS p
        WHERE NOT p.is_default AND p.upper_bound <= horizon ORDER BY p.upper_bound
    LOOP
        UPDATE core.processed_jobs AS p SET expires_at = moment + interval '1 day'
        FROM core.dead_letters AS d
        WHERE d.job_id = p.job_id AND d.consumer = p.consumer
          AND (d.status = 'pending_review' OR (d.status = 'replayed' AND d.reviewed_at > horizon))
          AND p.expires_at >= part.lower_bound AND p.expires_at < part.upper_bound;
        GET DIAGNOSTICS moved = ROW_COUNT;
        UPDATE core.processed_jobs AS p SET expires_at = moment + interval '1 day'
        FROM (SELECT DISTINCT j.job_id FROM core.jobs AS j WHERE j.history <> '[]'::jsonb) AS r
        WHERE p.job_id = r.job_id
          AND p.expires_at >= part.lower_bound AND p.expires_at < part.upper_bound;
        GET DIAGNOSTICS more = ROW_COUNT;
        SELECT CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint END INTO total
        FROM pg_class AS c WHERE c.oid = ('core.' || quote_ident(part.name))::regclass;
        IF total IS NULL THEN
            EXECUTE format('SELECT count(*) FROM core.%I', part.name) INTO total;
            total := total + moved + more;  -- the count no longer sees the moved rows
        END IF;
        EXECUTE format('ALTER TABLE core.processed_jobs DETACH PARTITION core.%I', part.name);
        EXECUTE format('ALTER TABLE core.%I RENAME TO %I', part.name, part.name || '_detached');
        detached := part.name;
        kept := moved + more;
        fences := greatest(total - kept, 0);
        RETURN NEXT;
    END LOOP;
END $$;

-- The fence partitions detached by fence_partitions_detach() and not dropped yet.
CREATE FUNCTION core.fence_partitions_detached() RETURNS SETOF regclass
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT c.oid::regclass FROM pg_class AS c
    WHERE c.relnamespace = (SELECT t.relnamespace FROM pg_class AS t
                            WHERE t.oid = 'core.processed_jobs'::regclass)
      AND c.relkind = 'r' AND NOT c.relispartition
      AND c.relname LIKE 'processed\_jobs\_%\_detached'
$$;

-- Drops the detached fence partitions (their files are removed at this transaction's commit;
-- nothing else uses them any more), each lock waited for at most 1 s. Returns how many.
-- SECURITY DEFINER, as above.
CREATE FUNCTION core.fence_partitions_purge() RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    gone regclass;
    n integer := 0;
BEGIN
    PERFORM set_config('lock_timeout', '1s', true);
    FOR gone IN SELECT * FROM core.fence_partitions_detached() LOOP
        EXECUTE format('DROP TABLE %s', gone);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;


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
