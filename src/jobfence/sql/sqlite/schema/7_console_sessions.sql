-- The console's sign-in sessions (migration 0008): see the PostgreSQL schema.
CREATE TABLE core_console_sessions (
    id_hash       TEXT PRIMARY KEY CHECK (length(id_hash) = 64 AND id_hash NOT GLOB '*[^0-9a-f]*'),
    token_hash    TEXT NOT NULL,
    csrf          TEXT NOT NULL CHECK (length(csrf) >= 32),
    created_at    REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    expires_at    REAL NOT NULL,
    seen_at       REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    idle_seconds  REAL NOT NULL CHECK (idle_seconds > 0),
    revoked_at    REAL,
    flash         TEXT NOT NULL DEFAULT '[]' CHECK (json_type(flash) = 'array')
) WITHOUT ROWID;
CREATE INDEX core_console_sessions_expires_idx ON core_console_sessions (expires_at);
