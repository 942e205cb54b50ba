"""The DAPO trainer: N seeds of one arm in one compiled program, resumable, logged every step.

`Trainer` holds one arm's run: its inputs, its compiled programs (`step_programs`), the step
(`train_step`: sync -> rollouts -> updates), the step's records (`step_records`), the held-out
evaluation (`held_out`) and the run loop (`run_loop`: resume, records, evaluation schedule,
checkpoints). Every function that touches the model is vmapped over a leading seed axis; only
the recipe differs across arms.

With `RLConfig.overlap`, `step` dispatches the next step's weight sync and first sampler call
before it fetches this step's outputs and builds its records, so the device samples while the
host works; the values are the same either way (a step's prompts and keys are a pure function of
(seed, step, generation batch): `train_step`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Callable

import jax
import numpy as np

from fp4rl.grouped import AUTO
from fp4rl.model.transformer import graphdef_of
from fp4rl.parallel import placement
from fp4rl.parallel.mesh import make_mesh
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import data, held_out, run_inputs, run_loop, step_records
from fp4rl.rl.checkpoint import Checkpointer
from fp4rl.rl.rl_config import (ModelSource, OptimConfig, RLConfig, arm_dir, check_settings, has_checkpoint,
                                is_finished, resolve_settings, settings, warmup_model_config)
from fp4rl.rl.run_dir import prepare_out
from fp4rl.rl.run_loop import UPDATES_FILE
from fp4rl.rl.step_programs import StepPrograms, finite_per_seed, stack
from fp4rl.rl.train_step import Head, StepRunner
from fp4rl.rl.update_stats import UPDATE_KEYS

# The run's settings are defined in `rl_config`; callers reach them through this module too.
__all__ = ["Trainer", "train", "UPDATE_KEYS", "UPDATES_FILE", "ModelSource", "OptimConfig", "RLConfig", "arm_dir",
           "check_settings", "has_checkpoint", "is_finished", "resolve_settings", "settings", "warmup_model_config"]



class Trainer:
    """One arm's run. `warmup`: the `sft.load(config.init)` triple, when the caller has it loaded
    already (the ablation runner loads it once for every arm); `inputs`: every input read already
    (`run_inputs.load`: the initial policy, a warm-up's or a Hugging Face checkpoint's, the codec
    and the prompt records)."""

    def __init__(self, config: RLConfig, progress: bool = True, warmup=None, inputs: run_inputs.RunInputs | None = None):
        requested = config
        self.progress = progress
        self.recipe = PrecisionRecipe.from_name(config.arm)
        inputs = run_inputs.load(config, warmup) if inputs is None else inputs
        self.graphdef, self.ref_params, self.sft_meta, self.codec = inputs.graphdef, inputs.params, inputs.meta, inputs.codec
        # The initial model (a config saved without a backend, or with "auto", resolves as
        # `sft.load` built its graphdef), then this run's backend: "auto" resolved once, here.
        self.warmup_config = self.model_config = inputs.model_config
        self.config = config = resolve_settings(config, self.warmup_config)
        if config.expert_gemm and config.expert_gemm != self.model_config.expert_gemm:
            self.model_config = dataclasses.replace(self.model_config, expert_gemm=config.expert_gemm)
            self.graphdef = graphdef_of(self.model_config)
        self.seeds = [config.seed_offset + k for k in range(config.seeds)]
        prepare_out(config.out)
        self.dir = arm_dir(config)
        self.dir.mkdir(parents=True, exist_ok=True)
        # Multi-device: the same programs under `jax.set_mesh`, rows split over the mesh, state
        # replicated but for the expert stacks (fp4rl.parallel.placement); None: one device.
        mesh = None if config.mesh.trivial else make_mesh(config.mesh)
        if mesh is not None:
            config.mesh.check_experts(self.model_config.num_experts)
        self.programs = StepPrograms(config, self.graphdef, self.model_config, self.recipe, self.codec, self.ref_params, mesh)
        if mesh is not None:
            self.ref_params = placement.place_state(self.ref_params, mesh)  # every state derives from it
        self.eval_batches = held_out.batches(config, inputs, self.codec)
        dcfg = lambda seed: data.DataConfig(batch_size=config.prompts_per_step, max_len=config.prompt_len,  # noqa: E731
                                            shuffle_seed=seed, task_seed=config.task_seed)
        # Random access, not an iterator: see `StepRunner.batch_prompts`.
        self.prompt_batches = [data.prompt_batches(inputs.records, dcfg(s), self.codec) for s in self.seeds]
        self.stepper = StepRunner(config, self.programs, self.prompt_batches, self.codec, lambda: self.ref_params_S)
        self.layer_map = self.recipe.layer_map(self.model_config.num_layers, self.model_config.shared_expert_d_ff > 0)
        self.ckpt = Checkpointer(self.dir / "checkpoint")
        self._ahead: Head | None = None  # the next step, started by `step` under overlap
        # Checked here, before anything compiles; only a run with a checkpoint resumes (without one
        # it starts over and rewrites config.json).
        self.setting_changes = check_settings(requested, self.warmup_config) if self.ckpt.steps() else {}

    @functools.cached_property
    def ref_params_S(self):
        """The reference stacked per seed, so that it reuses the policy's compiled log-probs."""
        return self.programs.put_state(stack([self.ref_params] * len(self.seeds)))

    # ------------------------------------------------------------------ compiling ahead
    def compile_tasks(self) -> list[tuple[tuple, Callable[[], Any]]]:
        """Ahead-of-time compilation of the three programs of `step` and `evaluate`: (key, task) pairs;
        a task returns its compiled program (e.g. for `memory_analysis()`).
        On a mesh there are none (the tasks compile for one device's argument shardings).

        A task lowers and compiles one program for the abstract arguments (shapes, dtypes, weak
        types) that `step` and `evaluate` pass it, which fills JAX's trace, lowering and executable
        caches: the first real call only dispatches. Tasks may run on other threads (XLA compiles
        without holding the GIL): the ablation runner compiles later arms while one trains. Equal
        keys are the same program (arms sharing a forward): one task per key is enough. Nothing
        here is needed for correctness; a program that is not compiled ahead compiles on first use.
        """
        return [(key, lambda lower=lower: lower().compile()) for _, key, lower in self.lowerings()]

    def lowerings(self) -> list[tuple[str, tuple, Callable[[], Any]]]:
        """(name, key, lower) of the programs `compile_tasks` compiles (`StepPrograms.lowerings`)."""
        return self.programs.lowerings(self.ref_params)

    # ------------------------------------------------------------------ state
    def _initial_state(self):
        return self.programs.put_state(self.programs.fresh_state(self.ref_params))

    def _release_initial_weights(self):
        """Without reference log-probs (`RLConfig.reference_logprobs`) nothing reads the initial
        weights once the state holds its own copy: only their shapes stay (`lowerings` needs no
        more), so the devices hold the f32 weights once, not twice."""
        if not self.config.reference_logprobs:
            self.ref_params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), self.ref_params)

    def _check_finite(self, params_S, what: str, advice: str) -> None:
        """Every run refuses to train from or save non-finite weights, whatever `on_nonfinite` says:
        a skipped update keeps finite weights finite, so these could only come from elsewhere. The
        flags `step` dispatched for these weights, if it did, are read instead of a new program
        (which would wait behind the next step's sampler)."""
        ahead = self._ahead
        flags = ahead.finite if ahead is not None and ahead.params is params_S else finite_per_seed(params_S)
        bad = [seed for seed, ok in zip(self.seeds, np.asarray(flags)) if not ok]
        if bad:
            raise FloatingPointError(f"non-finite parameters in {what} (arm {self.config.arm}, seed(s) {bad}): "
                                     f"nothing was saved; {advice}")

    def _config_record(self) -> dict:
        model_config = self.sft_meta["model_config"]
        if model_config.get("expert_gemm") == AUTO:  # a warm-up config written by hand: what it resolved to
            model_config = {**model_config, "expert_gemm": self.warmup_config.expert_gemm}
        return {"rl_config": settings(self.config), "recipe": json.loads(self.recipe.to_json()),
                "model_config": model_config, "layer_map": self.layer_map, "codec": self.codec.name,
                # which warm-up the run started from, whatever folder it lay in (merge_seeds compares it)
                "warmup_sha256": self.sft_meta.get("params_sha256")}

    # ------------------------------------------------------------------ one step
    def begin_step(self, params_S, step: int) -> Head:
        """Dispatch `step`'s weight sync and first sampler call from `params_S` (a step's start)."""
        return self.stepper.begin(params_S, step)

    def step(self, state, step: int):
        """(state after `step`, per-seed records, per-seed updates.jsonl lines). Under
        `RLConfig.overlap` the next step (if the run has one) is started from the new state before
        this step's records are built, and used by the next call if it passes that state."""
        with self.programs.on_mesh():
            ahead, self._ahead = self._ahead, None
            head = ahead if ahead is not None and ahead.step == step and ahead.params is state["params"] else None
            outputs = self.stepper.run(state, head or self.begin_step(state["params"], step))
            next_start = None
            if self.config.overlap and step + 1 < self.config.steps:
                params = outputs.state["params"]
                finite = finite_per_seed(params)  # queued before the next sync: `_check_finite` reads it
                self._ahead = dataclasses.replace(self.begin_step(params, step + 1), finite=finite)
                next_start = self._ahead.t_start
            records, lines = step_records.build(outputs, self.config.max_new_tokens, next_start)
            return outputs.state, records, lines

    def drop_ahead(self) -> None:
        """Forget a started next step (the run stopped): its device buffers are freed."""
        self._ahead = None

    # ------------------------------------------------------------------ evaluation and the run
    def evaluate(self, params_S) -> list[dict]:
        """Held-out accuracy of every seed's `params_S` (`held_out.evaluate`)."""
        with self.programs.on_mesh():
            return held_out.evaluate(self.programs, self.config, self.codec, self.eval_batches, params_S)

    def run(self) -> list[list[dict]]:
        """Run (or resume) the seeds (`run_loop.run`): each seed's records of the steps run here."""
        return run_loop.run(self)


def train(config: RLConfig, progress: bool = True, inputs: run_inputs.RunInputs | None = None):
    """Run (or resume) the arm's seeds; inputs: `run_inputs.load(config)` when the caller loaded them."""
    return Trainer(config, progress, inputs=inputs).run()
