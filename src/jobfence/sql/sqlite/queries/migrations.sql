-- Schema bookkeeping: which numbered migrations ran (jobfence.store).

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS core_schema_migrations (
    version     INTEGER PRIMARY KEY,
    name        TEXT NOT NULL,
    applied_at  REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);

-- name: applied_migrations
SELECT version FROM core_schema_migrations ORDER BY version

-- name: record_migration
INSERT INTO core_schema_migrations (version, name) VALUES (:version, :name)

-- name: schema_version
SELECT coalesce(max(version), 0) AS version FROM core_schema_migrations

-- name: schema_present
SELECT count(*) > 0 AS present FROM sqlite_master WHERE name = 'core_schema_migrations'
