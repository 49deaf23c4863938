-- 0011: flow control (issue 26): the key of a limited queue's job, concurrency slots of broker
-- deliveries, the rate limit's log of starts and held keys (docs/flow-control.md).
ALTER TABLE core_jobs ADD COLUMN flow_key TEXT CHECK (length(flow_key) <= 200);
-- a limited queue's claim counts the running jobs of each key
CREATE INDEX core_jobs_flow_running_idx ON core_jobs (queue, flow_key) WHERE state = 'running';
-- ... and takes due jobs of the keys with room, in order
CREATE INDEX core_jobs_flow_available_idx ON core_jobs (queue, flow_key, run_at, id)
    WHERE state = 'available';
-- the keying pass finds the rows enqueued without a key
CREATE INDEX core_jobs_unkeyed_idx ON core_jobs (queue, id)
    WHERE state = 'available' AND flow_key IS NULL;

-- Concurrency slots of broker deliveries (the broker has no running rows to count): taken
-- before the handler, released after the outcome, renewed with the delivery's lease; an
-- expired slot is ignored, so a killed worker's slots come back within one lease.
CREATE TABLE core_flow_slots (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    queue       TEXT NOT NULL,
    key         TEXT NOT NULL CHECK (length(key) <= 200),
    job_id      TEXT NOT NULL,
    holder      TEXT NOT NULL,
    taken_at    REAL NOT NULL,
    expires_at  REAL NOT NULL
);
CREATE INDEX core_flow_slots_key_idx ON core_flow_slots (queue, key, expires_at);

-- The rate limit's sliding window log: one row per start, kept for the rate's period.
CREATE TABLE core_flow_starts (
    queue       TEXT NOT NULL,
    key         TEXT NOT NULL CHECK (length(key) <= 200),
    started_at  REAL NOT NULL
);
CREATE INDEX core_flow_starts_key_idx ON core_flow_starts (queue, key, started_at);

-- Keys held: a handler's back-off (until a time) or an operator's pause (until NULL).
CREATE TABLE core_flow_holds (
    queue       TEXT NOT NULL,
    key         TEXT NOT NULL CHECK (length(key) <= 200),
    kind        TEXT NOT NULL CHECK (kind IN ('backoff', 'pause')),
    until       REAL,
    reason      TEXT NOT NULL DEFAULT '' CHECK (length(reason) <= 500),
    held_by     TEXT NOT NULL DEFAULT '' CHECK (length(held_by) <= 200),
    held_at     REAL NOT NULL,
    PRIMARY KEY (queue, key, kind),
    CONSTRAINT flow_holds_until CHECK ((kind = 'pause') = (until IS NULL))
);
