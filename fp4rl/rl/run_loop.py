"""A trainer's run: resume or start, then step by step the records, the evaluation schedule, the
stop checks and the checkpoints, until done.json.

The checkpoint holds params and optimizer state, so a killed run restarted with the same command
recomputes the same steps bit for bit (on CPU) and re-logs nothing twice. A restart under other
settings is refused unless asked for (`fp4rl.rl.resume`); checkpoints are verified on restore, and
a damaged or unfinished newest one is moved aside (kept), logged and recorded, and the run goes on
from the newest good one (`fp4rl.rl.checkpoint`). Progress messages go to `<arm dir>/train.log` as
well as the console. Each step goes through `Trainer.step`, which may start the next step on the
device before it returns (`RLConfig.overlap`); nothing here depends on whether it did.

`trainer` below is a `fp4rl.rl.trainer.Trainer` (not imported: that module imports this one).
"""

from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm

from fp4rl.rl import resume
from fp4rl.rl.metrics_log import MetricsWriter, truncate_after
from fp4rl.rl.run_dir import RunLog
from fp4rl.run_files import write_json_atomic

UPDATES_FILE = "updates.jsonl"


def run(trainer) -> list[list[dict]]:
    """Run (or resume) the trainer's seeds; each seed's records, from the first step this process ran."""
    log = RunLog(trainer.dir, echo=trainer.progress)
    try:
        return _run(trainer, log)
    except BaseException as err:
        log(f"stopped: {type(err).__name__}: {err}", echo=False)
        raise
    finally:
        trainer.drop_ahead()
        log.close()


def _run(trainer, log: RunLog) -> list[list[dict]]:
    c = trainer.config
    _announce(trainer, log)
    state, start = restore_or_init(trainer, log)
    trainer._release_initial_weights()
    if start:
        log(f"resuming from step {start} (checkpoint of step {start - 1} in {trainer.ckpt.directory})")
    writers = _SeedWriters(trainer, start)
    _record_settings(trainer, log, start)
    history = [[] for _ in trainer.seeds]
    # The policy before any update, on the same held-out problems and keys: the baseline of
    # "does RL learn" (logged with step 0 as eval/initial_*).
    initial = trainer.evaluate(state["params"]) if c.eval_every and start == 0 else [{} for _ in trainer.seeds]
    bar = tqdm(range(start, c.steps), desc=f"rl {c.arm} x{len(trainer.seeds)} seeds", disable=not trainer.progress,
               initial=start, total=c.steps)
    for step in bar:
        if step == start:
            log(f"step {step}: the first step of this process compiles the programs not compiled ahead "
                "(seconds on CPU, minutes for a large model)")
        state, records, update_records = trainer.step(state, step)
        if step == 0:
            for r, e in zip(records, initial):
                r.update({k.replace("eval/", "eval/initial_"): v for k, v in e.items()})
        if c.eval_every and ((step + 1) % c.eval_every == 0 or step == c.steps - 1):
            for r, e in zip(records, trainer.evaluate(state["params"])):
                r.update(e)
        writers.write(records, update_records)
        for h, r in zip(history, records):
            h.append(r)
        _report(log, bar, step, records)
        _stop_if_nonfinite(trainer, state, step, records)
        if (step + 1) % c.checkpoint_every == 0 or step == c.steps - 1:
            meta = {"step": step, "recipe": trainer.recipe.to_json(), "layer_map": trainer.layer_map}
            trainer.ckpt.save(step, state, meta)
            log(f"step {step}: checkpoint saved", echo=False)
    writers.close()
    trainer.ckpt.close()
    write_json_atomic(trainer.dir / resume.DONE_FILE, {"steps": c.steps, "seeds": trainer.seeds})
    log(f"finished: {c.steps} steps")
    return history


def _announce(trainer, log: RunLog) -> None:
    c = trainer.config
    start_from = f"checkpoint {c.model.hf}" if c.model.hf else f"warm-up {c.init}"
    log(f"rl {c.arm}: seeds {trainer.seeds}, {c.steps} steps, {start_from}, run directory {trainer.dir}; "
        f"{trainer.layer_map['summary']}")
    if c.eval_every:
        held_out = sum(len(answers) for _, _, answers in trainer.eval_batches)
        source = f"rows of {c.eval_file}" if c.eval_file else f"problems of stream {c.eval_task_seed}"
        log(f"held-out evaluation every {c.eval_every} steps and at the last: {held_out} {source}")


def _record_settings(trainer, log: RunLog, start: int) -> None:
    """config.json for a new run; for a resumed one under changed settings, the change recorded."""
    if start == 0:
        write_json_atomic(trainer.dir / resume.CONFIG_FILE, trainer._config_record(), indent=2)
    elif trainer.setting_changes:
        resume.record(trainer.dir, trainer.setting_changes, start, trainer._config_record())
        log(f"settings changed on resume (recorded in {resume.CHANGES_FILE}): {resume.describe(trainer.setting_changes)}")


class _SeedWriters:
    """Each seed's metrics.jsonl (and TensorBoard) and updates.jsonl, cut back to the steps before
    `start` (a resumed run recomputes the later ones)."""

    def __init__(self, trainer, start: int):
        self.metrics, self.updates = [], []
        for seed in trainer.seeds:
            seed_dir = trainer.dir / f"seed{seed}"
            truncate_after(seed_dir / "metrics.jsonl", start - 1)
            truncate_after(seed_dir / UPDATES_FILE, start - 1)
            self.metrics.append(MetricsWriter(seed_dir, purge_step=start or None))
            self.updates.append(MetricsWriter(seed_dir, tensorboard=False, filename=UPDATES_FILE))

    def write(self, records: list[dict], update_records: list[list[dict]]) -> None:
        for w, uw, r, u in zip(self.metrics, self.updates, records, update_records):
            for line in u:
                uw.write(line)
            w.write(r)

    def close(self) -> None:
        for w in self.metrics + self.updates:
            w.close()


def _report(log: RunLog, bar, step: int, records: list[dict]) -> None:
    reward, grad_norm = np.mean([r["reward/mean"] for r in records]), np.mean([r["grad_norm/global"] for r in records])
    bar.set_postfix(reward=f"{reward:.3f}", grad_norm=f"{grad_norm:.3g}")
    log(f"step {step}: reward {reward:.3f} grad_norm {grad_norm:.3g} "
        f"({np.mean([r['time/step_s'] for r in records]):.1f}s)", echo=False)


def _stop_if_nonfinite(trainer, state, step: int, records: list[dict]) -> None:
    """`on_nonfinite=stop` stops on a non-finite loss, gradient or update, before the next step's
    update; non-finite weights stop every run, before they are saved."""
    c = trainer.config
    if any(r["nonfinite"] for r in records) and c.on_nonfinite == "stop":
        raise FloatingPointError(f"non-finite loss, gradient or update at step {step} of arm {c.arm} "
                                 "(set --on_nonfinite=skip to skip such updates instead)")
    trainer._check_finite(state["params"], f"the weights after step {step}", "lower --optim.lr or look for the cause")


def restore_or_init(trainer, log: RunLog):
    """(state, first step to run): the newest good checkpoint's, checked against this run, or the
    initial state. The steps after the one resumed from are saved again, and a step is never
    overwritten: the bad ones (and saves cut short) are moved aside, kept, logged and recorded."""
    state = trainer._initial_state()
    restored = trainer.ckpt.restore_latest(state, set_aside=True)
    moved = (() if restored is None else restored.set_aside) + trainer.ckpt.set_aside_uncommitted()
    for m in moved:  # the console had the warnings
        log(f"warning: checkpoint step {m.step} is damaged or incomplete ({m.reason}); moved aside and kept: "
            f"{m.moved} -> {m.to}", echo=False)
    if moved:
        resume.record_recovery(trainer.dir, moved, None if restored is None else restored.step)
    if restored is None:
        trainer._check_finite(state["params"], f"the warm-up {trainer.config.init}", "retrain the warm-up")
        return state, 0
    step, meta = restored.step, restored.meta
    _check_checkpoint(trainer, step, meta)
    state = trainer.programs.put_state(restored.state)
    trainer._check_finite(state["params"], f"checkpoint step {step} in {trainer.ckpt.directory}", "start a new --out")
    if "data_states" in meta:
        log(f"checkpoint step {step} holds data-iterator positions, which this trainer does not read: each step "
            f"from {step + 1} on reads the prompts at its own positions of each seed's order (data.step_batch_index)")
    return state, step + 1


def _check_checkpoint(trainer, step: int, meta: dict) -> None:
    """A checkpoint resumes only into a run at least as long, under its recipe and layer map."""
    directory = trainer.ckpt.directory
    if step + 1 > trainer.config.steps:
        raise ValueError(f"steps={trainer.config.steps} is fewer than the {step + 1} steps of the checkpoint in "
                         f"{directory}: a run is extended, never shortened; start a new --out")
    if meta.get("recipe") != trainer.recipe.to_json():
        raise ValueError(f"{directory} (step {step}) was trained under recipe {meta.get('recipe')}, "
                         f"but this run asks for {trainer.recipe.to_json()}: resume with the arm it was started "
                         "with, or start a new --out")
    # Checkpoints written before the map was stored carry the recipe only (checked above).
    if "layer_map" in meta and meta["layer_map"] != trainer.layer_map:
        raise ValueError(f"{directory} (step {step}) put its precisions on the layers as {meta['layer_map']}, "
                         f"but this run's model gives {trainer.layer_map}: resume on the model it was started with")
