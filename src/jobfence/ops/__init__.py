"""The ops HTTP API (SPEC K3) for operators: dead letters, replays, audit, stats, metrics.

FastAPI, started with ``jobfence ops serve``; :func:`jobfence.ops.app.create_app` builds it from
one router per resource (:mod:`jobfence.ops.routes`). Authentication lives in
:mod:`jobfence.ops.auth`. This package needs ``jobfence[ops]``.
"""

from ..errors import require_extra

require_extra("ops", "jobfence.ops (the ops API)", "fastapi")
