-- Fences partitioned by day of expiry (issue 27): cleanup drops a whole day (no dead tuples,
-- no vacuum debt), and an insert touches only the day it expires on.
--
-- The key stays unique across partitions without a unique index (which would have to
-- include expires_at): core.fence() and core.fence_many() take a transaction-scoped advisory
-- lock on the key (class 27238, hashtext of consumer and job_id; a collision only serialises
-- two keys), then look for the key in every partition in a later statement of the function,
-- whose fresh snapshot (READ COMMITTED) sees the fence of any transaction that held the lock
-- before: a parallel delivery waits for the first to end, then finds its fence or writes its
-- own, whichever days the two expire on. REPEATABLE READ would look with the snapshot taken
-- before the wait, so it is refused; SERIALIZABLE is kept safe by its own conflict checks.
CREATE FUNCTION core.fence(fence_consumer text, fence_job_id text, ttl double precision)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'repeatable read' THEN
        RAISE EXCEPTION 'jobfence: a fence cannot be written in a REPEATABLE READ transaction (its snapshot predates the wait for a parallel delivery of the same job)'
            USING ERRCODE = 'JF004',
                  HINT = 'run the transaction that fences a job in READ COMMITTED (the default) or SERIALIZABLE';
    END IF;
    PERFORM pg_advisory_xact_lock(27238, hashtext(fence_consumer || chr(31) || fence_job_id));
    IF EXISTS (SELECT 1 FROM core.processed_jobs AS p
               WHERE p.job_id = fence_job_id AND p.consumer = fence_consumer) THEN
        RETURN false;
    END IF;
    INSERT INTO core.processed_jobs (consumer, job_id, expires_at)
    VALUES (fence_consumer, fence_job_id, now() + make_interval(secs => ttl));
    RETURN true;
END $$;

-- Group commit: fence many keys at once, locked in one order (no deadlock between batches);
-- a key twice in the input is fenced once. Returns the keys it fenced.
CREATE FUNCTION core.fence_many(consumers text[], job_ids text[], ttl double precision)
RETURNS TABLE (fenced_consumer text, fenced_job_id text) LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'repeatable read' THEN
        RAISE EXCEPTION 'jobfence: a fence cannot be written in a REPEATABLE READ transaction (its snapshot predates the wait for a parallel delivery of the same job)'
            USING ERRCODE = 'JF004',
                  HINT = 'run the transaction that fences a job in READ COMMITTED (the default) or SERIALIZABLE';
    END IF;
    PERFORM pg_advisory_xact_lock(27238, k.h)
    FROM (SELECT DISTINCT hashtext(u.c || chr(31) || u.j) AS h
          FROM unnest(consumers, job_ids) AS u(c, j) ORDER BY 1) AS k;
    RETURN QUERY
    INSERT INTO core.processed_jobs AS p (consumer, job_id, expires_at)
    SELECT DISTINCT u.c, u.j, now() + make_interval(secs => ttl)
    FROM unnest(consumers, job_ids) AS u(c, j)
    WHERE NOT EXISTS (SELECT 1 FROM core.processed_jobs AS q
                      WHERE q.job_id = u.j AND q.consumer = u.c)
    RETURNING p.consumer, p.job_id;
END $$;

-- The partitions of core.processed_jobs and their ranges (-infinity/infinity for
-- MINVALUE/MAXVALUE; NULL for the default partition).
CREATE FUNCTION core.fence_partitions()
RETURNS TABLE (name text, lower_bound timestamptz, upper_bound timestamptz, is_default boolean)
LANGUAGE sql STABLE AS $$
    SELECT c.relname::text,
           CASE b.m[1] WHEN 'MINVALUE' THEN '-infinity' ELSE btrim(b.m[1], '''') END::timestamptz,
           CASE b.m[2] WHEN 'MAXVALUE' THEN 'infinity' ELSE btrim(b.m[2], '''') END::timestamptz,
           b.m IS NULL
    FROM pg_inherits AS i
    JOIN pg_class AS c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL (SELECT regexp_match(pg_get_expr(c.relpartbound, c.oid),
                                            'FROM \((.+)\) TO \((.+)\)') AS m) AS b
    WHERE i.inhparent = 'core.processed_jobs'::regclass
$$;

-- Creates the day partitions (UTC days) from first_day to last_day that do not exist yet; a
-- day some partition already covers is skipped. Fences of a new day that sit in the default
-- partition move into it. Holds the whole table for the few milliseconds it takes. Waits at most 1 s for its locks (then fails: the next round tries
-- again). Returns how many partitions it created. SECURITY DEFINER: creating a partition
-- needs the owner's rights, and an application role without them (docs/dead-letters.md)
-- still keeps its days.
CREATE FUNCTION core.fence_partitions_add(first_day date, last_day date)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    day date;
    lo timestamptz;
    hi timestamptz;
    part text;
    made integer := 0;
BEGIN
    PERFORM set_config('lock_timeout', '1s', true);
    FOR day IN SELECT g::date FROM generate_series(first_day, last_day, interval '1 day') AS g LOOP
        lo := day::timestamp AT TIME ZONE 'UTC';
        hi := (day + 1)::timestamp AT TIME ZONE 'UTC';
        CONTINUE WHEN EXISTS (SELECT 1 FROM core.fence_partitions() AS p
                              WHERE NOT p.is_default AND p.lower_bound < hi AND p.upper_bound > lo);
        part := 'processed_jobs_p' || to_char(day, 'YYYYMMDD');
        -- The whole table, not just the default partition: a fence statement that planned
        -- without the new day while its fence moves there would look in the old days only
        -- (seen: two fences of one key). Under this lock a fence's look sees the days before
        -- or after, never a mix.
        LOCK TABLE core.processed_jobs IN ACCESS EXCLUSIVE MODE;
        -- another worker may have made it while this one waited for the lock
        CONTINUE WHEN EXISTS (SELECT 1 FROM core.fence_partitions() AS p
                              WHERE NOT p.is_default AND p.lower_bound < hi AND p.upper_bound > lo);
        EXECUTE format('CREATE TABLE core.%I (LIKE core.processed_jobs INCLUDING DEFAULTS '
                       'INCLUDING CONSTRAINTS)', part);
        EXECUTE format('WITH moved AS (DELETE FROM core.processed_jobs_default '
                       'WHERE expires_at >= $1 AND expires_at < $2 RETURNING consumer, job_id, '
                       'processed_at, expires_at) INSERT INTO core.%I SELECT * FROM moved', part)
            USING lo, hi;
        EXECUTE format('ALTER TABLE core.processed_jobs ATTACH PARTITION core.%I '
                       'FOR VALUES FROM (%L) TO (%L)', part, lo, hi);
        made := made + 1;
    END LOOP;
    RETURN made;
END $$;

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

-- The fences counted for the gauge: each partition's planner estimate, counted when it was
-- never analysed (a partition made today). SECURITY DEFINER: the day partitions belong to
-- the owner, and the gauge is read by the application role.
CREATE FUNCTION core.fence_count() RETURNS bigint LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    part record;
    total bigint := 0;
    n bigint;
BEGIN
    FOR part IN
        SELECT t.relid, c.reltuples
        FROM pg_partition_tree('core.processed_jobs') AS t JOIN pg_class AS c ON c.oid = t.relid
        WHERE t.isleaf
    LOOP
        IF part.reltuples >= 0 THEN
            total := total + part.reltuples::bigint;
        ELSE
            EXECUTE format('SELECT count(*) FROM %s', part.relid::regclass) INTO n;
            total := total + n;
        END IF;
    END LOOP;
    RETURN total;
END $$;
