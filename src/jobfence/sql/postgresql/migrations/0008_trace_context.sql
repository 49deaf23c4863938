-- 0008: the W3C trace context of a job (issue 17 §1), carried with it through the queue, its
-- dead letter and the outbox: ``traceparent``, then a space and ``tracestate`` when there
-- is one (jobfence.tracing). NULL when the producer had no trace (or no tracing).
ALTER TABLE core.jobs
    ADD COLUMN trace_context text CHECK (length(trace_context) <= 1024);
ALTER TABLE core.dead_letters
    ADD COLUMN trace_context text CHECK (length(trace_context) <= 1024);
ALTER TABLE core.outbox
    ADD COLUMN trace_context text CHECK (length(trace_context) <= 1024);
