-- The console's sign-in sessions (jobfence.ops.ui.session), shared by every ops server.

-- name: console_session_prune
DELETE FROM core.console_sessions
WHERE expires_at <= now() OR seen_at + make_interval(secs => idle_seconds) <= now()

-- name: console_session_insert
INSERT INTO core.console_sessions (id_hash, token_hash, csrf, expires_at, idle_seconds)
VALUES (%(id_hash)s, %(token_hash)s, %(csrf)s,
        now() + make_interval(secs => %(ttl)s::float8), %(idle)s)

-- name: console_session_get
SELECT token_hash, csrf, flash
FROM core.console_sessions
WHERE id_hash = %(id_hash)s AND revoked_at IS NULL AND expires_at > now()
  AND seen_at + make_interval(secs => idle_seconds) > now()

-- name: console_session_touch
UPDATE core.console_sessions
SET seen_at = now(), flash = CASE WHEN %(take)s THEN '[]'::jsonb ELSE flash END
WHERE id_hash = %(id_hash)s

-- name: console_session_flash
UPDATE core.console_sessions
SET flash = flash || jsonb_build_array(jsonb_build_array(%(kind)s::text, %(message)s::text))
WHERE id_hash = %(id_hash)s AND jsonb_array_length(flash) < 20

-- name: console_session_revoke
UPDATE core.console_sessions SET revoked_at = now()
WHERE id_hash = %(id_hash)s AND revoked_at IS NULL
