-- Ops API tokens (jobfence.ops.auth).

-- name: ops_token_insert
INSERT INTO core_ops_tokens (name, token_hash, role, partner, created_at, expires_at)
VALUES (:name, :hash, :role, :partner, {NOW}, {NOW} + :expires_in)
RETURNING id

-- name: ops_token_lookup
SELECT id, name, role, partner, (expires_at IS NOT NULL AND expires_at <= {NOW}) AS expired
FROM core_ops_tokens
WHERE token_hash = :hash AND revoked_at IS NULL

-- name: ops_tokens_list
SELECT id, name, role, partner, created_at, expires_at, revoked_at
FROM core_ops_tokens
WHERE :all OR revoked_at IS NULL
ORDER BY id

-- name: ops_token_revoke
UPDATE core_ops_tokens SET revoked_at = {NOW}
WHERE name = :name AND revoked_at IS NULL
RETURNING id
