-- 0012: periodic jobs (see the declared schema, 9_schedules.sql).
CREATE TABLE core_schedules (
    name              TEXT PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 100
                          AND name NOT GLOB '*[^A-Za-z0-9_.-]*'
                          AND substr(name, 1, 1) NOT IN ('.', '_', '-')),
    cron              TEXT NOT NULL CHECK (cron <> '' AND length(cron) <= 200),
    tz                TEXT NOT NULL CHECK (tz <> '' AND length(tz) <= 100),
    queue             TEXT NOT NULL CHECK (queue <> '' AND length(queue) <= 200),
    consumer          TEXT NOT NULL CHECK (consumer <> '' AND length(consumer) <= 200),
    missed            TEXT NOT NULL CHECK (missed IN ('last', 'skip', 'all')),
    created_at        REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    defined_at        REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    last_slot         REAL,
    last_job_id       TEXT CHECK (last_job_id <> '' AND length(last_job_id) <= 255),
    last_enqueued_at  REAL,
    CONSTRAINT schedules_enqueued_check CHECK ((last_job_id IS NULL) = (last_enqueued_at IS NULL))
) WITHOUT ROWID;
