"""The metrics record on resume: only a torn last line is repaired, and TensorBoard shows every
step once (the resumed writer purges the re-run steps of the earlier event files)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from tensorboardX.proto import event_pb2

from fp4rl.rl.metrics_log import MetricsWriter, truncate_after


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_a_torn_last_line_is_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2, "reward/me')
    truncate_after(path, 5)
    assert _lines(path) == ['{"step": 0}', '{"step": 1}']


def test_a_damaged_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    text = '{"step": 0}\n{"step": 1, "rew\n{"step": 2}\n'
    path.write_text(text)
    with pytest.raises(ValueError, match=f"{path}:2: damaged line"):
        truncate_after(path, 5)
    assert path.read_text() == text  # nothing was dropped


def test_a_line_without_a_step_is_an_error(tmp_path):
    path = tmp_path / "updates.jsonl"
    path.write_text('{"step": 0}\n[1, 2]\n{"step": 2}\n')
    with pytest.raises(ValueError, match=f"{path}:2: expected a JSON object"):
        truncate_after(path, 5)


def test_records_past_the_step_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(4)))
    truncate_after(path, 1)
    assert _lines(path) == ['{"step": 0}', '{"step": 1}']


def _events(path: Path):
    """The Event protos of one TFRecord file: [u64 length][u32 crc][data][u32 crc] each."""
    data, pos = path.read_bytes(), 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        event = event_pb2.Event()
        event.ParseFromString(data[pos + 12 : pos + 12 + length])
        pos += 12 + length + 4
        yield event


def tensorboard_scalars(tb_dir: Path, tag: str) -> list[tuple[int, float]]:
    """What TensorBoard shows for `tag`: files in name order, and a SessionLog START at step s
    (a writer opened with purge_step=s) hides the earlier events at steps >= s."""
    shown = []
    for path in sorted(tb_dir.iterdir()):
        for event in _events(path):
            if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
                shown = [(s, v) for s, v in shown if s < event.step]
            for value in event.summary.value:
                if value.tag == tag:
                    shown.append((event.step, value.simple_value))
    return shown


def test_tensorboard_after_resume_shows_every_step_once(tmp_path):
    """Steps 0-3 logged, then a kill and a resume from the checkpoint of step 1: steps 2 and 3
    are logged again (with other values here), in the same second as the first writer."""
    first = MetricsWriter(tmp_path)
    for step in range(4):
        first.write({"step": step, "reward/mean": float(step)})
    first.close()
    truncate_after(tmp_path / "metrics.jsonl", 1)
    resumed = MetricsWriter(tmp_path, purge_step=2)
    for step in (2, 3):
        resumed.write({"step": step, "reward/mean": 10.0 + step})
    resumed.close()
    assert tensorboard_scalars(tmp_path / "tb", "reward/mean") == [(0, 0.0), (1, 1.0), (2, 12.0), (3, 13.0)]
    assert [json.loads(line)["step"] for line in _lines(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3]


class _Device:
    def __init__(self, stats):
        self.stats = stats

    def memory_stats(self):
        return self.stats


def test_device_memory_reports_the_largest_peak_where_the_platform_has_one():
    from fp4rl.rl.metrics_log import device_memory

    assert device_memory([_Device({"peak_bytes_in_use": 3e9, "bytes_in_use": 1e9}), _Device({"peak_bytes_in_use": 5e9})]) \
        == {"memory/peak_gb": 5.0}
    assert device_memory([_Device(None), _Device({})]) == {}  # XLA:CPU reports no stats


def test_device_memory_on_this_platform_is_a_dict():
    import jax

    from fp4rl.rl.metrics_log import device_memory

    record = device_memory(jax.local_devices())
    assert set(record) <= {"memory/peak_gb"} and all(v > 0 for v in record.values())
