"""Where a profiled program's time goes: a summary of a JAX profiler trace.

`jax.profiler.trace(log_dir, create_perfetto_trace=True)` writes
`<log_dir>/plugins/profile/<run>/perfetto_trace.json.gz`, a Chrome-trace JSON: complete events
(`"ph": "X"`, start `ts` and duration `dur` in microseconds) on threads (`tid`) of processes
(`pid`) that metadata events name (`/device:GPU:0` with one thread per stream, `/host:CPU`).

`summarize` keeps the processes whose name starts with a prefix (the device by default) and
reports, per event name (a kernel, on a GPU): count, total and mean time, and share of the busy
time; and for the whole selection: the window from the first event's start to the last one's end,
the busy time (the union of all events' intervals, so overlapping streams count once), and what is
left idle. A launch-bound program shows as a small busy share of its window: many short kernels
with gaps between them.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections import defaultdict
from pathlib import Path

TRACE_FILE = "perfetto_trace.json.gz"


@dataclasses.dataclass(frozen=True)
class KernelRow:
    name: str
    count: int
    total_us: float
    mean_us: float
    busy_share: float  # of the union busy time (overlapping events can sum to more than 1)


@dataclasses.dataclass(frozen=True)
class TraceSummary:
    processes: tuple[str, ...]  # the selected processes' names
    all_processes: tuple[str, ...]
    events: int
    window_us: float
    busy_us: float
    rows: tuple[KernelRow, ...]  # by total time, longest first

    @property
    def idle_share(self) -> float:
        return 0.0 if self.window_us <= 0 else 1.0 - self.busy_us / self.window_us


def find_trace(log_dir: str | Path) -> Path:
    """The newest perfetto trace under `log_dir` (one profiler run writes one)."""
    found = sorted(Path(log_dir).rglob(TRACE_FILE), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no {TRACE_FILE} under {log_dir} (jax.profiler.trace(..., create_perfetto_trace=True))")
    return found[-1]


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by [start, end) intervals, overlaps counted once."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarize(path: str | Path, process_prefix: str = "/device:") -> TraceSummary:
    """Summary of the complete events of the processes named `process_prefix`... in a trace file."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    selected = {pid for pid, name in names.items() if name.startswith(process_prefix)}
    if not selected:
        raise ValueError(f"no process named {process_prefix}... in {path}; its processes: {sorted(names.values())}")
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e["name"])
             for e in events if e.get("ph") == "X" and e.get("pid") in selected]
    per_name: dict[str, list[float]] = defaultdict(list)
    for start, stop, name in spans:
        per_name[name].append(stop - start)
    busy = union_length([(start, stop) for start, stop, _ in spans])
    window = (max(s for _, s, _ in spans) - min(s for s, _, _ in spans)) if spans else 0.0
    rows = sorted((KernelRow(name, len(d), sum(d), sum(d) / len(d), sum(d) / busy if busy else 0.0)
                   for name, d in per_name.items()), key=lambda r: -r.total_us)
    return TraceSummary(tuple(sorted(names[p] for p in selected)), tuple(sorted(names.values())), len(spans),
                        window, busy, tuple(rows))


def markdown(summary: TraceSummary, steps: int = 1, top: int = 20, title: str = "Trace summary") -> str:
    """A table of the `top` longest event names, per call and per step (`steps` steps in the trace)."""
    per = f" per step ({steps} steps)" if steps > 1 else ""
    lines = [f"## {title}", "",
             f"Processes: {', '.join(summary.processes)}. {summary.events} events; window "
             f"{summary.window_us / steps:.1f} us{per}, busy {summary.busy_us / steps:.1f} us (union of all events), "
             f"idle {100 * summary.idle_share:.1f}% of the window.", "",
             f"| event | count{per} | total us{per} | mean us | share of busy time |", "|---|---|---|---|---|"]
    for r in summary.rows[:top]:
        name = r.name if len(r.name) <= 80 else r.name[:77] + "..."
        lines.append(f"| `{name}` | {r.count / steps:.1f} | {r.total_us / steps:.1f} | {r.mean_us:.2f} | "
                     f"{100 * r.busy_share:.1f}% |")
    if len(summary.rows) > top:
        rest = summary.rows[top:]
        lines.append(f"| ({len(rest)} more names) | {sum(r.count for r in rest) / steps:.1f} | "
                     f"{sum(r.total_us for r in rest) / steps:.1f} | | {100 * sum(r.busy_share for r in rest):.1f}% |")
    return "\n".join(lines) + "\n"


def profile_call(fn, args, log_dir: str, title: str, steps: int = 1, top: int = 20) -> str:
    """Run `fn(*args)` once under the JAX profiler (trace in `log_dir`) and return `markdown` of its
    summary: the GPU's kernels on a GPU; on the CPU (tests) the host thunks, which are what there is."""
    import jax  # only the profiling entry point needs JAX; the summary reads plain JSON

    with jax.profiler.trace(log_dir, create_perfetto_trace=True):
        jax.block_until_ready(fn(*args))
    return trace_table(log_dir, title, steps=steps, top=top)


def trace_table(log_dir: str, title: str, steps: int = 1, top: int = 20) -> str:
    """`markdown` of the summary of the trace written into `log_dir` (by `jax.profiler.trace`): the
    GPU's kernels on a GPU, the host thunks on the CPU."""
    import jax

    prefix = "/device:" if jax.default_backend() == "gpu" else "/host:"
    return markdown(summarize(find_trace(log_dir), process_prefix=prefix), steps=steps, top=top, title=title)
