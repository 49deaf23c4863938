-- Every runtime statement of jobfence on SQLite, as named blocks ("-- name: x").
-- Parameters use the :name style. NOW stands for SQLite's clock in epoch seconds and is
-- expanded by the loader. Loaded once by jobfence.sql.

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

-- name: enqueue
INSERT INTO core_jobs (queue, job_id, correlation_id, payload, run_at, enqueued_at)
VALUES (:queue, :job_id, :correlation_id, :payload, {NOW} + :delay, {NOW})

-- name: claim
UPDATE core_jobs SET
    state = 'running',
    attempts = attempts + 1,
    lease_token = lower(hex(randomblob(16))),
    lease_expires_at = {NOW} + :lease,
    worker_id = :worker_id
WHERE id IN (
    SELECT id FROM core_jobs
    WHERE state = 'available' AND queue IN (SELECT value FROM json_each(:queues))
      AND run_at <= {NOW}
    ORDER BY run_at, id
    LIMIT :limit
)
RETURNING id, queue, job_id, correlation_id, payload, attempts, enqueued_at, lease_token,
          history

-- name: next_run_at
SELECT min(run_at) - {NOW} AS wait
FROM core_jobs WHERE state = 'available' AND queue IN (SELECT value FROM json_each(:queues))

-- name: reap_expired
UPDATE core_jobs SET
    state = 'available',
    run_at = {NOW},
    lease_token = NULL,
    lease_expires_at = NULL,
    history = json_insert(history, '$[#]', json_object(
        'attempt', attempts,
        'at', {NOW_ISO},
        'category', 'TECHNICAL_ERROR',
        'error', 'lease expired: the worker ' || coalesce(worker_id, '?')
                 || ' stopped renewing it (killed or lost)')),
    worker_id = NULL
WHERE id IN (
    SELECT id FROM core_jobs
    WHERE state = 'running' AND lease_expires_at < {NOW}
    ORDER BY lease_expires_at
    LIMIT :limit
)
RETURNING queue

-- name: extend_leases
UPDATE core_jobs SET lease_expires_at = {NOW} + :lease
WHERE state = 'running'
  AND id IN (SELECT value FROM json_each(:ids))
  AND lease_token IN (SELECT value FROM json_each(:tokens))

-- name: ack
DELETE FROM core_jobs WHERE id = :id AND lease_token = :token RETURNING id

-- name: fence
INSERT INTO core_processed_jobs (consumer, job_id, processed_at, expires_at)
VALUES (:consumer, :job_id, {NOW}, {NOW} + :ttl)
ON CONFLICT DO NOTHING
RETURNING 1 AS fenced

-- name: retry
UPDATE core_jobs SET
    state = 'available',
    run_at = {NOW} + :delay,
    lease_token = NULL,
    lease_expires_at = NULL,
    worker_id = NULL,
    history = json_insert(history, '$[#]', json_object(
        'attempt', attempts,
        'at', {NOW_ISO},
        'category', :category,
        'error', :error,
        'retry_at', strftime('%Y-%m-%dT%H:%M:%fZ', {NOW} + :delay, 'unixepoch')))
WHERE id = :id AND lease_token = :token

-- name: release
UPDATE core_jobs SET
    state = 'available',
    run_at = {NOW},
    attempts = max(attempts - :refund, 0),
    lease_token = NULL,
    lease_expires_at = NULL,
    worker_id = NULL
WHERE id = :id AND lease_token = :token

-- name: now
SELECT {NOW_ISO} AS now

-- name: insert_dead_letter
INSERT INTO core_dead_letters (
    queue, consumer, job_id, correlation_id, payload, payload_size, payload_truncated,
    attempts, error_category, error_code, last_error, history, enqueued_at, failed_at, partner,
    previous_id)
VALUES (
    :queue, :consumer, :job_id, :correlation_id, :payload, :payload_size, :payload_truncated,
    :attempts, :category, :error_code, :error,
    json_insert(:history, '$[#]', json_object(
        'attempt', :attempts, 'at', {NOW_ISO}, 'category', :category, 'error', :error)),
    :enqueued_at, {NOW}, :partner,
    -- a replayed job that fails again links to the letter it was replayed from
    (SELECT max(id) FROM core_dead_letters
     WHERE job_id = :job_id AND consumer = :consumer AND status = 'replayed'))
ON CONFLICT DO NOTHING
RETURNING id

-- name: get_dead_letter
SELECT id, queue, consumer, job_id, correlation_id, payload, payload_size, payload_truncated,
       attempts, error_category, error_code, last_error, history, status, enqueued_at,
       failed_at, partner, previous_id, reviewed_at, reviewed_by, review_reason
FROM core_dead_letters WHERE id = :id

-- name: queue_depth
SELECT queue, state, count(*) AS jobs FROM core_jobs GROUP BY queue, state ORDER BY queue, state

-- name: dead_letter_pending_id
-- The letter a repeated dead-lettering of the same delivery met (insert_dead_letter did nothing)
SELECT id FROM core_dead_letters
WHERE consumer = :consumer AND job_id = :job_id AND status = 'pending_review'
