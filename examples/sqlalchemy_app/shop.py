"""An order API (FastAPI + SQLAlchemy) and the worker that ships its orders, with jobfence.

- ``POST /orders`` with an ``Idempotency-Key`` header writes the order and an outbox event
  in **one** SQLAlchemy session: the event exists only if the order does. The same key again
  gets the same answer (jobfence's idempotency middleware), and the key is also unique on
  the order row, so even a retry after a crash cannot create a second order.
- ``jobfence relay shop:jobs --with-worker`` publishes the events and runs the worker:
  ``ship`` gets an ``AsyncSession`` joined to the transaction that holds the job's fence, so
  the shipment row is written exactly once, however often the event is delivered.

Run it (see README.md): ``python shop.py`` creates the tables, ``jobfence migrate --app
shop:jobs`` jobfence's, ``uvicorn shop:api`` serves the API.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field
from sqlalchemy import ForeignKey, String, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import jobfence
from jobfence import outbox
from jobfence.http import IdempotencyMiddleware, idempotency_of

DATABASE_URL = os.environ.get("SHOP_DATABASE_URL", "sqlite+aiosqlite:///shop.db")

engine = create_async_engine(DATABASE_URL)
Session = async_sessionmaker(engine, expire_on_commit=False)
jobs = jobfence.App(engine=engine)  # the fence lives in the shop's own database


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    idempotency_key: Mapped[str] = mapped_column(String(255), unique=True)
    sku: Mapped[str] = mapped_column(String(64))
    quantity: Mapped[int]


class Shipment(Base):
    __tablename__ = "shipments"

    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id"), primary_key=True)
    sku: Mapped[str] = mapped_column(String(64))
    quantity: Mapped[int]


class OrderIn(BaseModel):
    sku: str = Field(min_length=1, max_length=64)
    quantity: int = Field(gt=0)


class OrderPlaced(BaseModel):
    order_id: int
    sku: str
    quantity: int


# -- the worker side --------------------------------------------------------------------------


@jobs.consumer("orders.placed", schema=OrderPlaced)
async def ship(job: jobfence.Job[OrderPlaced], session: AsyncSession) -> None:
    """Runs in the transaction that holds the job's fence: return to commit, raise to roll
    back (and retry); ``session.commit()`` here is a savepoint, not the end of the job."""
    order = await session.get(Order, job.payload.order_id)
    if order is None:
        raise jobfence.BusinessError(f"order {job.payload.order_id} does not exist")
    session.add(Shipment(order_id=order.id, sku=order.sku, quantity=order.quantity))


# -- the HTTP side ----------------------------------------------------------------------------


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    async with jobs:  # jobfence's pool, for the idempotency keys
        yield
    await engine.dispose()


api = FastAPI(title="shop", lifespan=lifespan)
api.add_middleware(
    IdempotencyMiddleware,
    database=lambda: jobs.db,
    match=lambda method, path: method == "POST" and path == "/orders",
)


def _answer(order: Order) -> dict[str, Any]:
    return {"id": order.id, "sku": order.sku, "quantity": order.quantity}


@api.post("/orders", status_code=201)
async def place_order(body: OrderIn, request: Request) -> dict[str, Any]:
    context = idempotency_of(request)
    key = context.key if context is not None else ""
    async with Session() as session, session.begin():
        existing = await session.scalar(select(Order).where(Order.idempotency_key == key))
        if existing is not None:  # a retry after a crash: the first attempt committed
            return _answer(existing)
        order = Order(idempotency_key=key, sku=body.sku, quantity=body.quantity)
        session.add(order)
        await session.flush()  # the order's id
        await outbox.write(
            session,
            "orders.placed",
            {"order_id": order.id, "sku": order.sku, "quantity": order.quantity},
            event_id=f"order-{order.id}",  # the job_id the worker fences on
        )
    return _answer(order)  # committed: the order and its event, together


async def create_tables() -> None:
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(create_tables())
    print("tables created")
