"""Named leases: one holder at a time for a background duty (fence cleanup, alert delivery,
a bulk replay's runner), expiring when the holder dies — and the one way a process names
itself as a holder or worker (``host:pid:random``)."""

from __future__ import annotations

import os
import socket
import uuid
from datetime import timedelta

from ..db import Database, Tx


def default_holder() -> str:
    """This process as a lease holder or worker id: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Lease:
    """A named lease row: one holder at a time for a background duty, expiring if the holder
    dies. ``renew(tx)`` inside a duty's own transaction makes its work conditional on still
    holding the lease."""

    def __init__(self, db: Database, name: str, holder: str, ttl: timedelta) -> None:
        self.db, self.name, self.holder, self.ttl = db, name, holder, ttl

    def _params(self) -> dict[str, object]:
        return {"name": self.name, "holder": self.holder, "ttl": self.ttl.total_seconds()}

    async def acquire(self) -> bool:
        async with self.db.transaction() as tx:
            return bool(await tx.q("lease_acquire", self._params()))

    async def renew(self, tx: Tx) -> bool:
        return bool(await tx.q("lease_renew", self._params()))

    async def release(self) -> None:
        async with self.db.transaction() as tx:
            await tx.q("lease_release", {"name": self.name, "holder": self.holder})

    async def current_holder(self) -> str | None:
        rows = await self.db.run("lease_holder", {"name": self.name})
        return str(rows[0]["holder"]) if rows else None
