-- The declared schema of jobfence on SQLite (the embedded default). Tables carry a core_
-- prefix where PostgreSQL uses the schema core. Times are REAL seconds since the Unix epoch
-- taken from SQLite's clock. tests/test_migrations.py proves migrations/ produce exactly this.

CREATE TABLE core_schema_migrations (
    version     INTEGER PRIMARY KEY,
    name        TEXT NOT NULL,
    applied_at  REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);

CREATE TABLE core_jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    queue            TEXT NOT NULL CHECK (queue <> '' AND length(queue) <= 200),
    job_id           TEXT NOT NULL CHECK (job_id <> '' AND length(job_id) <= 255),
    correlation_id   TEXT,
    payload          BLOB NOT NULL CHECK (typeof(payload) = 'blob'),
    state            TEXT NOT NULL DEFAULT 'available' CHECK (state IN ('available', 'running')),
    attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    run_at           REAL NOT NULL,
    enqueued_at      REAL NOT NULL,
    lease_token      TEXT,
    lease_expires_at REAL,
    worker_id        TEXT,
    history          TEXT NOT NULL DEFAULT '[]' CHECK (json_type(history) = 'array'),
    CONSTRAINT jobs_lease_matches_state CHECK (
        (state = 'running') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)
    )
);
CREATE INDEX core_jobs_available_idx ON core_jobs (queue, run_at, id) WHERE state = 'available';
CREATE INDEX core_jobs_lease_idx ON core_jobs (lease_expires_at) WHERE state = 'running';

CREATE TABLE core_processed_jobs (
    consumer      TEXT NOT NULL,
    job_id        TEXT NOT NULL,
    processed_at  REAL NOT NULL,
    expires_at    REAL NOT NULL,
    PRIMARY KEY (consumer, job_id),
    CHECK (expires_at > processed_at)
) WITHOUT ROWID;
CREATE INDEX core_processed_jobs_expires_idx ON core_processed_jobs (expires_at);

CREATE TABLE core_dead_letters (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    queue             TEXT NOT NULL,
    consumer          TEXT NOT NULL,
    job_id            TEXT NOT NULL,
    correlation_id    TEXT,
    payload           BLOB NOT NULL CHECK (typeof(payload) = 'blob'),
    payload_size      INTEGER NOT NULL CHECK (payload_size >= 0),
    payload_truncated INTEGER NOT NULL DEFAULT 0 CHECK (payload_truncated IN (0, 1)),
    attempts          INTEGER NOT NULL CHECK (attempts >= 0),
    error_category    TEXT NOT NULL CHECK (error_category IN (
                          'VALIDATION_ERROR', 'BUSINESS_ERROR', 'TEMPORARY_ERROR',
                          'INTEGRATION_ERROR', 'AUTHENTICATION_ERROR', 'AUTHORIZATION_ERROR',
                          'TECHNICAL_ERROR', 'NON_RETRYABLE_ERROR')),
    error_code        TEXT,
    last_error        TEXT NOT NULL,
    history           TEXT NOT NULL DEFAULT '[]' CHECK (json_type(history) = 'array'),
    status            TEXT NOT NULL DEFAULT 'pending_review'
                          CHECK (status IN ('pending_review', 'replayed', 'discarded')),
    enqueued_at       REAL,
    failed_at         REAL NOT NULL,
    CONSTRAINT dead_letters_payload_size CHECK (
        payload_truncated = (length(payload) < payload_size) AND length(payload) <= payload_size
    )
);
CREATE UNIQUE INDEX core_dead_letters_pending_uq ON core_dead_letters (consumer, job_id)
    WHERE status = 'pending_review';
CREATE INDEX core_dead_letters_status_failed_idx ON core_dead_letters (status, failed_at);
CREATE INDEX core_dead_letters_queue_idx ON core_dead_letters (queue, failed_at);
