-- 0018: a broker delivery's flow-control admission in one statement (issue 26): the lock, the
-- key's state, the slot and the start, in one round trip instead of a transaction of five.
-- One broker delivery's admission in one statement (issue 26): takes the queue's flow lock
-- (the lock of the flow_lock query: limited claims and admissions of one queue take turns;
-- held until the calling transaction ends), then reads the key's state — each statement of
-- a function takes a fresh snapshot, so it sees every admission committed before the lock
-- was granted — and, when the key has room (not paused, not backing off, fewer live slots
-- than p_concurrency, fewer starts in the last p_per seconds than p_count; a NULL limit is
-- no limit), takes a concurrency slot for p_lease seconds (when p_concurrency is set) and
-- records a start (when p_count is set) at the time it counted. Returns the state it read
-- (times as seconds from then), whether it admitted, and the slot's id (NULL: none taken).
CREATE FUNCTION core.flow_admit(
    p_queue text, p_key text, p_job_id text, p_holder text, p_lease double precision,
    p_concurrency integer, p_count integer, p_per double precision)
RETURNS TABLE (paused boolean, backoff_for double precision, slots bigint,
               slot_free_in double precision, starts bigint, start_free_in double precision,
               counted_at timestamptz, admitted boolean, slot bigint)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('jobfence.flow ' || p_queue, 0));
    counted_at := clock_timestamp();
    SELECT coalesce(bool_or(h.kind = 'pause'), false),
           extract(epoch FROM max(h.until) FILTER (WHERE h.kind = 'backoff') - counted_at)
      INTO paused, backoff_for
      FROM core.flow_holds AS h
     WHERE h.queue = p_queue AND h.key = p_key
       AND (h.kind = 'pause' OR h.until > counted_at);
    SELECT count(*), extract(epoch FROM min(s.expires_at) - counted_at)
      INTO slots, slot_free_in
      FROM core.flow_slots AS s
     WHERE s.queue = p_queue AND s.key = p_key AND s.expires_at > counted_at;
    SELECT count(*), extract(epoch FROM min(f.started_at) + make_interval(secs => p_per)
                                         - counted_at)
      INTO starts, start_free_in
      FROM core.flow_starts AS f
     WHERE f.queue = p_queue AND f.key = p_key
       AND f.started_at > counted_at - make_interval(secs => p_per);
    admitted := NOT paused AND backoff_for IS NULL
        AND (p_concurrency IS NULL OR slots < p_concurrency)
        AND (p_count IS NULL OR starts < p_count);
    IF admitted AND p_concurrency IS NOT NULL THEN
        INSERT INTO core.flow_slots (queue, key, job_id, holder, expires_at)
        VALUES (p_queue, p_key, p_job_id, p_holder,
                counted_at + make_interval(secs => p_lease))
        RETURNING id INTO slot;
    END IF;
    IF admitted AND p_count IS NOT NULL THEN
        INSERT INTO core.flow_starts (queue, key, started_at) VALUES (p_queue, p_key, counted_at);
    END IF;
    RETURN NEXT;
END $$;
