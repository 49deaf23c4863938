"""The ops API's routes, one FastAPI router per resource: :mod:`.stats` (``/healthz``,
``/metrics``, ``/v1/stats``), :mod:`.dead_letters`, :mod:`.replays`, :mod:`.audit` and
:mod:`.outbox` (also mountable on its own, e.g. by the purchase-order service)."""
