"""Reference applications built on jobfence, shipped with it but outside the library.

- :mod:`jobfence_examples.points` — the points-crediting demo (``jobfence demo``).
- :mod:`jobfence_examples.purchase_orders` — the purchase-order reference service
  (``jobfence demo purchase-orders``; see its ``README.md``).

They import only jobfence's public API: the names in ``jobfence.__all__`` and the public
modules :mod:`jobfence.http`, :mod:`jobfence.ops` and :mod:`jobfence.outbox`
(``tests/test_public_api.py`` checks it).
"""
