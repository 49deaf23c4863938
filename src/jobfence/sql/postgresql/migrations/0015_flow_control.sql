-- 0015: flow control (issue 26): the key of a limited queue's job, concurrency slots of broker
-- deliveries, the rate limit's log of starts and held keys (docs/flow-control.md).
ALTER TABLE core.jobs ADD COLUMN flow_key text CHECK (length(flow_key) <= 200);
-- a limited queue's claim counts the running jobs of each key
CREATE INDEX jobs_flow_running_idx ON core.jobs (queue, flow_key) WHERE state = 'running';
-- ... and takes due jobs of the keys with room, in order
CREATE INDEX jobs_flow_available_idx ON core.jobs (queue, flow_key, run_at, id)
    WHERE state = 'available';
-- the keying pass finds the rows enqueued without a key
CREATE INDEX jobs_unkeyed_idx ON core.jobs (queue, id)
    WHERE state = 'available' AND flow_key IS NULL;

-- Concurrency slots of broker deliveries (the broker has no running rows to count): taken
-- before the handler, released after the outcome, renewed with the delivery's lease; an
-- expired slot is ignored, so a killed worker's slots come back within one lease.
CREATE TABLE core.flow_slots (
    id          bigserial PRIMARY KEY,
    queue       text NOT NULL,
    key         text NOT NULL CHECK (length(key) <= 200),
    job_id      text NOT NULL,
    holder      text NOT NULL,
    taken_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX flow_slots_key_idx ON core.flow_slots (queue, key, expires_at);

-- The rate limit's sliding window log: one row per start, kept for the rate's period.
CREATE TABLE core.flow_starts (
    queue       text NOT NULL,
    key         text NOT NULL CHECK (length(key) <= 200),
    started_at  timestamptz NOT NULL
);
CREATE INDEX flow_starts_key_idx ON core.flow_starts (queue, key, started_at);

-- Keys held: a handler's back-off (until a time) or an operator's pause (until NULL).
CREATE TABLE core.flow_holds (
    queue       text NOT NULL,
    key         text NOT NULL CHECK (length(key) <= 200),
    kind        text NOT NULL CHECK (kind IN ('backoff', 'pause')),
    until       timestamptz,
    reason      text NOT NULL DEFAULT '' CHECK (length(reason) <= 500),
    held_by     text NOT NULL DEFAULT '' CHECK (length(held_by) <= 200),
    held_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (queue, key, kind),
    CONSTRAINT flow_holds_until CHECK ((kind = 'pause') = (until IS NULL))
);
