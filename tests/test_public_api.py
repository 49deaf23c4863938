"""jobfence's public API is what ``jobfence.__all__`` says (the way httpx tests its exports).

A name imported into ``jobfence/__init__.py`` is either exported or private (``_name``), so
``__all__`` can neither miss a name nor list one that is gone.
"""

from __future__ import annotations

import types

import jobfence

#: dunder names that are exported on purpose
EXPORTED_DUNDERS = {"__version__"}


def public_names(module: types.ModuleType) -> set[str]:
    """Names bound in ``module`` that do not start with ``_``, except submodules (importing
    ``jobfence.x`` anywhere binds ``x`` on the package)."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }


def test_all_is_exactly_the_public_names_of_the_package() -> None:
    assert set(jobfence.__all__) == public_names(jobfence) | EXPORTED_DUNDERS


def test_all_has_no_duplicates() -> None:
    assert len(jobfence.__all__) == len(set(jobfence.__all__))


def test_every_name_in_all_is_importable() -> None:
    namespace: dict[str, object] = {}
    exec("from jobfence import *", namespace)  # the star import is what __all__ governs
    assert [name for name in jobfence.__all__ if name not in namespace] == []
