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

-- name: idempotency_claim_many
-- idempotency_claim for several distinct keys in one statement (jobfence.http.batch); the
-- keys are locked in (partner_id, key) order, so two processes' batches cannot deadlock.
INSERT INTO core.idempotency_keys AS k (
    partner_id, key, fingerprint, state, lease_token, lease_expires_at, expires_at)
SELECT t.partner_id, t.key, t.fingerprint, 'in_progress', gen_random_uuid(),
       now() + make_interval(secs => %(lease)s), now() + make_interval(secs => %(window)s)
FROM unnest(%(partner_ids)s::text[], %(keys)s::text[], %(fingerprints)s::text[])
     AS t(partner_id, key, fingerprint)
ORDER BY t.partner_id, t.key
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
RETURNING k.partner_id, k.key, k.lease_token::text AS lease_token, k.expires_at

-- name: idempotency_complete_many
-- idempotency_complete for several keys in one statement (jobfence.http.batch), locked in
-- (partner_id, key) order like the claims; returns the keys whose response was stored.
WITH done AS (
    SELECT * FROM unnest(%(partner_ids)s::text[], %(keys)s::text[], %(tokens)s::uuid[],
                         %(status_codes)s::int[], %(headers)s::jsonb[], %(bodies)s::bytea[])
        AS t(partner_id, key, token, status_code, headers, body)
), locked AS (
    SELECT k.partner_id, k.key, d.status_code, d.headers, d.body
    FROM core.idempotency_keys AS k
    JOIN done AS d ON k.partner_id = d.partner_id AND k.key = d.key AND k.lease_token = d.token
    ORDER BY k.partner_id, k.key
    FOR UPDATE OF k
)
UPDATE core.idempotency_keys AS k SET
    state = 'completed',
    lease_token = NULL,
    lease_expires_at = NULL,
    status_code = l.status_code,
    response_headers = l.headers,
    response_body = l.body,
    completed_at = now()
FROM locked AS l
WHERE k.partner_id = l.partner_id AND k.key = l.key
RETURNING k.partner_id, k.key

-- name: idempotency_insert
-- The claim of a key nobody holds, as the first step of a deferred transaction
-- (IdempotencyMiddleware(claim_at_commit=True)): a plain insert with the lease token chosen
-- by the caller, so a key already there breaks the primary key and the whole round trip
-- (the app's statements and the COMMIT with it) fails instead of committing without a claim.
INSERT INTO core.idempotency_keys (
    partner_id, key, fingerprint, state, lease_token, lease_expires_at, expires_at)
VALUES (%(partner_id)s, %(key)s, %(fingerprint)s, 'in_progress', %(token)s::uuid,
        now() + make_interval(secs => %(lease)s), now() + make_interval(secs => %(window)s))

-- name: idempotency_get_many
-- idempotency_get for the keys of concurrent requests in one statement (jobfence.http.batch).
SELECT k.partner_id, k.key, k.fingerprint, k.state, k.status_code, k.response_headers,
       k.response_body, k.expires_at, k.expires_at <= now() AS expired
FROM unnest(%(partner_ids)s::text[], %(keys)s::text[]) AS t(partner_id, key)
JOIN core.idempotency_keys AS k ON k.partner_id = t.partner_id AND k.key = t.key
