-- The console's sign-in sessions (migration 0011): shared by every replica of the ops
-- server. Keyed by the SHA-256 of the cookie (the cookie itself is never stored); a session
-- ends at expires_at, after idle_seconds without a request, or when revoked (sign-out).
CREATE TABLE core.console_sessions (
    id_hash       text PRIMARY KEY CHECK (id_hash ~ '^[0-9a-f]{64}$'),
    token_hash    text NOT NULL,
    csrf          text NOT NULL CHECK (length(csrf) >= 32),
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    seen_at       timestamptz NOT NULL DEFAULT now(),
    idle_seconds  double precision NOT NULL CHECK (idle_seconds > 0),
    revoked_at    timestamptz,
    flash         jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(flash) = 'array')
);
CREATE INDEX console_sessions_expires_idx ON core.console_sessions (expires_at);
