"""The batcher with a stand-in engine (no model): it batches within the wait window, keeps prompt
buckets apart, hands a streamed job its rows' progress, survives a failing batch, refuses work past
max_queue and cancels on close."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from fp4rl.serving.batcher import Batcher, QueueFull
from fp4rl.serving.engine import EngineConfig, RowRequest, RowResult


class FakeEngine:
    """Answers each row with its own prompt ids; records every batch; fails a batch holding a
    prompt that starts with 13; `gate` holds the first batch until released."""

    def __init__(self, max_batch: int = 4):
        self.config = EngineConfig(max_batch=max_batch, prompt_buckets=(8, 16), max_new_tokens=4)
        self.batches: list[list[RowRequest]] = []
        self.gate = threading.Event()
        self.gate.set()

    def bucket_of(self, n: int) -> int:
        return 8 if n <= 8 else 16

    def run_batch(self, rows, on_chunk=None):
        self.gate.wait(timeout=30)
        self.batches.append(list(rows))
        if any(r.prompt_ids[0] == 13 for r in rows):
            raise RuntimeError("device error")
        if on_chunk is not None:  # one partial result per row (its first id), as after a prefill
            on_chunk([RowResult(r.prompt_ids[:1], (0.0,), 1, None) for r in rows])
        results = [RowResult(r.prompt_ids, (0.0,) * len(r.prompt_ids), len(r.prompt_ids), "length") for r in rows]
        if on_chunk is not None:
            on_chunk(results)
        return results


def _job(first: int, length: int = 3, n: int = 1):
    return [RowRequest(tuple([first] + [5] * (length - 1)), max_tokens=4, choice=j) for j in range(n)]


@pytest.fixture
def engine():
    return FakeEngine()


def test_concurrent_jobs_share_a_batch_and_get_their_own_rows(engine):
    batcher = Batcher(engine, max_wait_ms=200.0)
    try:
        futures = [batcher.submit(_job(i, n=2 if i == 0 else 1)) for i in range(3)]  # 4 rows: one full batch
        results = [f.result(timeout=10) for f in futures]
        assert [len(b) for b in engine.batches] == [4]
        assert [[r.token_ids[0] for r in res] for res in results] == [[0, 0], [1], [2]]
        assert batcher.batch_sizes == [4]
    finally:
        batcher.close()


def test_a_streamed_job_gets_its_own_rows_progress_before_its_result(engine):
    batcher = Batcher(engine, max_wait_ms=200.0)
    try:
        seen: list[tuple] = []
        futures = [batcher.submit(_job(1, n=2), lambda results: seen.append(("a", results))), batcher.submit(_job(2)),
                   batcher.submit(_job(3), lambda results: seen.append(("b", results)))]
        results = [f.result(timeout=10) for f in futures]
        assert len(engine.batches) == 1  # one batch of 4 rows, two of its jobs streamed
        assert [(name, [r.token_ids for r in rs]) for name, rs in seen] == [
            ("a", [(1,), (1,)]), ("b", [(3,)]),  # after the "prefill", then the final rows
            ("a", [r.token_ids for r in results[0]]), ("b", [results[2][0].token_ids])]
    finally:
        batcher.close()


def test_a_lone_job_runs_after_the_wait_window(engine):
    batcher = Batcher(engine, max_wait_ms=50.0)
    try:
        t0 = time.monotonic()
        (result,) = batcher.submit(_job(7)).result(timeout=10)
        assert time.monotonic() - t0 >= 0.045 and result.token_ids[0] == 7
    finally:
        batcher.close()


def test_buckets_never_share_a_batch_and_jobs_never_split(engine):
    batcher = Batcher(engine, max_wait_ms=100.0)
    try:
        futures = [batcher.submit(_job(1, length=3, n=3)), batcher.submit(_job(2, length=12)),
                   batcher.submit(_job(3, length=3, n=2))]  # 3 + 2 rows do not fit one batch of 4
        for f in futures:
            f.result(timeout=10)
        widths = [{engine.bucket_of(len(r.prompt_ids)) for r in b} for b in engine.batches]
        assert all(len(w) == 1 for w in widths)
        assert sorted(len(b) for b in engine.batches) == [1, 2, 3]
    finally:
        batcher.close()


def test_a_failing_batch_fails_its_jobs_only(engine):
    batcher = Batcher(engine, max_wait_ms=1.0)
    try:
        with pytest.raises(RuntimeError, match="device error"):
            batcher.submit(_job(13)).result(timeout=10)
        assert batcher.submit(_job(4)).result(timeout=10)[0].token_ids[0] == 4
    finally:
        batcher.close()


def test_queue_limit_and_close(engine):
    engine.gate.clear()  # the worker blocks inside the first batch
    batcher = Batcher(engine, max_wait_ms=0.0, max_queue=4)
    running = batcher.submit(_job(1))
    deadline = time.monotonic() + 10
    while batcher.waiting_rows and time.monotonic() < deadline:  # the worker has taken it
        time.sleep(0.01)
    waiting = batcher.submit(_job(2, n=4))
    with pytest.raises(QueueFull, match="at most 4"):
        batcher.submit(_job(3))
    with pytest.raises(ValueError, match="1..4 rows"):
        batcher.submit(_job(3, n=5))
    closer = threading.Thread(target=batcher.close)
    closer.start()
    while not waiting.cancelled() and time.monotonic() < deadline:  # close() has emptied the queue
        time.sleep(0.01)
    engine.gate.set()
    closer.join(timeout=10)
    assert running.result(timeout=10)[0].token_ids[0] == 1  # the batch in progress finishes
    with pytest.raises(concurrent.futures.CancelledError):
        waiting.result(timeout=10)
    with pytest.raises(RuntimeError, match="shut down"):
        batcher.submit(_job(5))
