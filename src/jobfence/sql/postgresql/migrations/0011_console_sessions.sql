-- 0011: the console's sign-in sessions live in the database (issue 23), so that every
-- replica of `jobfence ops serve` behind one address sees them: sign in on one, act (with
-- the session's CSRF token) on another, sign out on a third. The cookie is never stored: the
-- row is keyed by its SHA-256. A session ends at expires_at (absolute), after idle_seconds
-- without a request, or when revoked (sign-out); expired rows are deleted at the next sign-in.
-- Also: audit rows say `via console` for what an operator did in the console.
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
ALTER TABLE core.audit_log DROP CONSTRAINT audit_log_via_check;
ALTER TABLE core.audit_log ADD CONSTRAINT audit_log_via_check
    CHECK (via IN ('cli', 'api', 'library', 'console'));
