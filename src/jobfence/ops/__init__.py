"""The ops HTTP API (SPEC K3) for operators: dead letters, replays, audit, stats, metrics.

FastAPI, started with ``jobfence ops serve``; :func:`jobfence.ops.app.create_app` builds it.
Authentication lives in :mod:`jobfence.ops.auth`. This package needs ``jobfence[ops]``.
"""
