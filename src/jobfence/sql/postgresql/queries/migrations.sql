-- Schema bookkeeping: which numbered migrations ran (jobfence.store).

-- name: create_migrations_table
CREATE SCHEMA IF NOT EXISTS core;
CREATE TABLE IF NOT EXISTS core.schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: lock_migrations
SELECT pg_advisory_xact_lock(7283611042)

-- name: applied_migrations
SELECT version FROM core.schema_migrations ORDER BY version

-- name: record_migration
INSERT INTO core.schema_migrations (version, name) VALUES (%(version)s, %(name)s)

-- name: schema_version
SELECT coalesce(max(version), 0) AS version FROM core.schema_migrations

-- name: schema_present
SELECT to_regclass('core.schema_migrations') IS NOT NULL AS present
