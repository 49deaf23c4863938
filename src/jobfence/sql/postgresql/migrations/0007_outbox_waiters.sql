-- 0007: the relay's claim walks pending events only; outbox writers notify only while a relay
-- waits for them (issue 16 §2).
--
-- A NOTIFY makes its transaction take a database-wide lock at commit, which serialises every
-- committing writer that notifies; one per outbox insert capped concurrent writers (an
-- HTTP ingestion path writes one event per request). An idle relay now registers here
-- (until when it will sleep) before it waits; writers notify only while such a row is
-- current, and a relay that has work deletes its row.
-- Relays claim pending events in id order: one index range over the pending ones, not a walk
-- of the primary key past every event published before them.
CREATE INDEX outbox_pending_id_idx ON core.outbox (id) WHERE state = 'PENDING';

CREATE TABLE core.outbox_waiters (
    relay_id text PRIMARY KEY CHECK (relay_id <> '' AND length(relay_id) <= 200),
    until timestamptz NOT NULL
);

CREATE OR REPLACE FUNCTION core.outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A relay about to wait registers, then takes this lock exclusively (waiting for every
    -- writer that holds it shared, i.e. that saw no waiter), then looks for events again:
    -- a writer that cannot take it shared, or sees a waiter, notifies.
    IF NOT pg_try_advisory_xact_lock_shared(1785292399, 1)
       OR EXISTS (SELECT 1 FROM core.outbox_waiters WHERE until > now()) THEN
        PERFORM pg_notify('jobfence_outbox', '');
    END IF;
    RETURN NULL;
END;
$$;
