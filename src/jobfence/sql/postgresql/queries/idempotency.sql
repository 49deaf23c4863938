-- HTTP idempotency keys (jobfence.http.idempotency).

-- name: idempotency_claim
-- Take the key: a new key, a key whose window is over, or an in-progress key whose server
-- stopped renewing its lease (same request only). Returns the new lease token, or nothing
-- when someone else holds the key.
INSERT INTO core.idempotency_keys AS k (
    partner_id, key, fingerprint, state, lease_token, lease_expires_at, expires_at)
VALUES (%(partner_id)s, %(key)s, %(fingerprint)s, 'in_progress', gen_random_uuid(),
        now() + make_interval(secs => %(lease)s), now() + make_interval(secs => %(window)s))
ON CONFLICT (partner_id, key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    state = 'in_progress',
    lease_token = excluded.lease_token,
    lease_expires_at = excluded.lease_expires_at,
    status_code = NULL,
    response_headers = NULL,
    response_body = NULL,
    completed_at = NULL,
    created_at = CASE WHEN k.expires_at <= now() THEN now() ELSE k.created_at END,
    expires_at = CASE WHEN k.expires_at <= now() THEN excluded.expires_at ELSE k.expires_at END
WHERE (k.expires_at <= now() AND (k.state = 'completed' OR k.lease_expires_at <= now()))
   OR (k.state = 'in_progress' AND k.lease_expires_at <= now()
       AND k.fingerprint = excluded.fingerprint)
RETURNING lease_token::text AS lease_token, expires_at

-- name: idempotency_get
SELECT fingerprint, state, status_code, response_headers, response_body, expires_at,
       expires_at <= now() AS expired
FROM core.idempotency_keys WHERE partner_id = %(partner_id)s AND key = %(key)s

-- name: idempotency_extend
UPDATE core.idempotency_keys SET lease_expires_at = now() + make_interval(secs => %(lease)s)
WHERE partner_id = %(partner_id)s AND key = %(key)s AND lease_token = %(token)s::uuid
RETURNING 1 AS extended

-- name: idempotency_complete
UPDATE core.idempotency_keys SET
    state = 'completed',
    lease_token = NULL,
    lease_expires_at = NULL,
    status_code = %(status_code)s,
    response_headers = %(headers)s::jsonb,
    response_body = %(body)s,
    completed_at = now()
WHERE partner_id = %(partner_id)s AND key = %(key)s AND lease_token = %(token)s::uuid
RETURNING 1 AS completed

-- name: idempotency_release
DELETE FROM core.idempotency_keys
WHERE partner_id = %(partner_id)s AND key = %(key)s AND lease_token = %(token)s::uuid

-- name: idempotency_cleanup
-- One bounded batch of keys whose window is over (never one still in flight).
DELETE FROM core.idempotency_keys WHERE (partner_id, key) IN (
    SELECT partner_id, key FROM core.idempotency_keys
    WHERE expires_at < now() AND (state = 'completed' OR lease_expires_at < now())
    ORDER BY expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING 1 AS deleted
