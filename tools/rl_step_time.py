"""RL step time per arm and grouped-GEMM backend: where an RL step's time goes, and what a backend buys.

    python tools/rl_step_time.py --preset h200 --arms bf16,full --seeds 2 --gemms xla,mosaic,packed --steps 6
    JAX_PLATFORMS=cpu python tools/rl_step_time.py --preset smoke --gemms xla,packed_interpret --steps 3

Each (arm, backend) runs the preset's RL trainer for `--steps` steps from the warm-up in `--init`
(the preset's own by default; a missing one is replaced by random parameters, said in the output),
in a temporary directory, one after the other in this process (never two at once: they would
share the device). The first step compiles what was not compiled ahead, so the table gives the
median of the later steps: the whole step, its rollouts (sampling; DAPO may draw several
generation batches) and the rest (the update and the bookkeeping), with the step-0 reward as a
sanity check that the backends compute the same policy (they differ only in f32 summation
order). `--profile DIR`: each run's last step under the JAX profiler, and a table of where its
time went (kernels on a GPU; that step is left out of the medians). Times from a CPU are not
performance numbers; the GPU's go to `benchmarks/`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.gpu_bench import write_results  # noqa: E402
from fp4rl import configs  # noqa: E402
from fp4rl.analysis import trace_summary  # noqa: E402
from fp4rl.formats import stochastic  # noqa: E402
from fp4rl.grouped import check_gemm  # noqa: E402
from fp4rl.model import init  # noqa: E402
from fp4rl.rl import sft, trainer  # noqa: E402


def _warmup(preset: str, init_dir: str):
    """The warm-up's (graphdef, params, meta), or random parameters of the preset's model."""
    if (Path(init_dir) / "sft_meta.json").is_file():
        return sft.load(init_dir), f"warm-up {init_dir}"
    model_config = sft.model_config(configs.SFT_PRESETS[preset])
    graphdef, params = init(model_config, 0)
    return (graphdef, params, {"model_config": dataclasses.asdict(model_config)}), "random parameters (no warm-up found)"


def _profile_last_step(run: trainer.Trainer, last: int, log_dir: str) -> dict:
    """Wrap `run.step` so that step `last` runs under the JAX profiler (trace in `log_dir`); the
    returned dict receives its kernel table once it has run."""
    inner, profiled = run.step, {}

    def step(state, index):
        if index != last:
            return inner(state, index)
        out, profiled["trace"] = trace_summary.profiled(
            inner, (state, index), log_dir, f"Where the time of one RL step of `{run.config.arm}` on "
            f"`{run.model_config.expert_gemm}` goes ({len(run.seeds)} seeds; rollout and update; trace: {log_dir})", top=25)
        return out

    run.step = step
    return profiled


def measure(preset: str, arm: str, gemm: str, seeds: int, steps: int, warmup, profile: str = "") -> dict:
    config = dataclasses.replace(configs.RL_PRESETS[preset], arm=arm, seeds=seeds, steps=steps, expert_gemm=gemm,
                                 eval_every=0, checkpoint_every=steps, out=tempfile.mkdtemp(prefix="rl_step_time_"))
    t0 = time.perf_counter()
    run = trainer.Trainer(config, progress=False, warmup=warmup)
    profiled = _profile_last_step(run, steps - 1, f"{profile}/{arm}-{gemm}") if profile else {}
    history = run.run()
    wall = time.perf_counter() - t0
    # per seed, the steps after the first (it compiles) and before a profiled last (the profiler slows it)
    later = [step[1:-1] if profile else step[1:] for step in history]

    def median(key):
        return float(np.median([r[key] for seed in later for r in seed]))

    step_s, rollout_s = median("time/step_s"), median("time/rollout_s")
    return {"arm": arm, "gemm": run.model_config.expert_gemm,  # "auto" as resolved
            "seeds": seeds, "step_s": step_s, "rollout_s": rollout_s, "rest_s": step_s - rollout_s,
            "first_step_s": float(np.mean([s[0]["time/step_s"] for s in history])),
            "reward_step0": float(np.mean([s[0]["reward/mean"] for s in history])), "wall_s": wall, **profiled}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="h200", choices=sorted(configs.RL_PRESETS))
    parser.add_argument("--arms", default="bf16,full")
    parser.add_argument("--gemms", default="xla,mosaic,packed")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6, help="steps per run; the first (compiling) one is not timed")
    parser.add_argument("--init", default="", help="warm-up directory (default: the preset's)")
    parser.add_argument("--profile", default="", help="a directory: the last step of each run under the JAX profiler, "
                        "with a table of its kernels (that step is not timed)")
    parser.add_argument("--out", default="", help="write rl_step_time.json/.md into this directory (default: print only)")
    args = parser.parse_args(argv)
    stochastic.lower_draws_as_gpu_kernel()
    gemms = args.gemms.split(",")
    for gemm in gemms:
        check_gemm(gemm, auto=True)  # names the valid backends
    if args.steps < 2 + bool(args.profile):
        parser.error("--steps must be >= 2, 3 with --profile (the first step compiles, a profiled last is not timed)")
    warmup, source = _warmup(args.preset, args.init or configs.RL_PRESETS[args.preset].init)
    print(f"preset {args.preset}, {args.seeds} seeds, {args.steps} steps per run, from {source}", flush=True)
    rows = []
    for arm in args.arms.split(","):
        for gemm in gemms:
            rows.append(measure(args.preset, arm, gemm, args.seeds, args.steps, warmup, args.profile))
            print(rows[-1], flush=True)
    table = to_markdown(rows)
    print("\n" + table)
    if args.out:
        run = {"preset": args.preset, "seeds": args.seeds, "steps": args.steps, "init": source, "rows": rows}
        write_results(args.out, "rl_step_time", run, table)


def to_markdown(rows: list[dict]) -> str:
    """One line per (arm, backend); "vs first backend" is the arm's first backend's step time over this one's."""
    lines = ["| arm | expert GEMM | step s | rollout s | rest s | vs first backend | first step s | reward step 0 |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        base = next(r for r in rows if r["arm"] == row["arm"])
        lines.append(f"| {row['arm']} | {row['gemm']} | {row['step_s']:.2f} | {row['rollout_s']:.2f} | "
                     f"{row['rest_s']:.2f} | {base['step_s'] / row['step_s']:.2f}x | {row['first_step_s']:.1f} | "
                     f"{row['reward_step0']:.3f} |")
    lines += ["\n" + row["trace"] for row in rows if "trace" in row]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
