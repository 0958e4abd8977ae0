"""The one thread that runs a server's model work: loading, warm-up, every step and every prefill.

Why one thread: torch's CPU kernels run on OpenMP (libgomp in the PyPI wheels), and libgomp keeps a team of worker
threads for every thread that has started a parallel region. Once the teams hold more threads than the machine has
cores, libgomp's workers spin only briefly before sleeping (its "throttled" spin), so every parallel region pays a
futex wake-up. A server that loaded the model in one executor thread and stepped it in another paid that on each
of the hundreds of regions of a decode step, a large part of every step (benchmarks/results/measured-in-place.md).
Work that never leaves this thread keeps a single team.

A daemon thread (unlike ``ThreadPoolExecutor``'s workers, which interpreter exit joins): a step that never returns
must not keep a dying server alive.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any


class ComputeThread(Executor):
    """An executor of one daemon thread; jobs run in submission order. ``loop.run_in_executor(compute, fn)``
    awaits one from the event loop; a long-running job (the engine loop) holds the thread until it returns."""

    def __init__(self, name: str = "compute") -> None:
        self._jobs: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple, dict] | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._work, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        with self._lock:
            if self._closed:
                raise RuntimeError("the compute thread is shut down")
            fut: Future = Future()
            self._jobs.put((fut, fn, args, kwargs))
        return fut

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                if cancel_futures:
                    self._cancel_queued()
                self._jobs.put(None)
        if wait and threading.current_thread() is not self.thread:
            self.thread.join()

    def _cancel_queued(self) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job[0].cancel()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fut, fn, args, kwargs = job
            del job
            if fut.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the job
                    fut.set_exception(exc)
                else:
                    fut.set_result(result)
            del fut, fn, args, kwargs  # hold nothing of a finished job while waiting for the next
