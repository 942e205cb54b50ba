"""Dynamic batching: concurrent requests collected for up to `max_wait_ms` and run as one batch.

A job is one prompt with its n rows. Jobs wait in one FIFO queue per prompt bucket (rows of one
bucket only are batched together, so a result never depends on its companions: `engine`). A
single worker thread takes the bucket whose oldest job has waited longest, waits until that
bucket holds `max_batch` rows or its oldest job is `max_wait_ms` old, then runs whole jobs from
the front of the queue while they fit one batch. A job never spans two batches (n <= max_batch
is checked at submission). The engine runs on the worker thread only; the HTTP handlers wait on
the jobs' futures, so the event loop keeps accepting requests while a batch runs. A job with a
`progress` callback (a streamed request) gets its rows' results so far after every decode chunk
of its batch, on the worker thread (`Engine.run_batch`'s on_chunk), before its future is set.

Backpressure: `submit` refuses a job (QueueFull) when the rows waiting would exceed `max_queue`.
An exception inside a batch fails that batch's jobs only; the worker keeps serving.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence

from fp4rl.serving.engine import Engine, RowRequest, RowResult


class QueueFull(RuntimeError):
    """More rows are waiting than the server's max_queue."""


Progress = Callable[[list[RowResult]], None]


@dataclasses.dataclass
class _Job:
    rows: Sequence[RowRequest]
    future: concurrent.futures.Future
    arrived: float
    progress: Progress | None = None


class Batcher:
    def __init__(self, engine: Engine, max_wait_ms: float = 5.0, max_queue: int = 1024):
        if max_wait_ms < 0 or max_queue < engine.config.max_batch:
            raise ValueError(f"need {max_wait_ms=} >= 0 and {max_queue=} >= max_batch={engine.config.max_batch}")
        self.engine, self.max_wait_s, self.max_queue = engine, max_wait_ms / 1000.0, max_queue
        self._queues: dict[int, collections.deque[_Job]] = {w: collections.deque() for w in engine.config.prompt_buckets}
        self._waiting_rows = 0
        self._cond = threading.Condition()
        self._stopping = False
        self.batch_sizes: list[int] = []  # real rows of each batch run (for /health and the tests)
        self._thread = threading.Thread(target=self._loop, name="fp4rl-batcher", daemon=True)
        self._thread.start()

    @property
    def waiting_rows(self) -> int:
        return self._waiting_rows

    def submit(self, rows: Sequence[RowRequest],
               progress: Progress | None = None) -> concurrent.futures.Future:
        """Queue one job (the rows of one prompt, one bucket); its future gets list[RowResult].
        progress: called with the rows' results so far as their batch decodes (module docstring)."""
        B = self.engine.config.max_batch
        if not 1 <= len(rows) <= B:
            raise ValueError(f"a job has 1..{B} rows (n choices of one prompt), not {len(rows)}")
        widths = {self.engine.bucket_of(len(r.prompt_ids)) for r in rows}
        if len(widths) != 1:
            raise ValueError("the rows of one job must share one prompt")
        job = _Job(rows, concurrent.futures.Future(), time.monotonic(), progress)
        with self._cond:
            if self._stopping:
                raise RuntimeError("the batcher is shut down")
            if self._waiting_rows + len(rows) > self.max_queue:
                raise QueueFull(f"{self._waiting_rows} rows are waiting; this server queues at most {self.max_queue}")
            self._queues[widths.pop()].append(job)
            self._waiting_rows += len(rows)
            self._cond.notify()
        return job.future

    def _take(self) -> list[_Job] | None:
        """The next batch's jobs, after waiting as the module docstring says; None when stopping."""
        B = self.engine.config.max_batch
        with self._cond:
            while True:
                if self._stopping:
                    return None
                ready = [q for q in self._queues.values() if q]
                if not ready:
                    self._cond.wait()
                    continue
                queue = min(ready, key=lambda q: q[0].arrived)
                rows = sum(len(j.rows) for j in queue)
                remaining = queue[0].arrived + self.max_wait_s - time.monotonic()
                if rows >= B or remaining <= 0:
                    break
                self._cond.wait(timeout=remaining)
            jobs, used = [], 0
            while queue and used + len(queue[0].rows) <= B:
                job = queue.popleft()
                jobs.append(job)
                used += len(job.rows)
            self._waiting_rows -= used
            return jobs

    def _loop(self) -> None:
        while (jobs := self._take()) is not None:
            live = [j for j in jobs if j.future.set_running_or_notify_cancel()]
            if not live:
                continue
            listening = any(j.progress is not None for j in live)
            try:
                results = self.engine.run_batch([r for j in live for r in j.rows],
                                                self._on_chunk(live) if listening else None)
            except Exception as e:  # noqa: BLE001  the jobs of this batch fail; the server goes on
                for j in live:
                    j.future.set_exception(e)
                continue
            self.batch_sizes.append(len(results))
            start = 0
            for j in live:
                j.future.set_result(results[start:start + len(j.rows)])
                start += len(j.rows)

    @staticmethod
    def _on_chunk(live: list[_Job]) -> Callable[[list[RowResult]], None]:
        def on_chunk(results: list[RowResult]) -> None:
            start = 0
            for j in live:
                if j.progress is not None:
                    j.progress(results[start:start + len(j.rows)])
                start += len(j.rows)

        return on_chunk

    def close(self) -> None:
        """Stop the worker after its current batch; waiting jobs are cancelled."""
        with self._cond:
            self._stopping = True
            for q in self._queues.values():
                while q:
                    q.popleft().future.cancel()
            self._waiting_rows = 0
            self._cond.notify_all()
        self._thread.join()

