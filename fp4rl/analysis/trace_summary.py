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
with gaps between them. Per program (the events' `hlo_module`, one execution per `run_id`): its
executions, kernels, busy time and the span of its executions, so the idle time splits into gaps
inside programs (launches, host round trips of while-loop conditions) and gaps between them (the
host's own work, dispatch).
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
class ModuleRow:
    name: str  # hlo_module
    executions: int
    events: int
    busy_us: float  # union of its events' intervals
    span_us: float  # sum over executions of first start to last end

    @property
    def idle_inside_us(self) -> float:
        return self.span_us - self.busy_us


@dataclasses.dataclass(frozen=True)
class TraceSummary:
    processes: tuple[str, ...]  # the selected processes' names
    all_processes: tuple[str, ...]
    events: int
    window_us: float
    busy_us: float
    rows: tuple[KernelRow, ...]  # by total time, longest first
    modules: tuple[ModuleRow, ...] = ()  # by span, longest first; events without hlo_module left out

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
    selected_events = [e for e in events if e.get("ph") == "X" and e.get("pid") in selected]
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e["name"]) for e in selected_events]
    per_name: dict[str, list[float]] = defaultdict(list)
    for start, stop, name in spans:
        per_name[name].append(stop - start)
    window = (max(s for _, s, _ in spans) - min(s for s, _, _ in spans)) if spans else 0.0
    # the union lies inside the window; summing its pieces can round past it by an ulp
    busy = min(union_length([(start, stop) for start, stop, _ in spans]), window)
    rows = sorted((KernelRow(name, len(d), sum(d), sum(d) / len(d), sum(d) / busy if busy else 0.0)
                   for name, d in per_name.items()), key=lambda r: -r.total_us)
    return TraceSummary(tuple(sorted(names[p] for p in selected)), tuple(sorted(names.values())), len(spans),
                        window, busy, tuple(rows), module_rows(selected_events))


def module_rows(events: list[dict]) -> tuple[ModuleRow, ...]:
    """Per `hlo_module` of the complete events' args: executions, events, busy union and the summed
    span of its executions. An execution is a maximal run of time-ordered events with the same
    module and `run_id` (device kernels may carry no run_id: then a run ends where another
    module's event starts)."""
    tagged = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e["args"]["hlo_module"],
                     str(e["args"].get("run_id", ""))) for e in events if "hlo_module" in (e.get("args") or {}))
    executions: dict[str, list[list[tuple[float, float]]]] = defaultdict(list)
    previous = None
    for start, stop, module, run_id in tagged:
        if (module, run_id) != previous:
            executions[module].append([])
            previous = (module, run_id)
        executions[module][-1].append((start, stop))
    rows = []
    for name, runs in executions.items():
        intervals = [iv for run in runs for iv in run]
        span = sum(max(b for _, b in run) - min(a for a, _ in run) for run in runs)
        rows.append(ModuleRow(name, len(runs), len(intervals), union_length(intervals), span))
    return tuple(sorted(rows, key=lambda r: -r.span_us))


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
    if summary.modules:
        lines += ["", module_markdown(summary, steps=steps, top=top)]
    return "\n".join(lines) + "\n"


def module_markdown(summary: TraceSummary, steps: int = 1, top: int = 20) -> str:
    """Per program: executions, events, busy and span per step, and the idle inside its executions;
    the last line is the window's idle outside every program's executions (host work, dispatch)."""
    per = " per step" if steps > 1 else ""
    lines = [f"| program | executions{per} | events{per} | busy us{per} | span us{per} | idle inside us{per} |",
             "|---|---|---|---|---|---|"]
    for m in summary.modules[:top]:
        lines.append(f"| `{m.name[:80]}` | {m.executions / steps:.1f} | {m.events / steps:.1f} | {m.busy_us / steps:.1f} | "
                     f"{m.span_us / steps:.1f} | {m.idle_inside_us / steps:.1f} |")
    outside = summary.window_us - sum(m.span_us for m in summary.modules)
    lines.append(f"| (outside every program's executions) | | | | | {outside / steps:.1f} |")
    return "\n".join(lines)


def profile_call(fn, args, log_dir: str, title: str, steps: int = 1, top: int = 20) -> str:
    """Run `fn(*args)` once under the JAX profiler (trace in `log_dir`) and return `markdown` of its
    summary: the GPU's kernels on a GPU; on the CPU (tests) the host thunks, which are what there is."""
    return profiled(fn, args, log_dir, title, steps=steps, top=top)[1]


def profiled(fn, args, log_dir: str, title: str, steps: int = 1, top: int = 20):
    """`profile_call` that returns `fn(*args)` (finished) beside the table."""
    import jax  # only the profiling entry point needs JAX; the summary reads plain JSON

    with jax.profiler.trace(log_dir, create_perfetto_trace=True):
        out = jax.block_until_ready(fn(*args))
    return out, trace_table(log_dir, title, steps=steps, top=top)


def trace_table(log_dir: str, title: str, steps: int = 1, top: int = 20) -> str:
    """`markdown` of the summary of the trace written into `log_dir` (by `jax.profiler.trace`): the
    GPU's kernels on a GPU, the host thunks on the CPU."""
    import jax

    prefix = "/device:" if jax.default_backend() == "gpu" else "/host:"
    return markdown(summarize(find_trace(log_dir), process_prefix=prefix), steps=steps, top=top, title=title)
