"""The ablation runner: one warm-up, every arm of RL.md's matrix with N seeds, then the report.

Layout of a run directory (what `fp4rl.analysis` reads):
    <out>/sft/                       the warm-up checkpoint (reused when present)
    <out>/<arm>/seed<k>/metrics.jsonl
    <out>/<arm>/checkpoint/          resumable state (not needed by the report)
    <out>/report.md, grad_norm.png, seeds.png, summary.png
Resumable: a finished arm (`done.json`) is skipped, an unfinished one continues from its
last checkpoint, so rerunning the same command after an interruption only does what is left.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from fp4rl.analysis.report import write_report
from fp4rl.recipe import ABLATION_ARMS, PrecisionRecipe
from fp4rl.rl import sft, trainer


@dataclasses.dataclass(frozen=True)
class AblationConfig:
    """arms: which arms to run (RL.md's nine by default); seeds: per arm, run in one program."""

    sft: sft.SFTConfig = sft.SFTConfig()
    rl: trainer.RLConfig = trainer.RLConfig()
    arms: tuple[str, ...] = ABLATION_ARMS
    seeds: int = 1
    out: str = "runs/ablation"

    def __post_init__(self):
        for arm in self.arms:
            PrecisionRecipe.from_name(arm)  # a typo names the valid arms
        if self.seeds < 1:
            raise ValueError(f"{self.seeds=} must be >= 1")


def arm_config(config: AblationConfig, arm: str) -> trainer.RLConfig:
    return dataclasses.replace(config.rl, arm=arm, seeds=config.seeds, init=str(Path(config.out) / "sft"), out=config.out)


def run(config: AblationConfig, commands: tuple[str, ...] = (), progress: bool = True) -> dict:
    """Run what is missing and write the report; returns {arm: 'ran' | 'skipped'} and paths."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    sft_dir = out / "sft"
    status = {}
    t0 = time.time()
    if sft.is_finished(sft_dir):
        print(f"[warm-up] reusing {sft_dir}")
        status["sft"] = "skipped"
    else:
        print(f"[warm-up] training {config.sft.model} for {config.sft.steps} steps -> {sft_dir}")
        sft.train(dataclasses.replace(config.sft, out=str(sft_dir)), progress=progress)
        status["sft"] = "ran"
    for i, arm in enumerate(config.arms):
        rl_config = arm_config(config, arm)
        if trainer.is_finished(rl_config):
            print(f"[arm {i + 1}/{len(config.arms)}] {arm}: finished earlier, skipped")
            status[arm] = "skipped"
            continue
        elapsed = time.time() - t0
        print(f"[arm {i + 1}/{len(config.arms)}] {arm}: {config.seeds} seed(s) x {rl_config.steps} steps "
              f"(elapsed {elapsed:.0f}s)")
        trainer.train(rl_config, progress=progress)
        status[arm] = "ran"
    config_text = json.dumps(json.loads(json.dumps(dataclasses.asdict(config), default=str)), indent=2)
    paths = write_report(out, config_text=config_text, commands=commands)
    print(f"[report] {paths.report_md} (total {time.time() - t0:.0f}s)")
    return {"status": status, "report": paths}
