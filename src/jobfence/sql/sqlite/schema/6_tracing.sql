-- Declared schema for tracing (issue 17 §1): migrations/0007_trace_context.sql produces exactly
-- this. The W3C trace context of a job: ``traceparent``, then a space and ``tracestate``
-- when there is one (jobfence.tracing); NULL when the producer had no trace.
ALTER TABLE core_jobs ADD COLUMN trace_context TEXT CHECK (length(trace_context) <= 1024);
ALTER TABLE core_dead_letters ADD COLUMN trace_context TEXT CHECK (length(trace_context) <= 1024);
ALTER TABLE core_outbox ADD COLUMN trace_context TEXT CHECK (length(trace_context) <= 1024);
