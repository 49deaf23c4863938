# jobfence's image: the worker (default) and `jobfence ops serve` (the ops API and console),
# `jobfence relay` and `jobfence migrate`, from one image. docs/deployment.md walks through it;
# tests/deploy/test_manifests.py lints it with hadolint and checks the rules below (a pinned base,
# a non-root user, no ADD of URLs, a HEALTHCHECK).
#
#   docker build -t jobfence:dev .
#   docker run --rm -e JOBFENCE_DATABASE_URL=postgresql://… jobfence:dev                # a worker
#   docker run --rm -p 8089:8089 -e JOBFENCE_DATABASE_URL=… jobfence:dev ops serve     # the ops API
#
# Your application: replace deploy/app/ (myapp:app) with your package, or build FROM this
# image and COPY it into /app.

ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG EXTRAS=ops,otel
# the OpenTelemetry SDK and OTLP exporter the example app configures (deploy/app/myapp.py)
ARG EXTRA_PACKAGES="opentelemetry-sdk>=1.20 opentelemetry-exporter-otlp-proto-http>=1.20"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/jobfence
COPY pyproject.toml README.md ./
COPY src ./src
RUN /opt/jobfence/bin/pip install ".[${EXTRAS}]" ${EXTRA_PACKAGES}

FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 jobfence \
    && useradd --system --uid 10001 --gid jobfence --home-dir /app --no-create-home jobfence
COPY --from=build /opt/jobfence /opt/jobfence
COPY deploy/app /app
WORKDIR /app
ENV PATH=/opt/jobfence/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    JOBFENCE_LOG_FORMAT=json \
    JOBFENCE_METRICS_HOST=0.0.0.0 \
    JOBFENCE_METRICS_PORT=9108 \
    JOBFENCE_OPS_HOST=0.0.0.0
USER 10001:10001
# 9108: a worker's (or relay's) /metrics, /livez, /readyz; 8089: `ops serve`
EXPOSE 9108 8089
# the worker's liveness; `ops serve` containers override it with /healthz (compose, probes)
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/livez' % os.environ.get('JOBFENCE_METRICS_PORT', '9108'), timeout=2)"]
ENTRYPOINT ["jobfence"]
CMD ["worker", "myapp:app"]
