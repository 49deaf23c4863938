-- The transactional outbox (SPEC O1–O3) on SQLite; see the PostgreSQL schema for the states.
-- Times are REAL epoch seconds from SQLite's clock. Relays poll (no LISTEN on SQLite).
CREATE TABLE core_outbox (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id         TEXT NOT NULL CHECK (event_id <> '' AND length(event_id) <= 255),
    queue            TEXT NOT NULL CHECK (queue <> '' AND length(queue) <= 200),
    ordering_key     TEXT CHECK (ordering_key <> '' AND length(ordering_key) <= 255),
    correlation_id   TEXT,
    payload          BLOB NOT NULL CHECK (typeof(payload) = 'blob'),
    state            TEXT NOT NULL DEFAULT 'PENDING'
                         CHECK (state IN ('PENDING', 'PUBLISHED', 'PUBLISH_FAILED_RETRY')),
    attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  REAL NOT NULL,
    claim_token      TEXT,
    claim_expires_at REAL,
    relay_id         TEXT,
    last_error       TEXT,
    history          TEXT NOT NULL DEFAULT '[]' CHECK (json_type(history) = 'array'),
    created_at       REAL NOT NULL,
    published_at     REAL,
    CONSTRAINT outbox_event_id_uq UNIQUE (event_id),
    CONSTRAINT outbox_published_at CHECK ((state = 'PUBLISHED') = (published_at IS NOT NULL)),
    CONSTRAINT outbox_claim CHECK ((claim_token IS NULL) = (claim_expires_at IS NULL))
);
CREATE INDEX core_outbox_pending_idx ON core_outbox (next_attempt_at, id) WHERE state = 'PENDING';
CREATE INDEX core_outbox_key_idx ON core_outbox (ordering_key, id)
    WHERE state <> 'PUBLISHED' AND ordering_key IS NOT NULL;
CREATE INDEX core_outbox_published_idx ON core_outbox (published_at) WHERE state = 'PUBLISHED';
CREATE INDEX core_outbox_failed_idx ON core_outbox (queue, id)
    WHERE state = 'PUBLISH_FAILED_RETRY';
