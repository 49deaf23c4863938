-- Named statements of the purchase-order service (PostgreSQL, %(name)s parameters).

-- name: lock_migrations
SELECT pg_advisory_xact_lock(7283611043)

-- name: partner_insert
INSERT INTO purchase_orders.partners (partner_id, name, token_hash)
VALUES (%(partner_id)s, %(name)s, %(token_hash)s)
ON CONFLICT (partner_id) DO UPDATE SET name = excluded.name, token_hash = excluded.token_hash

-- name: partner_by_token
SELECT partner_id, name FROM purchase_orders.partners WHERE token_hash = %(token_hash)s

-- name: request_insert
-- The request row and its first history entry, one round trip.
WITH created AS (
    INSERT INTO purchase_orders.requests (
        request_id, partner_id, idempotency_key, idempotency_expires_at, company_id,
        document_type, external_reference, document, state, current_event_id)
    VALUES (%(request_id)s, %(partner_id)s, %(idempotency_key)s,
            CASE WHEN %(idempotency_key)s::text IS NOT NULL
                 THEN coalesce(%(key_expires_at)s::timestamptz,
                               now() + make_interval(secs => %(key_window)s)) END,
            %(company_id)s, %(document_type)s, %(external_reference)s, %(document)s::jsonb,
            'RECEIVED', %(event_id)s)
    ON CONFLICT DO NOTHING
    RETURNING request_id, current_event_id
), logged AS (
    INSERT INTO purchase_orders.request_history (request_id, state, event_id, detail)
    SELECT request_id, 'RECEIVED', current_event_id, %(detail)s::jsonb FROM created
)
SELECT request_id FROM created

-- name: request_insert_new
-- request_insert for a transaction that sends it with its COMMIT (the API's keyed POST with
-- claim_at_commit): no ON CONFLICT, so a key or a document already there fails the commit
-- and the request runs again through request_insert, which looks.
WITH created AS (
    INSERT INTO purchase_orders.requests (
        request_id, partner_id, idempotency_key, idempotency_expires_at, company_id,
        document_type, external_reference, document, state, current_event_id)
    VALUES (%(request_id)s, %(partner_id)s, %(idempotency_key)s,
            CASE WHEN %(idempotency_key)s::text IS NOT NULL
                 THEN coalesce(%(key_expires_at)s::timestamptz,
                               now() + make_interval(secs => %(key_window)s)) END,
            %(company_id)s, %(document_type)s, %(external_reference)s, %(document)s::jsonb,
            'RECEIVED', %(event_id)s)
    RETURNING request_id, current_event_id
)
INSERT INTO purchase_orders.request_history (request_id, state, event_id, detail)
SELECT request_id, 'RECEIVED', current_event_id, %(detail)s::jsonb FROM created

-- name: request_by_key
-- The request holding a key (not released), locked: is its window over, is it the same
-- document? (Rows from before keys expired here have no expiry: their window counts from
-- created_at.)
SELECT request_id, state, current_event_id, document = %(document)s::jsonb AS same_document,
       coalesce(idempotency_expires_at, created_at + make_interval(secs => %(key_window)s))
           <= now() AS key_expired
FROM purchase_orders.requests
WHERE partner_id = %(partner_id)s AND idempotency_key = %(idempotency_key)s
  AND idempotency_released_at IS NULL
FOR UPDATE

-- name: request_release_key
-- The key's window is over: it no longer names this request (the row keeps it as history).
UPDATE purchase_orders.requests SET idempotency_released_at = now()
WHERE request_id = %(request_id)s AND idempotency_released_at IS NULL
RETURNING request_id

-- name: request_by_document
SELECT request_id, state FROM purchase_orders.requests
WHERE partner_id = %(partner_id)s AND company_id = %(company_id)s
  AND document_type = %(document_type)s AND external_reference = %(external_reference)s

-- name: history_insert
INSERT INTO purchase_orders.request_history (request_id, state, event_id, detail)
VALUES (%(request_id)s, %(state)s, %(event_id)s, %(detail)s::jsonb)

-- name: request_get
SELECT request_id, partner_id, idempotency_key, company_id, document_type, external_reference,
       document, state, current_event_id, attempts, operator_retries, erp_order_id, error_code,
       error_category, last_error, dead_letter_id, created_at, updated_at
FROM purchase_orders.requests WHERE request_id = %(request_id)s

-- name: request_lock
SELECT request_id, partner_id, company_id, document_type, external_reference, state,
       current_event_id, dead_letter_id
FROM purchase_orders.requests WHERE request_id = %(request_id)s FOR UPDATE

-- name: request_history
SELECT at, state, event_id, detail FROM purchase_orders.request_history
WHERE request_id = %(request_id)s ORDER BY id

-- name: mark_published
-- Called by the relay in the transaction that marks the events published.
WITH moved AS (
    UPDATE purchase_orders.requests SET state = 'PUBLISHED', updated_at = now()
    WHERE current_event_id = ANY(%(event_ids)s) AND state = 'RECEIVED'
    RETURNING request_id, current_event_id
)
INSERT INTO purchase_orders.request_history (request_id, state, event_id)
SELECT request_id, 'PUBLISHED', current_event_id FROM moved
RETURNING request_id

-- name: mark_sent
WITH moved AS (
    UPDATE purchase_orders.requests SET state = 'SENT_TO_ERP', attempts = %(attempt)s,
        updated_at = now()
    WHERE request_id = %(request_id)s AND current_event_id = %(event_id)s
      AND state <> 'COMPLETED'
    RETURNING request_id, current_event_id
)
INSERT INTO purchase_orders.request_history (request_id, state, event_id, detail)
SELECT request_id, 'SENT_TO_ERP', current_event_id,
       jsonb_build_object('attempt', %(attempt)s::int) FROM moved
RETURNING request_id

-- name: mark_completed
WITH moved AS (
    UPDATE purchase_orders.requests SET state = 'COMPLETED', erp_order_id = %(erp_order_id)s,
        attempts = %(attempt)s, error_code = NULL, error_category = NULL, last_error = NULL,
        updated_at = now()
    WHERE request_id = %(request_id)s AND current_event_id = %(event_id)s
      AND state <> 'COMPLETED'
    RETURNING request_id, current_event_id
)
INSERT INTO purchase_orders.request_history (request_id, state, event_id, detail)
SELECT request_id, 'COMPLETED', current_event_id, %(detail)s::jsonb FROM moved
RETURNING request_id

-- name: mark_retry_pending
UPDATE purchase_orders.requests SET state = 'RETRY_PENDING', error_code = %(error_code)s,
    error_category = %(error_category)s, last_error = %(error)s, updated_at = now()
WHERE current_event_id = %(event_id)s AND attempts <= %(attempt)s
  AND state IN ('RECEIVED', 'PUBLISHED', 'SENT_TO_ERP')
RETURNING request_id

-- name: unsettled_failures
-- Requests whose current event has a dead letter but which do not show it yet.
SELECT r.request_id, r.current_event_id AS event_id, d.id AS dead_letter_id, d.attempts,
       d.error_category, d.error_code, d.last_error, d.queue
FROM purchase_orders.requests AS r
JOIN core.dead_letters AS d ON d.job_id = r.current_event_id AND d.status = 'pending_review'
WHERE r.state IN ('RECEIVED', 'PUBLISHED', 'SENT_TO_ERP', 'RETRY_PENDING')
  AND (%(event_id)s::text IS NULL OR r.current_event_id = %(event_id)s)
LIMIT %(limit)s

-- name: mark_failed
UPDATE purchase_orders.requests SET state = %(state)s, attempts = %(attempts)s,
    error_code = %(error_code)s, error_category = %(error_category)s,
    last_error = %(error)s, dead_letter_id = %(dead_letter_id)s, updated_at = now()
WHERE request_id = %(request_id)s AND current_event_id = %(event_id)s
  AND state IN ('RECEIVED', 'PUBLISHED', 'SENT_TO_ERP', 'RETRY_PENDING')
RETURNING request_id

-- name: restart
-- Operator retry: back to RECEIVED with a new event id.
UPDATE purchase_orders.requests SET state = 'RECEIVED', current_event_id = %(event_id)s,
    attempts = 0, operator_retries = operator_retries + 1, error_code = NULL,
    error_category = NULL, last_error = NULL, dead_letter_id = NULL, updated_at = now()
WHERE request_id = %(request_id)s
RETURNING request_id

-- name: audit_insert
INSERT INTO purchase_orders.audit (actor, role, scope, action, request_id, detail)
VALUES (%(actor)s, %(role)s, %(scope)s, %(action)s, %(request_id)s, %(detail)s::jsonb)
RETURNING id

-- name: dead_letter_for_event
SELECT id, queue, job_id, attempts, error_code, error_category, last_error, status, failed_at
FROM core.dead_letters WHERE job_id = %(event_id)s ORDER BY id DESC LIMIT 1

-- name: state_counts
SELECT state, count(*) AS requests FROM purchase_orders.requests GROUP BY state ORDER BY state

-- name: requests_by_ids
SELECT request_id::text AS request_id, partner_id, state, erp_order_id, current_event_id,
       operator_retries, dead_letter_id, error_category, error_code
FROM purchase_orders.requests WHERE request_id = ANY(%(ids)s::uuid[])

-- name: dead_letters_for_events
SELECT id, queue, job_id, attempts, error_code, error_category, status, payload
FROM core.dead_letters WHERE job_id = ANY(%(event_ids)s)

-- name: dead_letters_of_requests
-- Every dead letter of these requests' events, old ones included (an operator retry sends a
-- new event and discards the letter of the old one), by review status.
SELECT status, count(*) AS letters
FROM core.dead_letters
WHERE queue = %(queue)s AND correlation_id = ANY(%(request_ids)s)
GROUP BY status

-- name: audit_for_request
SELECT id, at, actor, role, scope, action, detail FROM purchase_orders.audit
WHERE request_id = %(request_id)s ORDER BY id
