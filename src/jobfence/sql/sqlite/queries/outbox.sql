-- The transactional outbox and its relay (jobfence.outbox, jobfence.outbox.relay).

-- name: outbox_write
INSERT INTO core_outbox (event_id, queue, ordering_key, correlation_id, payload,
                         next_attempt_at, created_at, trace_context, priority)
VALUES (:event_id, :queue, :ordering_key, :correlation_id, :payload, {NOW}, {NOW},
        :trace_context, :priority)
ON CONFLICT (event_id) DO NOTHING
RETURNING id

-- name: outbox_write_at_commit
-- outbox.write_at_commit (runs at once on SQLite); an event id already there fails it.
INSERT INTO core_outbox (event_id, queue, ordering_key, correlation_id, payload,
                         next_attempt_at, created_at, trace_context, priority)
VALUES (:event_id, :queue, :ordering_key, :correlation_id, :payload, {NOW}, {NOW},
        :trace_context, :priority)

-- name: outbox_claim
UPDATE core_outbox SET
    attempts = attempts + 1,
    claim_token = lower(hex(randomblob(16))),
    claim_expires_at = {NOW} + :lease,
    relay_id = :relay_id
WHERE id IN (
    SELECT o.id FROM core_outbox AS o
    WHERE o.state = 'PENDING' AND o.next_attempt_at <= {NOW}
      AND (o.claim_expires_at IS NULL OR o.claim_expires_at < {NOW})
      AND (o.ordering_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM core_outbox AS e
          WHERE e.ordering_key = o.ordering_key AND e.id < o.id AND e.state <> 'PUBLISHED'))
    ORDER BY o.id
    LIMIT :limit
)
RETURNING id, event_id, queue, ordering_key, correlation_id, payload, attempts, claim_token,
          trace_context, priority

-- name: outbox_next_attempt
SELECT min(max(next_attempt_at, coalesce(claim_expires_at, {NOW}))) - {NOW} AS wait
FROM core_outbox
WHERE state = 'PENDING' AND (next_attempt_at > {NOW} OR claim_expires_at > {NOW})

-- name: outbox_mark_published
UPDATE core_outbox SET
    state = 'PUBLISHED',
    published_at = {NOW},
    claim_token = NULL,
    claim_expires_at = NULL
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'PENDING'
RETURNING id, event_id, queue, ordering_key, correlation_id, payload, attempts, trace_context,
          priority

-- name: outbox_mark_failed
UPDATE core_outbox SET
    state = CASE WHEN attempts >= :max_attempts THEN 'PUBLISH_FAILED_RETRY' ELSE 'PENDING' END,
    next_attempt_at = {NOW} + :delay,
    claim_token = NULL,
    claim_expires_at = NULL,
    last_error = :error,
    history = json_insert(history, '$[#]', json_object(
        'attempt', attempts,
        'at', {NOW_ISO},
        'category', :category,
        'error', :error,
        'relay', relay_id))
WHERE id = :id AND claim_token = :token AND state = 'PENDING'
RETURNING state, attempts

-- name: outbox_redrive
UPDATE core_outbox SET
    state = 'PENDING',
    attempts = 0,
    next_attempt_at = {NOW},
    history = json_insert(history, '$[#]', json_object(
        'action', 'redrive', 'at', {NOW_ISO}, 'by', :actor, 'reason', :reason))
WHERE state = 'PUBLISH_FAILED_RETRY'
  AND (:event_ids IS NULL OR event_id IN (SELECT value FROM json_each(:event_ids)))
  AND (:queue IS NULL OR queue = :queue)
RETURNING event_id

-- name: outbox_failed_counts
-- PUBLISH_FAILED_RETRY events per queue: the preview of re-driving all of them.
SELECT queue, count(*) AS events
FROM core_outbox
WHERE state = 'PUBLISH_FAILED_RETRY' AND (:queue IS NULL OR queue = :queue)
GROUP BY queue
ORDER BY queue

-- name: outbox_failed_lock
-- The events a confirmed re-drive of all failed ones takes (the transaction holds the write lock).
SELECT event_id
FROM core_outbox
WHERE state = 'PUBLISH_FAILED_RETRY' AND (:queue IS NULL OR queue = :queue)
ORDER BY id

-- name: outbox_list
SELECT id, event_id, queue, ordering_key, correlation_id, state, attempts, next_attempt_at,
       last_error, created_at, published_at, length(payload) AS payload_size
FROM core_outbox
WHERE (:state IS NULL OR state = :state)
  AND (:queue IS NULL OR queue = :queue)
  AND (:before IS NULL OR id < :before)
ORDER BY id DESC
LIMIT :limit

-- name: outbox_get
SELECT id, event_id, queue, ordering_key, correlation_id, state, attempts, next_attempt_at,
       last_error, created_at, published_at, length(payload) AS payload_size, history
FROM core_outbox WHERE event_id = :event_id

-- name: outbox_counts
SELECT state, count(*) AS events FROM core_outbox GROUP BY state ORDER BY state

-- name: outbox_cleanup
DELETE FROM core_outbox WHERE id IN (
    SELECT id FROM core_outbox
    WHERE state = 'PUBLISHED' AND published_at < {NOW} - :retention
    ORDER BY published_at
    LIMIT :limit
)
RETURNING 1 AS deleted
