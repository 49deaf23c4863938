-- Ops API tokens (jobfence.ops.auth).

-- name: ops_token_insert
INSERT INTO core.ops_tokens (name, token_hash, role, partner, expires_at)
VALUES (%(name)s, %(hash)s, %(role)s, %(partner)s,
        now() + make_interval(secs => %(expires_in)s::float8))
RETURNING id

-- name: ops_token_lookup
SELECT id, name, role, partner, (expires_at IS NOT NULL AND expires_at <= now()) AS expired
FROM core.ops_tokens
WHERE token_hash = %(hash)s AND revoked_at IS NULL

-- name: ops_tokens_list
SELECT id, name, role, partner, created_at, expires_at, revoked_at
FROM core.ops_tokens
WHERE %(all)s OR revoked_at IS NULL
ORDER BY id

-- name: ops_token_revoke
UPDATE core.ops_tokens SET revoked_at = now()
WHERE name = %(name)s AND revoked_at IS NULL
RETURNING id
