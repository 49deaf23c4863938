-- HTTP idempotency keys (jobfence.http.idempotency).

-- name: idempotency_claim
INSERT INTO core_idempotency_keys AS k (
    partner_id, key, fingerprint, state, lease_token, lease_expires_at, created_at, expires_at)
VALUES (:partner_id, :key, :fingerprint, 'in_progress', lower(hex(randomblob(16))),
        {NOW} + :lease, {NOW}, {NOW} + :window)
ON CONFLICT (partner_id, key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    state = 'in_progress',
    lease_token = excluded.lease_token,
    lease_expires_at = excluded.lease_expires_at,
    status_code = NULL,
    response_headers = NULL,
    response_body = NULL,
    completed_at = NULL,
    created_at = CASE WHEN k.expires_at <= {NOW} THEN {NOW} ELSE k.created_at END,
    expires_at = CASE WHEN k.expires_at <= {NOW} THEN excluded.expires_at ELSE k.expires_at END
WHERE (k.expires_at <= {NOW} AND (k.state = 'completed' OR k.lease_expires_at <= {NOW}))
   OR (k.state = 'in_progress' AND k.lease_expires_at <= {NOW}
       AND k.fingerprint = excluded.fingerprint)
RETURNING lease_token, expires_at

-- name: idempotency_get
SELECT fingerprint, state, status_code, response_headers, response_body, expires_at,
       expires_at <= {NOW} AS expired
FROM core_idempotency_keys WHERE partner_id = :partner_id AND key = :key

-- name: idempotency_extend
UPDATE core_idempotency_keys SET lease_expires_at = {NOW} + :lease
WHERE partner_id = :partner_id AND key = :key AND lease_token = :token
RETURNING 1 AS extended

-- name: idempotency_complete
UPDATE core_idempotency_keys SET
    state = 'completed',
    lease_token = NULL,
    lease_expires_at = NULL,
    status_code = :status_code,
    response_headers = :headers,
    response_body = :body,
    completed_at = {NOW}
WHERE partner_id = :partner_id AND key = :key AND lease_token = :token
RETURNING 1 AS completed

-- name: idempotency_release
DELETE FROM core_idempotency_keys
WHERE partner_id = :partner_id AND key = :key AND lease_token = :token

-- name: idempotency_cleanup
DELETE FROM core_idempotency_keys WHERE (partner_id, key) IN (
    SELECT partner_id, key FROM core_idempotency_keys
    WHERE expires_at < {NOW} AND (state = 'completed' OR lease_expires_at < {NOW})
    ORDER BY expires_at
    LIMIT :limit
)
RETURNING 1 AS deleted
