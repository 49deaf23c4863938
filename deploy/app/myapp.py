"""The application the deployment example runs: replace it with yours.

``jobfence worker myapp:app`` imports this module (the image puts /app on PYTHONPATH). The
database comes from ``JOBFENCE_DATABASE_URL`` (a Kubernetes Secret, or compose's .env); the
queue from ``JOBFENCE_TRANSPORT`` when it is not the database. With
``OTEL_EXPORTER_OTLP_ENDPOINT`` set and the OpenTelemetry SDK installed (the image has it),
traces go to that collector (docs/tracing.md): jobfence uses the OpenTelemetry API, and the
application configures the SDK, as here.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from jobfence import App, Job, Tx

log = logging.getLogger("myapp")


def _tracing() -> None:
    """Send spans to ``$OTEL_EXPORTER_OTLP_ENDPOINT`` (OTLP over HTTP) when it is set."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is missing")
        return
    provider = TracerProvider(resource=Resource.create())  # OTEL_SERVICE_NAME names it
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


_tracing()

app = App(os.environ["JOBFENCE_DATABASE_URL"], transport=os.environ.get("JOBFENCE_TRANSPORT"))


@app.consumer("points.credit")
async def credit(job: Job[dict[str, Any]], tx: Tx) -> None:
    """The effect goes in ``tx``, with the job's fence row: it commits once per job_id."""
    await tx.execute("SELECT 1")  # your INSERT/UPDATE here
    log.info("credited", extra={"job_id": job.job_id, "payload": job.payload})
