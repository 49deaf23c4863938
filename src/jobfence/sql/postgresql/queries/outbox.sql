-- The transactional outbox and its relay (jobfence.outbox, jobfence.outbox.relay).

-- name: outbox_write
INSERT INTO core.outbox (event_id, queue, ordering_key, correlation_id, payload, trace_context,
                         priority)
VALUES (%(event_id)s, %(queue)s, %(ordering_key)s, %(correlation_id)s, %(payload)s,
        %(trace_context)s, %(priority)s)
ON CONFLICT (event_id) DO NOTHING
RETURNING id

-- name: outbox_write_at_commit
-- outbox.write_at_commit: sent with the COMMIT; an event id already there fails the commit.
INSERT INTO core.outbox (event_id, queue, ordering_key, correlation_id, payload, trace_context,
                         priority)
VALUES (%(event_id)s, %(queue)s, %(ordering_key)s, %(correlation_id)s, %(payload)s,
        %(trace_context)s, %(priority)s)

-- name: outbox_claim
-- Claim a batch of ready events. An event with an ordering key is ready only when every
-- earlier event of its key is published, so one key is published strictly in order even with
-- several relays (a relay skips rows another one holds, and the next of a key waits for it).
WITH candidates AS (
    SELECT o.id FROM core.outbox AS o
    WHERE o.state = 'PENDING' AND o.next_attempt_at <= now()
      AND (o.claim_expires_at IS NULL OR o.claim_expires_at < now())
      AND (o.ordering_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM core.outbox AS e
          WHERE e.ordering_key = o.ordering_key AND e.id < o.id AND e.state <> 'PUBLISHED'))
    ORDER BY o.id
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE core.outbox AS o SET
    attempts = o.attempts + 1,
    claim_token = gen_random_uuid(),
    claim_expires_at = now() + make_interval(secs => %(lease)s),
    relay_id = %(relay_id)s
WHERE o.id = ANY(ARRAY(SELECT id FROM candidates))  -- the primary key, not a scan of the table
RETURNING o.id, o.event_id, o.queue, o.ordering_key, o.correlation_id, o.payload, o.attempts,
          o.claim_token, o.trace_context, o.priority

-- name: outbox_relay_to_jobs
-- The relay's path when its transport is the job table in this same database: claim a batch
-- of ready events (as outbox_claim), queue them as jobs and mark them published, all in one
-- statement of the caller's transaction — one round trip and one commit per batch, and an
-- event is queued exactly once.
WITH candidates AS (
    SELECT o.id FROM core.outbox AS o
    WHERE o.state = 'PENDING' AND o.next_attempt_at <= now()
      AND (o.claim_expires_at IS NULL OR o.claim_expires_at < now())
      AND (o.ordering_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM core.outbox AS e
          WHERE e.ordering_key = o.ordering_key AND e.id < o.id AND e.state <> 'PUBLISHED'))
    ORDER BY o.id
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
), moved AS (
    UPDATE core.outbox AS o SET
        state = 'PUBLISHED',
        published_at = now(),
        attempts = o.attempts + 1,
        claim_token = NULL,
        claim_expires_at = NULL,
        relay_id = %(relay_id)s
    WHERE o.id = ANY(ARRAY(SELECT id FROM candidates))
    RETURNING o.id, o.event_id, o.queue, o.ordering_key, o.correlation_id, o.payload,
              o.attempts, o.trace_context, o.priority
), queued AS (
    INSERT INTO core.jobs (queue, job_id, correlation_id, payload, run_at, trace_context, priority)
    SELECT queue, event_id, correlation_id, payload, now(), trace_context, priority
    FROM moved ORDER BY id
)
SELECT id, event_id, queue, ordering_key, correlation_id,
       CASE WHEN %(with_payload)s THEN payload END AS payload, attempts, trace_context, priority
FROM moved
ORDER BY id

-- name: outbox_wait_register
-- An idle relay is about to wait until ``seconds`` from now: writers notify meanwhile.
INSERT INTO core.outbox_waiters (relay_id, until)
VALUES (%(relay_id)s, now() + make_interval(secs => %(seconds)s))
ON CONFLICT (relay_id) DO UPDATE SET until = EXCLUDED.until

-- name: outbox_wait_writers
-- After registering: wait (at most %(ms)s) for the writers that saw no waiting relay — they
-- hold the outbox trigger's lock shared until they commit — so that looking again finds
-- their events.
SELECT set_config('lock_timeout', %(ms)s, true) AS lock_timeout,
       pg_advisory_xact_lock(1785292399, 1) AS locked

-- name: outbox_wait_done
-- The relay has work (or stops): writers need not notify for it any more.
DELETE FROM core.outbox_waiters WHERE relay_id = %(relay_id)s OR until < now() - interval '1 hour'

-- name: outbox_next_attempt
-- When the next event that is not claimable now becomes claimable by time: a retry falling
-- due or another relay's claim running out. (Events waiting behind their key are released
-- by the relay that publishes the key's head; new events wake relays by NOTIFY.)
SELECT extract(epoch FROM (min(greatest(next_attempt_at, coalesce(claim_expires_at, now())))
                           - now()))::float8 AS wait
FROM core.outbox
WHERE state = 'PENDING' AND (next_attempt_at > now() OR claim_expires_at > now())

-- name: outbox_mark_published
UPDATE core.outbox SET
    state = 'PUBLISHED',
    published_at = now(),
    claim_token = NULL,
    claim_expires_at = NULL
WHERE id = ANY(%(ids)s) AND state = 'PENDING'
RETURNING id, event_id, queue, ordering_key, correlation_id, payload, attempts, trace_context,
          priority

-- name: outbox_mark_failed
UPDATE core.outbox SET
    state = CASE WHEN attempts >= %(max_attempts)s THEN 'PUBLISH_FAILED_RETRY' ELSE 'PENDING' END,
    next_attempt_at = now() + make_interval(secs => %(delay)s),
    claim_token = NULL,
    claim_expires_at = NULL,
    last_error = %(error)s,
    history = history || jsonb_build_array(jsonb_build_object(
        'attempt', attempts,
        'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'category', %(category)s::text,
        'error', %(error)s::text,
        'relay', relay_id))
WHERE id = %(id)s AND claim_token = %(token)s AND state = 'PENDING'
RETURNING state, attempts

-- name: outbox_redrive
-- Operator re-drive: PUBLISH_FAILED_RETRY → PENDING with a fresh attempt budget; who and why
-- go into the event's history.
WITH redriven AS (
    UPDATE core.outbox SET
        state = 'PENDING',
        attempts = 0,
        next_attempt_at = now(),
        history = history || jsonb_build_array(jsonb_build_object(
            'action', 'redrive',
            'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'by', %(actor)s::text,
            'reason', %(reason)s::text))
    WHERE state = 'PUBLISH_FAILED_RETRY'
      AND (%(event_ids)s::text[] IS NULL OR event_id = ANY(%(event_ids)s::text[]))
      AND (%(queue)s::text IS NULL OR queue = %(queue)s)
    RETURNING event_id
)
SELECT event_id, pg_notify('jobfence_outbox', '') AS notified FROM redriven

-- name: outbox_failed_counts
-- PUBLISH_FAILED_RETRY events per queue: the preview of re-driving all of them.
SELECT queue, count(*) AS events
FROM core.outbox
WHERE state = 'PUBLISH_FAILED_RETRY' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
GROUP BY queue
ORDER BY queue

-- name: outbox_failed_lock
-- The events a confirmed re-drive of all failed ones takes, locked until it commits.
SELECT event_id
FROM core.outbox
WHERE state = 'PUBLISH_FAILED_RETRY' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY id
FOR UPDATE

-- name: outbox_list
SELECT id, event_id, queue, ordering_key, correlation_id, state, attempts, next_attempt_at,
       last_error, created_at, published_at, octet_length(payload) AS payload_size
FROM core.outbox
WHERE (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(before)s::bigint IS NULL OR id < %(before)s)
ORDER BY id DESC
LIMIT %(limit)s

-- name: outbox_get
SELECT id, event_id, queue, ordering_key, correlation_id, state, attempts, next_attempt_at,
       last_error, created_at, published_at, octet_length(payload) AS payload_size, history
FROM core.outbox WHERE event_id = %(event_id)s

-- name: outbox_counts
SELECT state, count(*) AS events FROM core.outbox GROUP BY state ORDER BY state

-- name: outbox_cleanup
-- One bounded batch of published events older than the retention.
DELETE FROM core.outbox WHERE id IN (
    SELECT id FROM core.outbox
    WHERE state = 'PUBLISHED' AND published_at < now() - make_interval(secs => %(retention)s)
    ORDER BY published_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING 1 AS deleted
