"""Run a Python module in this process and record its device usage, also when it fails.

    python tools/measure_usage.py USAGE.json -m experiments.gradients --preset ladder-w512-l6 ...

Writes USAGE.json (`fp4rl.analysis.scaling_usage` reads it): the command, "ok" or "failed" with the
error's last lines, whether it ran out of device memory and the failed request's bytes (XLA's
"RESOURCE_EXHAUSTED: Out of memory while trying to allocate N bytes"), the allocator's peak bytes in use
and limit (the largest over the devices; null where the platform keeps no statistics, as XLA:CPU),
the device kind and the wall seconds. Exits with the module's status. In-process, so that the peak is
the module's own: another process cannot read the allocator's statistics, and a failed run's peak is
read after the error, before the process ends.
"""

from __future__ import annotations

import datetime
import json
import re
import runpy
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages (experiments, fp4rl)

OOM_PATTERNS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")
_REQUEST = re.compile(r"(?:trying to allocate|allocate)\s+([0-9.]+)\s*([KMGT]i?B|bytes|B)?", re.I)
_UNITS = {"": 1, "b": 1, "bytes": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def requested_bytes(text: str) -> int | None:
    """The failed allocation's size in an out-of-memory message, or None."""
    match = _REQUEST.search(text)
    if not match:
        return None
    return int(float(match[1]) * _UNITS[(match[2] or "").lower()])


def device_usage() -> dict:
    """Peak and limit of the allocator's bytes (largest over the devices) and the device kind."""
    import jax  # after the module ran: its flags were set before JAX started

    devices = jax.devices()
    stats = [d.memory_stats() or {} for d in devices]
    peaks = [s["peak_bytes_in_use"] for s in stats if "peak_bytes_in_use" in s]
    limits = [s["bytes_limit"] for s in stats if "bytes_limit" in s]
    return {"peak_bytes": max(peaks) if peaks else None, "bytes_limit": max(limits) if limits else None,
            "device": f"{len(devices)} x {devices[0].device_kind}"}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) < 3 or argv[1] != "-m":
        raise SystemExit("usage: python tools/measure_usage.py USAGE.json -m MODULE [ARGS...]")
    out, module, args = Path(argv[0]), argv[2], argv[3:]
    record = {"command": " ".join(["python -m", module, *args]), "date": datetime.datetime.now().isoformat(timespec="seconds")}
    sys.argv = [module, *args]
    t0, code, error = time.perf_counter(), 0, ""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        error = "" if code == 0 else str(exit_.code)
    except BaseException:  # noqa: BLE001  (recorded, then the status says it failed)
        code, error = 1, traceback.format_exc()
    record["seconds"] = time.perf_counter() - t0
    oom = any(p in error for p in OOM_PATTERNS)
    record.update(status="ok" if code == 0 else "failed", returncode=code, out_of_memory=oom,
                  requested_bytes=requested_bytes(error) if oom else None, error=error[-3000:])
    try:
        record.update(device_usage())
    except Exception as err:  # noqa: BLE001  (no backend: the record says why)
        record.update(peak_bytes=None, bytes_limit=None, device=f"unavailable: {err}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    print(f"=== usage: {record['status']}, peak {record['peak_bytes']} bytes on {record['device']}, "
          f"{record['seconds']:.0f} s -> {out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
