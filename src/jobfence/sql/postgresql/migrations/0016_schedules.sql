-- 0016: periodic jobs (see the declared schema, 9_schedules.sql).
CREATE TABLE core.schedules (
    name              text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$'),
    cron              text NOT NULL CHECK (cron <> '' AND length(cron) <= 200),
    tz                text NOT NULL CHECK (tz <> '' AND length(tz) <= 100),
    queue             text NOT NULL CHECK (queue <> '' AND length(queue) <= 200),
    consumer          text NOT NULL CHECK (consumer <> '' AND length(consumer) <= 200),
    missed            text NOT NULL CHECK (missed IN ('last', 'skip', 'all')),
    created_at        timestamptz NOT NULL DEFAULT now(),
    defined_at        timestamptz NOT NULL DEFAULT now(),
    last_slot         timestamptz,
    last_job_id       text CHECK (last_job_id <> '' AND length(last_job_id) <= 255),
    last_enqueued_at  timestamptz,
    CONSTRAINT schedules_enqueued_check CHECK ((last_job_id IS NULL) = (last_enqueued_at IS NULL))
);
