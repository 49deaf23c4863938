-- The console's sign-in sessions (jobfence.ops.ui.session), shared by every ops server.

-- name: console_session_prune
DELETE FROM core_console_sessions
WHERE expires_at <= {NOW} OR seen_at + idle_seconds <= {NOW}

-- name: console_session_insert
INSERT INTO core_console_sessions (id_hash, token_hash, csrf, expires_at, idle_seconds)
VALUES (:id_hash, :token_hash, :csrf, {NOW} + :ttl, :idle)

-- name: console_session_get
SELECT token_hash, csrf, flash
FROM core_console_sessions
WHERE id_hash = :id_hash AND revoked_at IS NULL AND expires_at > {NOW}
  AND seen_at + idle_seconds > {NOW}

-- name: console_session_touch
UPDATE core_console_sessions
SET seen_at = {NOW}, flash = CASE WHEN :take THEN '[]' ELSE flash END
WHERE id_hash = :id_hash

-- name: console_session_flash
UPDATE core_console_sessions
SET flash = json_insert(flash, '$[#]', json_array(:kind, :message))
WHERE id_hash = :id_hash AND json_array_length(flash) < 20

-- name: console_session_revoke
UPDATE core_console_sessions SET revoked_at = {NOW}
WHERE id_hash = :id_hash AND revoked_at IS NULL
