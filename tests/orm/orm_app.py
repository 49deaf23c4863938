"""An app built from a SQLAlchemy engine, for the tests and for a worker subprocess.

Environment (subprocess use): JF_DB (a jobfence database URL), JF_MARKS (a folder for marker
files), JF_LEASE (seconds). Payload ``{"member_id": …, "points": …, "mode": …}``;
``mode="hang-in-tx"`` flushes the ORM row, drops a marker and hangs inside the transaction
(attempt 1 only). ``app`` is built from an ``AsyncEngine`` (``async def`` handler with an
``AsyncSession``), ``sync_app`` from an ``Engine`` (``def`` handler with a ``Session``).
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, String, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import jobfence
from jobfence import Job


class Base(DeclarativeBase):
    pass


class Credit(Base):
    __tablename__ = "orm_credits"

    job_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    member_id: Mapped[str] = mapped_column(String(200))
    points: Mapped[int]


def engine_url(url: str) -> str:
    """The SQLAlchemy URL of a jobfence database URL (psycopg 3 / aiosqlite)."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return "sqlite+aiosqlite:///" + url.removeprefix("sqlite:///")


def make_engine(url: str) -> AsyncEngine:
    return (
        create_async_engine(engine_url(url), pool_size=40, max_overflow=0)
        if url.startswith("postgresql")
        else create_async_engine(engine_url(url))
    )


def sync_engine_url(url: str) -> str:
    """The SQLAlchemy URL of a jobfence database URL for a synchronous engine (psycopg 3 /
    sqlite3)."""
    return engine_url(url).replace("sqlite+aiosqlite:", "sqlite:")


def make_sync_engine(url: str) -> Engine:
    if url.startswith("postgresql"):
        return create_engine(sync_engine_url(url), pool_size=40, max_overflow=0)
    # the worker's threads queue for SQLite's one writer: wait rather than fail at 5 s
    return create_engine(sync_engine_url(url), connect_args={"timeout": 30})


def build_sync(url: str, **kwargs: Any) -> tuple[jobfence.App, Engine]:
    engine = make_sync_engine(url)
    return jobfence.App(engine=engine, **kwargs), engine


async def create_tables(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)


def build(url: str, **kwargs: Any) -> tuple[jobfence.App, AsyncEngine]:
    engine = make_engine(url)
    return jobfence.App(engine=engine, **kwargs), engine


# -- the subprocess worker's app --------------------------------------------------------------

if "JF_DB" in os.environ:
    MARKS = Path(os.environ.get("JF_MARKS", "."))
    app, engine = build(
        os.environ["JF_DB"], lease=timedelta(seconds=float(os.environ.get("JF_LEASE", "2")))
    )

    @app.consumer("orm.credit")
    async def handle(job: Job[dict[str, Any]], session: AsyncSession) -> None:
        session.add(
            Credit(job_id=job.job_id, member_id=job.payload["member_id"], points=job.attempt)
        )
        await session.flush()
        if job.payload.get("mode") == "hang-in-tx" and job.attempt == 1:
            (MARKS / f"{job.job_id}.in-tx").write_text(str(os.getpid()))
            await asyncio.sleep(3600)

    sync_app, sync_engine = build_sync(
        os.environ["JF_DB"], lease=timedelta(seconds=float(os.environ.get("JF_LEASE", "2")))
    )

    @sync_app.consumer("orm.credit")
    def handle_sync(job: Job[dict[str, Any]], session: Session) -> None:
        session.add(
            Credit(job_id=job.job_id, member_id=job.payload["member_id"], points=job.attempt)
        )
        session.flush()
        if job.payload.get("mode") == "hang-in-tx" and job.attempt == 1:
            (MARKS / f"{job.job_id}.in-tx").write_text(str(os.getpid()))
            time.sleep(3600)
