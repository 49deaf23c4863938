"""The threads plain ``def`` handlers run in: daemon threads, so that a handler still blocked
when the worker gives up on it (a forced stop, the end of the shutdown grace) cannot keep the
process alive past "worker stopped".

:class:`concurrent.futures.ThreadPoolExecutor` joins its threads when the interpreter exits, so
a handler in ``time.sleep(60)`` holds the process for a minute after the worker stopped. Here
the interpreter leaves the threads behind instead. That is safe because such a thread holds no
transaction of its own: its statements run on the event loop through
:class:`jobfence.db.SyncTx`, which the harness marks ended when it gives up on the job (the
transaction rolls back, and a statement the thread sends later is refused); a process that
exits takes its connections, and any open transaction, with it.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")

_pools = itertools.count(1)


class DaemonThreadPool(Executor):
    """A small executor of daemon threads, started on demand, at most ``max_workers``."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "jobfence-handler") -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.max_workers = max_workers
        self._prefix = f"{thread_name_prefix}-{next(_pools)}"
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new work after shutdown")
            future: Future[T] = Future()
            self._work.put((future, lambda: fn(*args, **kwargs)))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self.max_workers:
                thread = threading.Thread(
                    target=self._serve,
                    name=f"{self._prefix}_{len(self._threads)}",
                    daemon=True,
                )
                thread.start()
                self._threads.append(thread)
        return future

    def _serve(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                self._work.put(None)  # wake the next thread: shutting down
                return
            future, call = item
            if future.set_running_or_notify_cancel():
                try:
                    result = call()
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del item, future, call
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking work. ``cancel_futures`` cancels what has not started; ``wait`` joins
        the threads (a blocked handler blocks it: the worker passes ``wait=False``)."""
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while True:
                    try:
                        item = self._work.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            self._work.put(None)
        if wait:
            for thread in self._threads:
                thread.join()
