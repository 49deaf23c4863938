-- Periodic jobs (migration 0016): one row per schedule name. The definition is the one the
-- last scheduler to start registered (cron, time zone, queue, the queue's consumer, the
-- missed-tick policy); last_slot is the tick the schedule is at, moved in the transaction
-- that enqueues its ticks (so on the database queue a tick is enqueued once, however many
-- schedulers run); last_job_id and last_enqueued_at name the last tick enqueued (a tick
-- dropped by the missed-tick policy moves last_slot only); defined_at is when a running
-- scheduler last declared it (at its start, every hour while it runs, and in each round that
-- moves it): a schedule no app declares any more keeps an old defined_at.
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
