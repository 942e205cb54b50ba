"""The ablation runner: one warm-up, the fixed-parameter gradient measurements, every arm of
RL.md's matrix with N seeds, then the report.

Layout of a run directory (what `fp4rl.analysis` reads):
    <out>/sft/                       the warm-up checkpoint (reused when present)
    <out>/gradients/                 `fp4rl.rl.gradients` at the warm-up (report.md, JSON, PNGs)
    <out>/<arm>/seed<k>/metrics.jsonl
    <out>/<arm>/checkpoint/          resumable state (not needed by the report)
    <out>/report.md, grad_norm.png, seeds.png, summary.png
Resumable: a finished arm (`done.json`) is skipped, an unfinished one continues from its
last checkpoint, so rerunning the same command after an interruption only does what is left.

Compiling ahead: after the warm-up, the arms still to run are set up and `compile_workers`
threads compile their programs (`Trainer.compile_tasks`, in arm order, one task per distinct
program) while the arms train one after the other. XLA compiles without holding the GIL, so on a
small model, where compiling dominates, the cores compile in parallel instead of one program
after another.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import time
from pathlib import Path

from fp4rl.analysis import gradient_report, learning
from fp4rl.analysis.report import write_report
from fp4rl.recipe import ABLATION_ARMS, PrecisionRecipe
from fp4rl.rl import gradients, sft, trainer


@dataclasses.dataclass(frozen=True)
class AblationConfig:
    """arms: which arms to run (RL.md's nine by default); seeds: per arm, run in one program.
    compile_workers: threads that compile the arms' programs ahead of their turn (0: every program
    compiles on its first call, in the training thread). The CPU presets use 2, as compiling is
    most of their time; off by default because on a GPU it would autotune kernels while an arm
    trains on the same device. On CPU the results are the same either way.
    gradients: the fixed-parameter measurements at the warm-up (`measure_gradients`: run them first).
    learning_steps: > 0 runs the `bf16` arm for that many steps first, into <out>/learning/ (with the
      matrix's settings and seeds otherwise), and the report states whether it learned
      (`fp4rl.analysis.learning`): a matrix of short arms alone cannot show that RL works."""

    sft: sft.SFTConfig = sft.SFTConfig()
    rl: trainer.RLConfig = trainer.RLConfig()
    gradients: gradients.GradientsConfig = gradients.GradientsConfig()
    measure_gradients: bool = False
    learning_steps: int = 0
    arms: tuple[str, ...] = ABLATION_ARMS
    seeds: int = 1
    compile_workers: int = 0
    out: str = "runs/ablation"

    def __post_init__(self):
        for arm in self.arms:
            PrecisionRecipe.from_name(arm)  # a typo names the valid arms
        if self.seeds < 1:
            raise ValueError(f"{self.seeds=} must be >= 1")
        if self.compile_workers < 0 or self.learning_steps < 0:
            raise ValueError(f"need {self.compile_workers=} >= 0 and {self.learning_steps=} >= 0")


def arm_config(config: AblationConfig, arm: str) -> trainer.RLConfig:
    return dataclasses.replace(config.rl, arm=arm, seeds=config.seeds, init=str(Path(config.out) / "sft"), out=config.out)


def learning_config(config: AblationConfig) -> trainer.RLConfig:
    return dataclasses.replace(arm_config(config, "bf16"), steps=config.learning_steps, out=str(Path(config.out) / "learning"))


def _sections(config: AblationConfig, out: Path) -> list[str]:
    """The report's sections on the learning run and the gradient measurements."""
    sections = []
    if config.learning_steps:
        result = learning.summarize(Path(learning_config(config).out) / "bf16")
        (out / "learning").mkdir(exist_ok=True)
        learning.plot(result, out / "learning" / "learning.png")
        sections.append(learning.markdown(result).replace("## Learning:", "## Does RL learn? Learning run:", 1)
                        + "\n![learning](learning/learning.png)\n")
    if config.measure_gradients:
        decision = json.loads((out / "gradients" / gradient_report.RESULTS_FILE).read_text())["decision"]
        sections.append("## Fixed-parameter gradient measurements\n\n"
                        f"{decision['conclusion']}\n\nDetails: [gradients/report.md](gradients/report.md).\n")
    return sections


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
    pending = [arm for arm in config.arms if not trainer.is_finished(arm_config(config, arm))]
    grad_dir = out / "gradients"
    measure = config.measure_gradients and not (grad_dir / gradient_report.RESULTS_FILE).exists()
    warmup = sft.load(sft_dir) if pending or measure else None  # loaded once for every arm
    if measure:
        print(f"[gradients] fixed-parameter measurements of {', '.join(config.gradients.recipe_names)} -> {grad_dir}")
        gradients.run(dataclasses.replace(config.gradients, init=str(sft_dir), out=str(grad_dir)), warmup, progress)
        status["gradients"] = "ran"
    elif config.measure_gradients:
        print(f"[gradients] reusing {grad_dir}")
        status["gradients"] = "skipped"
    learning_run = learning_config(config) if config.learning_steps else None
    if learning_run is not None and not trainer.is_finished(learning_run):
        print(f"[learning] bf16, {config.seeds} seed(s) x {config.learning_steps} steps -> {learning_run.out}")
        trainer.Trainer(learning_run, progress=progress, warmup=warmup or sft.load(sft_dir)).run()
        status["learning"] = "ran"
    pool = concurrent.futures.ThreadPoolExecutor(config.compile_workers) if config.compile_workers and pending else None
    trainers, compiling, tasks = {}, {}, {}
    try:
        for arm in pending if pool is not None else ():  # in arm order: the pool starts on the first at once
            trainers[arm] = trainer.Trainer(arm_config(config, arm), progress=progress, warmup=warmup)
            for key, task in trainers[arm].compile_tasks():
                if key not in tasks:  # a program shared with an earlier arm compiles once
                    tasks[key] = pool.submit(task)
                compiling.setdefault(arm, []).append(tasks[key])
        for i, arm in enumerate(config.arms):
            if arm not in pending:
                print(f"[arm {i + 1}/{len(config.arms)}] {arm}: finished earlier, skipped")
                status[arm] = "skipped"
                continue
            run_arm = trainers.pop(arm) if arm in trainers else trainer.Trainer(
                arm_config(config, arm), progress=progress, warmup=warmup)
            print(f"[arm {i + 1}/{len(config.arms)}] {arm}: {config.seeds} seed(s) x {run_arm.config.steps} steps "
                  f"(elapsed {time.time() - t0:.0f}s)")
            for future in compiling.pop(arm, []):
                future.result()  # a compile error surfaces here, as it would on the first call
            run_arm.run()
            status[arm] = "ran"
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    config_text = json.dumps(json.loads(json.dumps(dataclasses.asdict(config), default=str)), indent=2)
    paths = write_report(out, config_text=config_text, commands=commands, sections=_sections(config, out))
    print(f"[report] {paths.report_md} (total {time.time() - t0:.0f}s)")
    return {"status": status, "report": paths}
