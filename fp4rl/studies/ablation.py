"""The ablation runner: one warm-up, the fixed-parameter gradient measurements, every arm of
docs/rl.md's matrix with N seeds, then the report.

Layout of a run directory (what `fp4rl.analysis` reads):
    <out>/sft/                       the warm-up checkpoint (reused when present)
    <out>/gradients/                 `fp4rl.studies.gradients` at the warm-up (report.md, JSON, PNGs)
    <out>/<arm>/seed<k>/metrics.jsonl
    <out>/<arm>/checkpoint/          resumable state (not needed by the report)
    <out>/report.md, grad_norm.png, seeds.png, summary.png
Resumable: a finished arm (`done.json`) is skipped, an unfinished one continues from its
last checkpoint, so rerunning the same command after an interruption only does what is left.
A rerun under other settings is refused for finished arms as for unfinished ones
(`fp4rl.rl.resume`), and the report states the settings each arm ran with, read from its
config.json, not those of the command that wrote the report (`fp4rl.rl.run_settings`). All runs
of one directory run their expert GEMMs on one backend: a run that would use another is refused.

Compiling ahead: after the gradient measurements, the learning run and the arms still to run are
set up and `compile_workers` threads compile their programs (`Trainer.compile_tasks`: the learning
run's first, then in arm order, one task per distinct program) while the learning run and the
arms train one after the other. XLA compiles without holding the GIL, so on a
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
from fp4rl.analysis.report import write_report, write_sections_report
from fp4rl.analysis.runs import has_arm_metrics
from fp4rl.recipe import ABLATION_ARMS, BASELINE_ARMS, POSITIVE_CONTROL_ARMS, PrecisionRecipe, dose_response_arms
from fp4rl.rl import resume, sft, trainer
from fp4rl.studies import gradients, gradients_config
from fp4rl.rl.run_dir import prepare_out
from fp4rl.rl.run_settings import expert_gemm_of, run_records, settings_text

# Sub-config fields the runner sets itself (`arm_config`, `learning_config`, `run`), with the
# runner option that controls each: a value given for one would be ignored, so any value other
# than the field's default is refused.
RUNNER_SET = {
    "rl.arm": "--arms",
    "rl.seeds": "--seeds",
    "rl.init": "--out (the warm-up is <out>/sft)",
    "rl.out": "--out (arm <a> runs in <out>/<a>)",
    "sft.out": "--out (the warm-up is <out>/sft)",
    "gradients.init": "--out (the warm-up is <out>/sft)",
    "gradients.out": "--out (the measurements go to <out>/gradients)",
}


def field_default(cls, name: str):
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


@dataclasses.dataclass(frozen=True)
class AblationConfig:
    """arms: which arms to run (docs/rl.md's nine by default; "all": those nine; "baselines":
    `BASELINE_ARMS`, nvfp4-pt, mxfp8-q, mxfp8, mxfp8+dq, so "all,baselines" is the whole matrix;
    "dose": the dose-response arms (`recipe.dose_response_arms()`: nvfp4 and +dq at the doses
    1, 4, 16, 64); "controls": the positive controls nvfp4+attn and nvfp4-tensor; any recipe name,
    nvfp4@A and +dq@A included; empty: none, the warm-up, gradient measurements and learning run alone);
    seeds: per arm, run in one program.
    compile_workers: threads that compile the arms' programs ahead of their turn (0: every program
    compiles on its first call, in the training thread). The CPU presets use 2, as compiling is
    most of their time; off by default because on a GPU it would autotune kernels while an arm
    trains on the same device. On CPU the results are the same either way.
    gradients: the fixed-parameter measurements at the warm-up (`measure_gradients`: run them first).
    learning_steps: > 0 runs the `bf16` arm for that many steps first, into <out>/learning/ (with the
      matrix's settings and seeds otherwise), and the report states whether it learned
      (`fp4rl.analysis.learning`): a matrix of short arms alone cannot show that RL works.
    arm_eval_every: the held-out evaluation interval of the matrix arms (None: `rl.eval_every`, as
      the learning run uses). 0 where the arms are a machinery check: at a few steps per arm, two
      evaluations of `rl.eval_prompts` problems would cost more than the arm's steps.
    arm_seeds: seeds per matrix arm (None: `seeds`, as the learning run uses). Fewer where the arms
      are a machinery check: an arm's quantized rollouts cost about twice a bf16 step per seed."""

    sft: sft.SFTConfig = sft.SFTConfig()
    rl: trainer.RLConfig = trainer.RLConfig()
    gradients: gradients_config.GradientsConfig = gradients_config.GradientsConfig()
    measure_gradients: bool = False
    learning_steps: int = 0
    arm_eval_every: int | None = None
    arm_seeds: int | None = None
    arms: tuple[str, ...] = ABLATION_ARMS
    seeds: int = 1
    compile_workers: int = 0
    out: str = "runs/ablation"

    def __post_init__(self):
        groups = {"all": ABLATION_ARMS, "baselines": BASELINE_ARMS, "dose": dose_response_arms(),
                  "controls": POSITIVE_CONTROL_ARMS}
        arms = [a for arm in self.arms for a in groups.get(arm, (arm,))]
        object.__setattr__(self, "arms", tuple(dict.fromkeys(arms)))  # in order, each arm once
        for arm in self.arms:
            PrecisionRecipe.from_name(arm)  # a typo names the valid arms
        if self.seeds < 1 or (self.arm_seeds is not None and self.arm_seeds < 1):
            raise ValueError(f"{self.seeds=} and {self.arm_seeds=} must be >= 1")
        if self.compile_workers < 0 or self.learning_steps < 0 or (self.arm_eval_every or 0) < 0:
            raise ValueError(f"need {self.compile_workers=}, {self.learning_steps=} and {self.arm_eval_every=} >= 0")
        given = {"rl.arm": self.rl.arm, "rl.seeds": self.rl.seeds, "rl.init": self.rl.init, "rl.out": self.rl.out,
                 "sft.out": self.sft.out, "gradients.init": self.gradients.init, "gradients.out": self.gradients.out}
        classes = {"rl": trainer.RLConfig, "sft": sft.SFTConfig, "gradients": gradients_config.GradientsConfig}
        for dotted, option in RUNNER_SET.items():
            sub, name = dotted.split(".")
            if given[dotted] != field_default(classes[sub], name):
                raise ValueError(f"--{dotted}={given[dotted]} is set by the ablation runner itself; use {option} instead")


def _run_config(config: AblationConfig, arm: str, seeds: int, **overrides) -> trainer.RLConfig:
    return dataclasses.replace(config.rl, arm=arm, seeds=seeds, init=str(Path(config.out) / "sft"), **overrides)


def arm_config(config: AblationConfig, arm: str) -> trainer.RLConfig:
    evals = {} if config.arm_eval_every is None else {"eval_every": config.arm_eval_every}
    seeds = config.seeds if config.arm_seeds is None else config.arm_seeds
    return _run_config(config, arm, seeds, out=config.out, **evals)


def learning_config(config: AblationConfig) -> trainer.RLConfig:
    return _run_config(config, "bf16", config.seeds, steps=config.learning_steps, out=str(Path(config.out) / "learning"))


def _check_finished(run_config: trainer.RLConfig, label: str) -> None:
    """A finished run is skipped; a rerun under other settings is refused unless forced (it would
    report the old results as if they were of the new settings)."""
    changes = trainer.check_settings(run_config)
    if changes:
        print(f"[{label}] finished earlier; setting(s) differ from this command's ({resume.describe(changes)}): "
              "kept as run, the report states the settings it ran with")


def _check_one_backend(config: AblationConfig, out: Path) -> None:
    """One matrix, one expert-GEMM backend: the runs still to do run on the backend every run
    recorded under `out` ran on. Runs of one process share the resolution of "auto"; a run made by
    another process (another platform, another --rl.expert_gemm) may not, and its arm would then
    differ from the others in summation order and time per step."""
    records = run_records(out)
    if not records:  # nothing ran yet: the runs to do share this process's resolution
        return
    warmup = trainer.warmup_model_config(out / "sft")
    gemm = trainer.resolve_settings(config.rl, warmup).expert_gemm or warmup.expert_gemm
    for name, record in records.items():
        if (recorded := expert_gemm_of(record)) != gemm:
            raise ValueError(f"{out / name} ran its expert GEMMs on expert_gemm={recorded!r}, but this command's runs "
                             f"would run on {gemm!r} (--rl.expert_gemm={config.rl.expert_gemm!r}, the warm-up's "
                             f"{warmup.expert_gemm!r}): one matrix never mixes backends; pass "
                             f"--rl.expert_gemm={recorded} or start a new --out")


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


def _wait(futures) -> None:
    for future in futures:
        future.result()  # a compile error surfaces here, as it would on the first call


def run(config: AblationConfig, commands: tuple[str, ...] = (), progress: bool = True) -> dict:
    """Run what is missing and write the report; returns {arm: 'ran' | 'skipped'} and paths."""
    out = prepare_out(config.out)
    sft_dir = out / "sft"
    status = {}
    t0 = time.time()
    # Settings are checked before anything trains: the finished arms here, the others when their
    # trainers are built, the warm-up by `sft.train` (which reuses a finished one of equal settings).
    pending = [arm for arm in config.arms if not trainer.is_finished(arm_config(config, arm))]
    for arm in config.arms:
        if arm not in pending:
            _check_finished(arm_config(config, arm), f"arm {arm}")
        elif trainer.has_checkpoint(arm_config(config, arm)):
            trainer.check_settings(arm_config(config, arm))  # raises now, not after the arms before it
    if sft.is_finished(sft_dir):
        print(f"[warm-up] reusing {sft_dir}")
        status["sft"] = "skipped"
    else:
        print(f"[warm-up] training {config.sft.model} for {config.sft.steps} steps -> {sft_dir}")
        status["sft"] = "ran"
    sft.train(dataclasses.replace(config.sft, out=str(sft_dir)), progress=progress)
    learning_run = learning_config(config) if config.learning_steps else None
    learn = learning_run is not None and not trainer.is_finished(learning_run)
    if pending or learn:
        _check_one_backend(config, out)
    grad_dir = out / "gradients"
    measure = config.measure_gradients and not (grad_dir / gradient_report.RESULTS_FILE).exists()
    warmup = sft.load(sft_dir) if pending or measure or learn else None  # loaded once for every run
    pool = concurrent.futures.ThreadPoolExecutor(config.compile_workers) if config.compile_workers and (
        pending or learn) else None
    trainers, compiling, tasks = {}, {}, {}
    try:
        if measure:
            print(f"[gradients] fixed-parameter measurements of {', '.join(config.gradients.recipe_names)} -> {grad_dir}")
            gradients.run(dataclasses.replace(config.gradients, init=str(sft_dir), out=str(grad_dir)), warmup, progress)
            status["gradients"] = "ran"
        elif config.measure_gradients:
            print(f"[gradients] reusing {grad_dir}")
            status["gradients"] = "skipped"
        # After the gradient measurements (their own compile threads keep both cores busy; more
        # threads beside them slowed that phase several-fold): the learning run's programs, then
        # the arms' in arm order, so that the learning run's three compile side by side and the
        # arms' compile while the learning run and the earlier arms train.
        runs = ([("learning", learning_run)] if learn else []) + [(arm, arm_config(config, arm)) for arm in pending]
        for label, run_config in runs if pool is not None else ():
            trainers[label] = trainer.Trainer(run_config, progress=progress, warmup=warmup)
            for key, task in trainers[label].compile_tasks():
                if key not in tasks:  # a program shared with an earlier run compiles once
                    tasks[key] = pool.submit(task)
                compiling.setdefault(label, []).append(tasks[key])
        if learning_run is not None and not learn:
            _check_finished(learning_run, "learning")
        elif learn:
            print(f"[learning] bf16, {config.seeds} seed(s) x {config.learning_steps} steps -> {learning_run.out}"
                  f" (elapsed {time.time() - t0:.0f}s)")
            _wait(compiling.pop("learning", []))
            run_learning = trainers.pop("learning", None) or trainer.Trainer(learning_run, progress=progress,
                                                                             warmup=warmup)
            run_learning.run()
            status["learning"] = "ran"
        for i, arm in enumerate(config.arms):
            if arm not in pending:
                print(f"[arm {i + 1}/{len(config.arms)}] {arm}: finished earlier, skipped")
                status[arm] = "skipped"
                continue
            run_arm = trainers.pop(arm) if arm in trainers else trainer.Trainer(
                arm_config(config, arm), progress=progress, warmup=warmup)
            print(f"[arm {i + 1}/{len(config.arms)}] {arm}: {run_arm.config.seeds} seed(s) x {run_arm.config.steps} steps "
                  f"(elapsed {time.time() - t0:.0f}s)")
            _wait(compiling.pop(arm, []))
            run_arm.run()
            status[arm] = "ran"
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    if has_arm_metrics(out):
        report_md = write_report(out, config_text=settings_text(out), commands=commands,
                                 sections=_sections(config, out)).report_md
    else:  # no matrix arm (the cpu preset's default): the learning run and the measurements alone
        report_md = write_sections_report(out, _sections(config, out), settings_text(out), commands)
    print(f"[report] {report_md} (total {time.time() - t0:.0f}s)")
    return {"status": status, "report": report_md}
