"""The profiler-trace summary: exact on a hand-made trace, and it reads a real JAX profiler trace."""

from __future__ import annotations

import gzip
import json

import jax
import jax.numpy as jnp
import pytest

from fp4rl.analysis import trace_summary


def _write(path, events):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": events}, f)
    return path


def _meta(pid, name):
    return {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}


def _x(pid, tid, ts, dur, name):
    return {"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": name}


def test_union_counts_overlaps_once():
    assert trace_summary.union_length([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17
    assert trace_summary.union_length([]) == 0


def test_hand_made_trace_two_streams_and_a_host(tmp_path):
    events = [_meta(1, "/device:GPU:0"), _meta(2, "/host:CPU"),
              _x(1, 7, 0.0, 10.0, "gemm"), _x(1, 8, 5.0, 10.0, "gemm"),  # two streams overlapping by 5
              _x(1, 7, 30.0, 2.0, "quantize"), _x(1, 7, 38.0, 2.0, "quantize"),
              _x(2, 9, 0.0, 1000.0, "host work")]  # another process: not counted
    summary = trace_summary.summarize(_write(tmp_path / "t.json.gz", events))
    assert summary.processes == ("/device:GPU:0",) and summary.events == 4
    assert summary.window_us == 40.0 and summary.busy_us == 19.0  # [0, 15) + [30, 32) + [38, 40)
    assert summary.idle_share == pytest.approx(21 / 40)
    gemm, quantize = summary.rows
    assert (gemm.name, gemm.count, gemm.total_us, gemm.mean_us) == ("gemm", 2, 20.0, 10.0)
    assert (quantize.name, quantize.count, quantize.total_us) == ("quantize", 2, 4.0)
    text = trace_summary.markdown(summary, steps=2)
    assert "window 20.0 us per step (2 steps), busy 9.5 us" in text and "idle 52.5%" in text
    assert "| `gemm` | 1.0 | 10.0 | 10.00 | 105.3% |" in text


def _k(ts, dur, module, run_id=None):  # a device kernel of program `module`
    args = {"hlo_module": module} | ({} if run_id is None else {"run_id": run_id})
    return {"ph": "X", "pid": 1, "tid": 7, "ts": ts, "dur": dur, "name": "k", "args": args}


def test_per_program_idle_inside_and_between_executions(tmp_path):
    events = [_meta(1, "/device:GPU:0"),
              _k(0.0, 10.0, "update", 1), _k(20.0, 5.0, "update", 1),  # span 25, busy 15
              _k(30.0, 10.0, "sample"), _k(45.0, 5.0, "sample"),  # no run_id: one run until another module
              _k(60.0, 2.0, "update", 2), _k(62.0, 2.0, "update", 3),  # back to back, two run_ids
              _x(1, 7, 70.0, 5.0, "memcpy")]  # no module: in the kernel table only
    summary = trace_summary.summarize(_write(tmp_path / "t.json.gz", events))
    update, sample = summary.modules
    assert (update.name, update.executions, update.events, update.busy_us, update.span_us) == ("update", 3, 4, 19.0, 29.0)
    assert (sample.name, sample.executions, sample.events, sample.busy_us, sample.span_us) == ("sample", 1, 2, 15.0, 20.0)
    assert update.idle_inside_us == 10.0 and sample.idle_inside_us == 5.0
    text = trace_summary.markdown(summary)
    assert "| `update` | 3.0 | 4.0 | 19.0 | 29.0 | 10.0 |" in text
    assert "| (outside every program's executions) | | | | | 26.0 |" in text  # window 75 - spans 49


def test_a_missing_process_names_the_ones_there(tmp_path):
    path = _write(tmp_path / "t.json.gz", [_meta(2, "/host:CPU"), _x(2, 9, 0.0, 1.0, "x")])
    with pytest.raises(ValueError, match=r"no process named /device:\.\.\..*\['/host:CPU'\]"):
        trace_summary.summarize(path)


def test_reads_a_jax_profiler_trace(tmp_path):
    f = jax.jit(lambda x: jnp.tanh(x @ x).sum())
    x = jnp.ones((64, 64))
    f(x).block_until_ready()
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
        for _ in range(3):
            f(x).block_until_ready()
    summary = trace_summary.summarize(trace_summary.find_trace(tmp_path), process_prefix="/host:")
    assert summary.events > 0 and 0 < summary.busy_us <= summary.window_us
    calls = [r.count for r in summary.rows if r.name.startswith("PjitFunction")]
    assert calls and calls[0] >= 3 and calls[0] % 3 == 0  # each of the 3 calls (one or two events each)
    program = [m for m in summary.modules if "jit" in m.name]
    assert program and program[0].executions >= 3 and program[0].busy_us <= program[0].span_us


def test_decode_benchmark_profile_adds_the_summary_to_its_markdown(tmp_path):
    from experiments import bench_decode

    config = bench_decode.DecodeBenchConfig(model="tiny", recipes=("bf16",), batch=2, prompt_len=4, new_tokens=4,
                                            iters=1, profile=str(tmp_path / "trace"))
    result = bench_decode.run(config)
    text = bench_decode.to_markdown(result)
    assert "## Where a `bf16, expert_gemm=xla` decode call's time goes" in text and "per step (4 steps)" in text
    assert trace_summary.find_trace(tmp_path / "trace" / "bf16-xla").is_file()
