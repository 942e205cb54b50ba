"""The ablation runner's compile-ahead order: the learning run's and the arms' programs are queued
after the gradient measurements (which compile on their own threads), a program shared by two runs
is compiled once, and a run starts only after its own programs have compiled.

No training: the warm-up, the measurements and the trainers are stand-ins that record events.
"""

from __future__ import annotations

import dataclasses
import threading
import types

from fp4rl import configs
from fp4rl.config_cli import parse
from fp4rl.studies import ablation


def test_programs_queue_before_the_measurements_and_compile_once(tmp_path, monkeypatch):
    out = tmp_path / "ablation"
    config = parse(ablation.AblationConfig, ["--preset", "smoke", f"--out={out}", "--arms=bf16,nvfp4,+dq",
                                             "--learning_steps=2", "--measure_gradients=true"], configs.ABLATION_PRESETS)
    events, lock, gate = [], threading.Lock(), threading.Event()  # gate: the measurements are done

    def record(event):
        with lock:
            events.append(event)

    class FakeTrainer:
        def __init__(self, run_config, progress=True, warmup=None):
            self.config, self.label = run_config, "learning" if "learning" in run_config.out else run_config.arm

        def compile_tasks(self):
            forward = "forward:" + ("nvfp4" if self.config.arm in ("nvfp4", "+dq") else self.config.arm)

            def task(name):
                def compile_():
                    assert gate.is_set(), "compiled beside the gradient measurements"
                    record(("compiled", name))
                return compile_

            return [(forward, task(forward)), (f"update:{self.label}", task(f"update:{self.label}"))]

        def run(self):
            record(("run", self.label))

    def fake_gradients_run(gradients_config, warmup, progress):
        record(("gradients", None))
        gate.set()  # the runner queues the RL programs only now

    monkeypatch.setattr(ablation.trainer, "Trainer", FakeTrainer)
    monkeypatch.setattr(ablation.trainer, "is_finished", lambda run_config: False)
    monkeypatch.setattr(ablation.trainer, "has_checkpoint", lambda run_config: False)
    monkeypatch.setattr(ablation.sft, "train", lambda sft_config, progress=True: None)
    monkeypatch.setattr(ablation.sft, "is_finished", lambda directory: True)
    monkeypatch.setattr(ablation.sft, "load", lambda directory: ("graphdef", "params", {}))
    monkeypatch.setattr(ablation.gradients, "run", fake_gradients_run)
    monkeypatch.setattr(ablation, "_sections", lambda config, out: [])
    monkeypatch.setattr(ablation, "write_report", lambda *args, **kwargs: types.SimpleNamespace(report_md="report.md"))
    monkeypatch.setattr(ablation, "settings_text", lambda out: "")

    result = ablation.run(dataclasses.replace(config, compile_workers=2), progress=False)
    assert result["status"] == {"sft": "skipped", "gradients": "ran", "learning": "ran", "bf16": "ran",
                                "nvfp4": "ran", "+dq": "ran"}
    compiled = [name for kind, name in events if kind == "compiled"]
    # bf16's forward is the learning run's; +dq's is nvfp4's: each compiled once
    assert sorted(compiled) == sorted(["forward:bf16", "update:learning", "update:bf16", "forward:nvfp4",
                                       "update:nvfp4", "update:+dq"])
    assert events[0] == ("gradients", None)
    runs = [name for kind, name in events if kind == "run"]
    assert runs == ["learning", "bf16", "nvfp4", "+dq"]
    for label, needs in {"learning": ["forward:bf16", "update:learning"], "bf16": ["update:bf16"],
                         "nvfp4": ["forward:nvfp4", "update:nvfp4"], "+dq": ["update:+dq"]}.items():
        for name in needs:
            assert events.index(("compiled", name)) < events.index(("run", label)), (name, label)
