"""The app of a worker or relay that runs on its own (issue 23).

A :class:`~jobfence.runtime.worker.Worker` or :class:`~jobfence.outbox.relay.Relay` started
on an app nobody opened opens it, and the last of them to stop closes it: nothing they
opened (SQLite's connection thread, a pool) outlives them or keeps the process from exiting.
An app its owner opened (``async with app:``, ``await app.open()``) is left open for the
owner to close. A worker and a relay sharing an app (``jobfence relay --with-worker``) hold
it together: the first to stop does not close it under the other.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .context import RuntimeSource as App

#: how many workers and relays hold an app they opened themselves (absent: its owner's)
_HOLDERS: weakref.WeakKeyDictionary[App, int] = weakref.WeakKeyDictionary()


async def hold(app: App, pool_size: int) -> bool:
    """Open ``app`` unless it is open; True when the caller must :func:`release` it."""
    if app.is_open and app not in _HOLDERS:
        return False  # its owner's
    _HOLDERS[app] = _HOLDERS.get(app, 0) + 1  # before any await: a concurrent hold sees it
    try:
        await app.open(pool_size=pool_size)
    except BaseException:
        await release(app)
        raise
    return True


async def release(app: App) -> None:
    """One holder less; the last one closes the app."""
    left = _HOLDERS.get(app, 0) - 1
    if left > 0:
        _HOLDERS[app] = left
        return
    _HOLDERS.pop(app, None)
    await app.close()
