-- Declared schema for tracing (issue 17 §1): migrations/0008_trace_context.sql produces exactly
-- this. The W3C trace context of a job: ``traceparent``, then a space and ``tracestate``
-- when there is one (jobfence.tracing); NULL when the producer had no trace.
ALTER TABLE core.jobs
    ADD COLUMN trace_context text CHECK (length(trace_context) <= 1024);
ALTER TABLE core.dead_letters
    ADD COLUMN trace_context text CHECK (length(trace_context) <= 1024);
ALTER TABLE core.outbox
    ADD COLUMN trace_context text CHECK (length(trace_context) <= 1024);
