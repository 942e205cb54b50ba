"""RL step time per arm and grouped-GEMM backend: where an RL step's time goes, and what a backend buys.

    python tools/rl_step_time.py --preset h200 --arms bf16,full --seeds 2 --gemms xla,mosaic,packed --steps 6
    python tools/rl_step_time.py --preset h200-chain --arms bf16 --seeds 4 --gemms packed --overlap false,true
    JAX_PLATFORMS=cpu python tools/rl_step_time.py --preset smoke --gemms xla,packed_interpret --steps 3

Each (arm, backend, `--overlap`) runs the preset's RL trainer for `--steps` steps from the warm-up
in `--init` (the preset's own by default; a missing one is replaced by random parameters, said in
the output), in a temporary directory, one after the other in this process (never two at once:
they would share the device). A step's time is the wall time from its start (the dispatch of its
weight sync, `Trainer.begin_step`) to the next step's start, the last step's to its return: the
steps' times add up to the run's, whether the next step starts before a step's records are built
(`RLConfig.overlap`) or after. The first step compiles what was not compiled ahead, so the table
gives the median of the later steps: the whole step, its rollouts (`time/rollout_s`: sampling,
DAPO may draw several generation batches) and the rest, with the step-0 reward as a sanity check
that the backends compute the same policy (they differ only in f32 summation order; overlap on and
off compute the same bits, so their steps draw the same batches and pair step by step: `steps_s`
in the JSON). Under overlap a step's rollout window opens in the step before, once its updates are
queued, so `rest` is then the host's view, not the update's device time. `--profile DIR`: each
run's last step under the JAX profiler, from its start to its return (under overlap the window also
holds the step before's records), and a table of where its time went (kernels on a GPU; that step
is left out of the medians). Times from a CPU are not performance numbers; the GPU's go to
`benchmarks/`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import jax
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


class _StepClock:
    """Wraps a trainer's step starts (`Trainer.begin_step`) and steps: each step's wall time from
    its start to the next step's start (the last step's to its return, its device work done); with
    `profile_dir`, the last step from its start to its return under the JAX profiler, its kernel
    table in `profiled["trace"]`."""

    def __init__(self, run: trainer.Trainer, last: int, profile_dir: str = ""):
        self.starts, self.end, self.profiled = {}, None, {}
        begin, step = run.begin_step, run.step
        title = (f"Where the time of one RL step of `{run.config.arm}` on `{run.model_config.expert_gemm}` goes "
                 f"({len(run.seeds)} seeds; rollout and update; overlap {run.config.overlap}; trace: {profile_dir})")

        def timed_begin(params, index):
            if profile_dir and index == last:
                jax.profiler.start_trace(profile_dir, create_perfetto_trace=True)
            self.starts[index] = time.perf_counter()
            return begin(params, index)

        def timed_step(state, index):
            out = step(state, index)
            if index == last:
                jax.block_until_ready(out)
                self.end = time.perf_counter()
                if profile_dir:
                    jax.profiler.stop_trace()
                    self.profiled["trace"] = trace_summary.trace_table(profile_dir, title, top=25)
            return out

        run.begin_step, run.step = timed_begin, timed_step

    def seconds(self) -> list[float]:
        """Each step's time, in step order (the steps this process ran)."""
        steps = sorted(self.starts)
        return [self.starts.get(i + 1, self.end) - self.starts[i] for i in steps]


def measure(preset: str, arm: str, gemm: str, seeds: int, steps: int, warmup, profile: str = "",
            overlap: bool = False) -> dict:
    config = dataclasses.replace(configs.RL_PRESETS[preset], arm=arm, seeds=seeds, steps=steps, expert_gemm=gemm,
                                 overlap=overlap, eval_every=0, checkpoint_every=steps,
                                 out=tempfile.mkdtemp(prefix="rl_step_time_"))
    t0 = time.perf_counter()
    run = trainer.Trainer(config, progress=False, warmup=warmup)
    clock = _StepClock(run, steps - 1, f"{profile}/{arm}-{gemm}{'-overlap' if overlap else ''}" if profile else "")
    history = run.run()
    wall = time.perf_counter() - t0
    step_times = clock.seconds()
    # the steps after the first (it compiles) and before a profiled last (the profiler slows it)
    later = slice(1, steps - 1 if profile else steps)
    rollout_s = float(np.median([r["time/rollout_s"] for seed in history for r in seed[later]]))
    step_s = float(np.median(step_times[later]))
    return {"arm": arm, "gemm": run.model_config.expert_gemm,  # "auto" as resolved
            "overlap": overlap, "seeds": seeds, "step_s": step_s, "rollout_s": rollout_s, "rest_s": step_s - rollout_s,
            "first_step_s": step_times[0], "steps_s": step_times,
            "gen_batches": [r["dapo/gen_batches"] for r in history[0]],
            "reward_step0": float(np.mean([s[0]["reward/mean"] for s in history])), "wall_s": wall, **clock.profiled}


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
    parser.add_argument("--overlap", default="false", help="RLConfig.overlap per run, comma separated (false,true: "
                        "both, one after the other for each arm and backend; default: RLConfig's own default, off)")
    parser.add_argument("--out", default="", help="write rl_step_time.json/.md into this directory (default: print only)")
    args = parser.parse_args(argv)
    stochastic.lower_draws_as_gpu_kernel()
    gemms, overlaps = args.gemms.split(","), args.overlap.split(",")
    if not set(overlaps) <= {"true", "false"}:
        parser.error(f"--overlap={args.overlap}: comma-separated true / false")
    for gemm in gemms:
        check_gemm(gemm, auto=True)  # names the valid backends
    if args.steps < 2 + bool(args.profile):
        parser.error("--steps must be >= 2, 3 with --profile (the first step compiles, a profiled last is not timed)")
    warmup, source = _warmup(args.preset, args.init or configs.RL_PRESETS[args.preset].init)
    print(f"preset {args.preset}, {args.seeds} seeds, {args.steps} steps per run, from {source}", flush=True)
    rows = []
    for arm in args.arms.split(","):
        for gemm in gemms:
            for overlap in overlaps:
                rows.append(measure(args.preset, arm, gemm, args.seeds, args.steps, warmup, args.profile, overlap == "true"))
                print(rows[-1], flush=True)
    table = to_markdown(rows)
    print("\n" + table)
    if args.out:
        run = {"preset": args.preset, "seeds": args.seeds, "steps": args.steps, "init": source, "rows": rows}
        write_results(args.out, "rl_step_time", run, table)


def to_markdown(rows: list[dict]) -> str:
    """One line per (arm, backend, overlap); "vs first backend" is the first backend's step time of the
    arm (at the same overlap) over this one's."""
    header = "| arm | expert GEMM | overlap | step s | rollout s | rest s | vs first backend | first step s | reward step 0 |"
    lines = [header, "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        base = next(r for r in rows if r["arm"] == row["arm"] and r["overlap"] == row["overlap"])
        lines.append(f"| {row['arm']} | {row['gemm']} | {'on' if row['overlap'] else 'off'} | {row['step_s']:.2f} | "
                     f"{row['rollout_s']:.2f} | {row['rest_s']:.2f} | {base['step_s'] / row['step_s']:.2f}x | "
                     f"{row['first_step_s']:.1f} | {row['reward_step0']:.3f} |")
    lines += ["\n" + row["trace"] for row in rows if "trace" in row]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
