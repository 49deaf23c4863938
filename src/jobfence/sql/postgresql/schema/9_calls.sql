-- Declared schema for the call ledger (issue 25, SPEC E1–E4): migrations/0012_calls.sql
-- produces exactly this. One row per (consumer, job_id, step): a handler's call to a system
-- outside the database, its idempotency key, its state (drawn in jobfence/calls/ledger.py)
-- and its outcome. Written in short transactions of their own, never in the job's.
CREATE TABLE core.calls (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        text NOT NULL,
    queue           text NOT NULL,
    job_id          text NOT NULL,
    step            text NOT NULL CHECK (length(step) BETWEEN 1 AND 200),
    idem_key        text NOT NULL CHECK (length(idem_key) BETWEEN 1 AND 255),
    partner         text,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN (
                        'pending', 'succeeded', 'failed', 'in_doubt', 'applied', 'not_applied')),
    attempts        integer NOT NULL DEFAULT 1 CHECK (attempts >= 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    outcome         jsonb CHECK (octet_length(outcome::text) <= 8192),
    reference       text CHECK (length(reference) <= 500),
    last_error      text,
    settled_by      text,
    settled_reason  text,
    settled_at      timestamptz,
    CONSTRAINT calls_job_step_uq UNIQUE (consumer, job_id, step),
    CONSTRAINT calls_settled CHECK (
        state NOT IN ('applied', 'not_applied') OR settled_at IS NOT NULL)
);
-- the calls nobody knows the outcome of yet (in doubt, or pending: sending, or its process
-- died), by age: what operators list and the in-doubt gauge counts
CREATE INDEX calls_open_idx ON core.calls (created_at) WHERE state IN ('pending', 'in_doubt');
