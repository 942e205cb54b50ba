"""The DAPO trainer: N seeds of one arm in one compiled program, resumable, logged every step.

Per step: weight sync (the master weights quantized once under the recipe; the sampler uses
those bytes), group sampling with dynamic sampling, rewards on the host, trainer log-probs
(the recomputed old policy, the mismatch against the sampler, the routing flips), then
`mini_batches` AdamW updates with the pre-clip gradient norm logged. Every function that
touches the model is vmapped over a leading seed axis; only the recipe differs across arms.

Reproducibility: each step's randomness is `fold_in(key(seed), step)`, and a seed's prompts for
generation batch b of a step are read at a fixed position of its shuffled order
(`data.step_batch_index`), so a seed's prompts and keys depend on (seed, step, b) alone: not on the
seeds beside it, nor on how many generation batches they, an earlier step or another arm needed
(the ablation pairs seed k of every arm with bf16's; the last bits of its values may still depend
on how many seeds share the program: docs/rl.md, "Runs: resuming, checkpoints, reproducibility").
The checkpoint holds params and optimizer state, so a killed run restarted with the same command
recomputes the same steps bit for bit (on CPU) and re-logs nothing twice. A restart under other
settings is refused unless asked for (`fp4rl.rl.resume`); checkpoints are verified on restore, and
a damaged or unfinished newest one is moved aside (kept), logged and recorded, and the run goes on
from the newest good one (`fp4rl.rl.checkpoint`). Progress messages go to `<arm dir>/train.log` as
well as the console.

Longer than ~400 lines because the compiled programs (sync, sample, update), the step that chains
them, ahead-of-time compilation and the run loop share the seed-stacked state and the exact
argument shapes they are compiled for; the pure pieces are in `policy`, `rollout`, `dapo`,
`resume` and `checkpoint`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from fp4rl.grouped import AUTO
from fp4rl.model import sync as model_sync
from fp4rl.model.config import ModelConfig
from fp4rl.model.sampler import SampleOutput
from fp4rl.model.transformer import graphdef_of
from fp4rl.parallel import placement
from fp4rl.parallel.mesh import make_mesh
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import column_trim, data, dapo, evaluation, failures, policy, resume, rollout, run_inputs, update_stats
from fp4rl.rl.checkpoint import Checkpointer
from fp4rl.rl.codec import decode_batch
from fp4rl.rl.metrics_log import MetricsWriter, device_memory, truncate_after
from fp4rl.rl.rl_config import (ModelSource, OptimConfig, RLConfig, arm_dir, check_settings, has_checkpoint,
                                is_finished, resolve_settings, settings, warmup_model_config)
from fp4rl.rl.run_dir import RunLog, prepare_out, write_json_atomic
from fp4rl.rl.update_stats import UPDATE_KEYS

# The run's settings are defined in `rl_config`; callers reach them through this module too.
__all__ = ["Trainer", "train", "UPDATE_KEYS", "UPDATES_FILE", "ModelSource", "OptimConfig", "RLConfig", "arm_dir",
           "check_settings", "has_checkpoint", "is_finished", "resolve_settings", "settings", "warmup_model_config"]


UPDATES_FILE = "updates.jsonl"


@jax.jit
def _finite_per_seed(params_S):
    """[S] bool: every parameter of seed s is finite."""
    return functools.reduce(jnp.logical_and, [jnp.all(jnp.isfinite(x.reshape(x.shape[0], -1)), axis=1)
                                              for x in jax.tree.leaves(params_S)])


def _stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _committed(tree):
    """The tree committed to the default device, as every jit output is. Every argument of the
    four programs goes through here, so a program sees the same argument shardings on every call
    (uncommitted initial arrays would make the update lower and compile a second time: ~15 s per
    quantized-backward arm on CPU), and `Trainer.compile_tasks` compiles for exactly these."""
    return jax.device_put(tree, jax.devices()[0])


def _abstract(tree):
    """The abstract (shape, dtype, weak type, sharding) twin of a committed tree's leaves."""
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=getattr(x, "weak_type", False),
                                                       sharding=sharding), tree)


@functools.partial(jax.jit, static_argnums=0)
def _seed_keys(seeds: tuple[int, ...], step, stream):
    """fold_in(fold_in(key(seed), step), stream) per seed, stacked: one compiled program (the same
    bits as the eager ops, which would each be a dispatch)."""
    return jnp.stack([jax.random.fold_in(jax.random.fold_in(jax.random.key(s), step), stream) for s in seeds])


@functools.lru_cache(maxsize=2)
def _apply_flag(apply: bool):
    """The update program's `apply` argument, committed like every other argument (`_committed`)."""
    return _committed(jnp.asarray(apply))


SEED_AXIS = "seed"  # the name of the vmapped seed axis (the sampler's decode loop stops on all seeds at once)


@functools.lru_cache(maxsize=16)
def _forward_programs(graphdef, model_config: ModelConfig, recipe: PrecisionRecipe, sampler, impl: str):
    """(sync, sample): the programs that run the forward only, jitted and vmapped over a leading
    seed axis. `recipe` is a `forward_only()` view, so arms that differ only in their backward
    (nvfp4/nvfp4-pt/+dq, +46/full-hp, +hp/full-46, full/full-dq, mxfp8-q/mxfp8/mxfp8+dq) get the same
    jitted functions: in one process a later arm of such a group traces, lowers and compiles neither
    of them."""
    sample_one = evaluation.sample_fn(graphdef, recipe, sampler, impl, seed_axis=SEED_AXIS)

    def sync(params):
        return model_sync.sync_weights(params, model_config, recipe, impl)

    def sample(qparams, prompt_ids, prompt_mask, key, temperature):
        return sample_one(qparams, prompt_ids, prompt_mask, key, temperature)

    return jax.jit(jax.vmap(sync)), jax.jit(jax.vmap(sample, in_axes=(0, 0, 0, 0, None), axis_name=SEED_AXIS))


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
        o = config.optim
        self.optimizer = policy.make_optimizer(o.lr, o.warmup_steps, o.weight_decay, o.b1, o.b2, o.clip_norm)
        self._grad_masks = policy.grad_group_masks(self.ref_params, self.model_config.num_layers)
        self._update_programs = {}
        self._update = self._update_program(config.prompt_len)
        scfg = evaluation.sampler_config(config.max_new_tokens, config.temperature, config.top_p, self.codec,
                                         config.prompt_prefill)
        self._sync, self._sample = _forward_programs(
            self.graphdef, self.model_config, self.recipe.forward_only(), scfg, config.impl)
        self._eval_batches = self._held_out_batches(inputs)
        dcfg = lambda seed: data.DataConfig(batch_size=config.prompts_per_step, max_len=config.prompt_len,  # noqa: E731
                                            shuffle_seed=seed, task_seed=config.task_seed)
        # Random access, not an iterator: see `_prompt_batches`.
        self.prompt_batches = [data.prompt_batches(inputs.records, dcfg(s), self.codec) for s in self.seeds]
        self.layer_map = self.recipe.layer_map(self.model_config.num_layers, self.model_config.shared_expert_d_ff > 0)
        self.ckpt = Checkpointer(self.dir / "checkpoint")
        # Multi-device: the same programs under `jax.set_mesh`, rows split over the mesh, state
        # replicated but for the expert stacks (fp4rl.parallel.placement); None: one device.
        self.mesh = None if config.mesh.trivial else make_mesh(config.mesh)
        if self.mesh is not None:
            config.mesh.check_experts(self.model_config.num_experts)
            self.ref_params = placement.place_state(self.ref_params, self.mesh)  # every state derives from it
        # Checked here, before anything compiles; only a run with a checkpoint resumes (without one
        # it starts over and rewrites config.json).
        self.setting_changes = check_settings(requested, self.warmup_config) if self.ckpt.steps() else {}

    def _held_out_batches(self, inputs: run_inputs.RunInputs):
        """The evaluation's prompt batches, in the rollout's shape (one compiled sampler): the first
        eval_prompts usable rows of eval_file for a data-file run, else the procedural held-out stream."""
        c = self.config
        rows = c.prompts_per_step * c.group_size
        if not c.eval_every:
            return []
        if c.eval_file:
            if inputs.eval_rows is None:
                raise ValueError(f"eval_file={c.eval_file!r} but the run's inputs hold no eval rows: load them with "
                                 "run_inputs.load(config) for this config")
            return evaluation.held_out_file_prompts(inputs.eval_rows, c.eval_prompts, c.prompt_len, rows, self.codec)
        return evaluation.held_out_prompts(c.task, c.eval_task_seed, c.eval_prompts, c.prompt_len, rows, self.codec)

    @functools.cached_property
    def ref_params_S(self):
        """The reference stacked per seed, so that it reuses the policy's compiled log-probs."""
        return self._put_state(_stack([self.ref_params] * len(self.seeds)))

    # ------------------------------------------------------------------ placement
    def _put(self, tree):
        """Replicated (one device: committed to it, `_committed`)."""
        return _committed(tree) if self.mesh is None else jax.device_put(tree, jax.sharding.NamedSharding(
            self.mesh, jax.sharding.PartitionSpec()))

    def _put_rows(self, tree):
        """[seeds, rows, ...] arrays with their rows split over the mesh."""
        return _committed(tree) if self.mesh is None else placement.place_rows(tree, self.mesh, row_axis=1)

    def _put_state(self, tree):
        """Params / optimizer state per seed: expert stacks split over "expert", the rest replicated."""
        return _committed(tree) if self.mesh is None else placement.place_state(tree, self.mesh, lead=1)

    def _on_mesh(self):
        return contextlib.nullcontext() if self.mesh is None else jax.set_mesh(self.mesh)

    def _update_program(self, prompt_len: int):
        """The update program (jitted, vmapped over seeds) for rows whose responses start at column
        `prompt_len`: the configured width, or a trimmed step's (`RLConfig.trim_padding`); built
        once per width and kept by this trainer (not by a class-level cache, which would keep every
        trainer of an ablation, and its device arrays, alive)."""
        if prompt_len in self._update_programs:
            return self._update_programs[prompt_len]
        c = self.config
        fns = policy.make_functions(self.graphdef, self.recipe, self.optimizer, c.loss, self.model_config.aux_loss_coef,
                                    prompt_len, self._grad_masks, c.impl, c.temperature, c.memory)
        skip = c.on_nonfinite == "skip"

        def update(params, opt_state, batch, key, apply):
            return fns["update"](params, opt_state, batch, key, apply, skip)

        # `apply` (not per seed): False runs the forward only (old and reference log-probs).
        program = self._update_programs[prompt_len] = jax.jit(jax.vmap(update, in_axes=(0, 0, 0, 0, None)))
        return program

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
        """(name, key, lower) of the programs `compile_tasks` compiles: "sync", "sample", "update";
        `lower()` returns the program lowered for the abstract arguments `step` passes (also what
        tools/program_digest.py hashes); none on a mesh (see `compile_tasks`)."""
        if self.mesh is not None:
            return []
        c = self.config
        S, R, P, T = len(self.seeds), c.prompts_per_step * c.group_size, c.prompt_len, c.max_new_tokens
        n, rows_per_call = R // c.mini_batches, R // c.generation_chunks
        i32, f32 = jnp.int32, jnp.float32
        spec = lambda shape, dtype: _abstract(jax.ShapeDtypeStruct(shape, dtype))  # noqa: E731
        state = lambda: _abstract(jax.eval_shape(self._fresh_state, self.ref_params))  # noqa: E731
        keys = lambda: _abstract(jax.eval_shape(lambda: self._step_keys(0, 0)))  # noqa: E731

        def sync():
            return self._sync.lower(state()["params"])

        def sample():
            qparams = _abstract(jax.eval_shape(self._sync, state()["params"])[0])
            return self._sample.lower(qparams, spec((S, rows_per_call, P), i32), spec((S, rows_per_call, P), bool), keys(),
                                      spec((), f32))

        def update():
            s = state()
            batch = policy.Batch(spec((S, n, P + T), i32), spec((S, n, P + T), bool), spec((S, n, T), bool),
                                 spec((S, n, T), f32), spec((S, n, T), f32), spec((S, n, T), f32), spec((S, n), f32))
            return self._update.lower(s["params"], s["opt_state"], batch, keys(), spec((), bool))

        shapes = (S, R, P, T)
        return [("sync", (self._sync, shapes), sync), ("sample", (self._sample, shapes, rows_per_call), sample),
                ("update", (self._update, shapes, n), update)]

    # ------------------------------------------------------------------ state
    def _fresh_state(self, initial):
        params = _stack([initial] * len(self.seeds))
        return {"params": params, "opt_state": jax.vmap(self.optimizer.init)(params)}

    def _initial_state(self):
        return self._put_state(self._fresh_state(self.ref_params))

    def _release_initial_weights(self):
        """Without reference log-probs (`RLConfig.reference_logprobs`) nothing reads the initial
        weights once the state holds its own copy: only their shapes stay (`lowerings` needs no
        more), so the devices hold the f32 weights once, not twice."""
        if not self.config.reference_logprobs:
            self.ref_params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), self.ref_params)

    def _restore_or_init(self, log):
        state = self._initial_state()
        # The steps after the one resumed from are saved again, and a step is never overwritten:
        # the bad ones (and saves cut short) are moved aside, kept, logged and recorded.
        restored = self.ckpt.restore_latest(state, set_aside=True)
        moved = (() if restored is None else restored.set_aside) + self.ckpt.set_aside_uncommitted()
        for m in moved:  # the console had the warnings
            log(f"warning: checkpoint step {m.step} is damaged or incomplete ({m.reason}); moved aside and kept: "
                f"{m.moved} -> {m.to}", echo=False)
        if moved:
            resume.record_recovery(self.dir, moved, None if restored is None else restored.step)
        if restored is None:
            self._check_finite(state["params"], f"the warm-up {self.config.init}", "retrain the warm-up")
            return state, 0
        step, state, meta = restored.step, restored.state, restored.meta
        if step + 1 > self.config.steps:
            raise ValueError(f"steps={self.config.steps} is fewer than the {step + 1} steps of the checkpoint in "
                             f"{self.ckpt.directory}: a run is extended, never shortened; start a new --out")
        if meta.get("recipe") != self.recipe.to_json():
            raise ValueError(f"{self.ckpt.directory} (step {step}) was trained under recipe {meta.get('recipe')}, "
                             f"but this run asks for {self.recipe.to_json()}: resume with the arm it was started "
                             "with, or start a new --out")
        # Checkpoints written before the map was stored carry the recipe only (checked above).
        if "layer_map" in meta and meta["layer_map"] != self.layer_map:
            raise ValueError(f"{self.ckpt.directory} (step {step}) put its precisions on the layers as {meta['layer_map']}, "
                             f"but this run's model gives {self.layer_map}: resume on the model it was started with")
        state = self._put_state(state)
        self._check_finite(state["params"], f"checkpoint step {step} in {self.ckpt.directory}", "start a new --out")
        if "data_states" in meta:
            log(f"checkpoint step {step} holds data-iterator positions, which this trainer does not read: each step "
                f"from {step + 1} on reads the prompts at its own positions of each seed's order (data.step_batch_index)")
        return state, step + 1

    def _check_finite(self, params_S, what: str, advice: str) -> None:
        """Every run refuses to train from or save non-finite weights, whatever `on_nonfinite` says:
        a skipped update keeps finite weights finite, so these could only come from elsewhere."""
        bad = [seed for seed, ok in zip(self.seeds, np.asarray(_finite_per_seed(params_S))) if not ok]
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

    def _seed_dirs(self):
        return [self.dir / f"seed{s}" for s in self.seeds]

    # ------------------------------------------------------------------ one step
    def _step_keys(self, step: int, stream: int):
        """One key per seed for (step, stream): a pure function of them, so a resumed run
        draws exactly what an uninterrupted one would."""
        return self._put(_seed_keys(tuple(self.seeds), step, stream))

    def _prompt_batches(self, step: int, b: int) -> list[dict]:
        """Each seed's prompt batch for generation batch `b` of `step`: a pure function of (seed,
        step, b), read by position from the seed's shuffled order (`data.step_batch_index`). A seed
        whose pool is full still rides along in the vmapped sampler (its output is dropped); it
        reads the same batch it would read alone, and its next step starts at its own position."""
        index = data.step_batch_index(step, b, self.config.max_gen_batches)
        return [batches[index] for batches in self.prompt_batches]

    def _rollouts(self, qparams, step: int):
        c = self.config
        pools = [rollout.GroupPool(c.prompts_per_step) for _ in self.seeds]
        gen_time = gen_tokens = 0.0
        for b in range(c.max_gen_batches):
            batches = self._prompt_batches(step, b)
            ids = np.stack([np.repeat(x["prompt_ids_BxT"], c.group_size, 0) for x in batches])
            mask = np.stack([np.repeat(x["prompt_mask_BxT"], c.group_size, 0) for x in batches])
            keys = self._step_keys(step, b)
            t0 = time.time()
            out = jax.device_get(self._generate(qparams, ids.astype(np.int32), mask.astype(bool), keys,
                                                jnp.float32(c.temperature)))
            gen_time += time.time() - t0
            gen_tokens += float(np.sum(out.lengths))
            for k, pool in enumerate(pools):
                gen = rollout.Generation(ids[k], mask[k], out.tokens[k], out.logprobs[k], out.lengths[k],
                                         out.router_topk[k], batches[k]["answer_B"])
                correct, shaped = rollout.score(gen, c.group_size, c.max_new_tokens, c.overlong_buffer, self.codec)
                pool.add(gen, correct, shaped)
            if all(p.full for p in pools):
                break
        return pools, b + 1, gen_time, gen_tokens

    def _generate(self, qparams, ids_SxRxP, mask_SxRxP, keys, temperature) -> SampleOutput:
        """The sampler on a generation batch's rows (host arrays [seeds, rows, P]), in
        `generation_chunks` calls of equal rows (the KV cache holds one call's); call j draws with
        `keys` folded with j, one call with `keys` as they are. Returns device arrays: the caller
        fetches what it reads."""
        k = self.config.generation_chunks
        if k == 1:
            return self._sample(qparams, *self._put_rows((ids_SxRxP, mask_SxRxP)), keys, self._put(temperature))
        calls = []
        for j, (ids, mask) in enumerate(zip(np.split(ids_SxRxP, k, axis=1), np.split(mask_SxRxP, k, axis=1))):
            keys_j = self._put(jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, j))
            calls.append(self._sample(qparams, *self._put_rows((ids, mask)), keys_j, self._put(temperature)))
        # rows are axis 1 of [seeds, rows, ...], axis 2 of router_topk [seeds, moe layers, rows, ...]
        return SampleOutput(*(jnp.concatenate(parts, axis=2 if name == "router_topk" else 1)
                              for name, parts in zip(SampleOutput._fields, zip(*calls))))

    def step(self, state, step: int):
        with self._on_mesh():
            return self._step(state, step)

    def _step(self, state, step: int):
        c = self.config
        t_start = time.time()
        qparams, sync_stats = self._sync(state["params"])
        pools, gen_batches, gen_time, gen_tokens = self._rollouts(qparams, step)
        arrays = [rollout.training_arrays(rollout.balanced(p.filled(), c.mini_batches), c.group_size) for p in pools]
        prompt_width, update_program = c.prompt_len, self._update
        if c.trim_padding:
            window = column_trim.used_window(arrays, c.prompt_len, c.max_new_tokens)
            arrays = [column_trim.trim(a, c.prompt_len, window) for a in arrays]
            prompt_width, update_program = window.prompt, self._update_program(window.prompt)
        # explicit dtypes: the programs were compiled ahead for exactly these (compile_tasks)
        dtypes = {"tokens": jnp.int32, "valid": bool, "response_mask": bool, "logp_sampler": jnp.float32,
                  "advantages": jnp.float32}
        # The arrays the programs take (rows on axis 1; the host keeps the rest, e.g. router_topk),
        # cut into mini-batches on the host and placed once each: slicing placed arrays would cost
        # a device op (a dispatch and its wait) per field and mini-batch.
        host = {k: np.asarray(np.stack([a[k] for a in arrays]), dtype) for k, dtype in dtypes.items()}
        host["unknown"] = np.zeros_like(host["logp_sampler"])  # old/reference log-probs, filled in below
        per = host["tokens"].shape[1] // c.mini_batches
        parts = [self._put_rows({k: v[:, m * per : (m + 1) * per] for k, v in host.items()}) for m in range(c.mini_batches)]
        batches = [policy.Batch(p["tokens"], p["valid"], p["response_mask"], p["unknown"], p["logp_sampler"], p["unknown"],
                                p["advantages"]) for p in parts]
        flags = {apply: (_apply_flag(apply) if self.mesh is None else self._put(jnp.asarray(apply))) for apply in (False, True)}
        keys = [self._step_keys(step, 1000 + m) for m in range(c.mini_batches)]

        # Old and reference log-probs through the update program itself (apply=False: forward
        # only), mini-batch by mini-batch: the first update recomputes the old ones bit for bit.
        def forward_pass(params):
            return [update_program(params, state["opt_state"], batches[m], keys[m], flags[False])[2]
                    for m in range(c.mini_batches)]

        old = forward_pass(state["params"])
        logp_old = [o["logp"] for o in old]
        logp_ref = [o["logp"] for o in forward_pass(self.ref_params_S)] if c.reference_logprobs else logp_old
        batches = [dataclasses.replace(b, logp_old_NxTr=self._put_rows(lo), logp_ref_NxTr=self._put_rows(lr))
                   for b, lo, lr in zip(batches, logp_old, logp_ref)]
        response_valid = host["valid"][:, :, prompt_width:]  # real response tokens, incl. masked-out groups
        # `RLConfig.reference_logprobs` off (GRPO's KL term needs them): no loss reads the field, no KL logged
        stats = dapo.step_stats(logp_old, logp_ref if c.reference_logprobs else None, [p["logp_sampler"] for p in parts],
                            [p["response_mask"] for p in parts], response_valid)

        t_train = time.time()
        update_metrics = []
        params, opt_state = state["params"], state["opt_state"]
        for m in range(c.mini_batches):
            params, opt_state, metrics = update_program(params, opt_state, batches[m], keys[m], flags[True])
            if self.mesh is not None:  # keep the state's placement whatever layout XLA chose for the outputs
                params, opt_state = self._put_state((params, opt_state))
            update_metrics.append({k: v for k, v in metrics.items() if k not in ("logp", "router_topk")})
        # fetched once, after every update is queued (a fetch per update would stall the queue)
        update_metrics, stats, trainer_topk = jax.device_get((update_metrics, stats, [o["router_topk"] for o in old]))
        trainer_topk = np.concatenate(trainer_topk, axis=2)
        train_time = time.time() - t_train
        sync_map4 = np.asarray(sync_stats["quant/map4_frac"])

        records, update_records = [], []
        memory = device_memory(jax.local_devices())  # the process's, the same for every seed
        for k in range(len(self.seeds)):
            per_update = update_stats.of_seed(update_metrics, k)
            lengths_all = response_valid[k].sum(1)
            shaped = arrays[k]["shaped"]
            records.append({
                "step": step,
                # Population: every response sampled this step, before dynamic sampling drops any.
                "population/accuracy": pools[k].accuracy,
                "population/reward_mean": pools[k].reward_mean,
                "population/responses": pools[k].sampled,
                # The training batch: the kept groups (and masked fillers when too few were kept).
                "reward/mean": float(shaped.mean()),
                "reward/std": float(shaped.std()),
                "dapo/dropped_group_frac": pools[k].dropped / max(pools[k].generated, 1),
                "dapo/gen_batches": gen_batches,
                "dapo/filled_frac": float(np.mean([g[3] for g in pools[k].filled()])),
                "response_length/mean": float(lengths_all.mean()),
                "response_length/max": float(lengths_all.max()),
                "response_length/trunc_rate": float((lengths_all >= c.max_new_tokens).mean()),
                **update_stats.summary(per_update),
                **({"kl_ref_k3": float(stats["kl_ref_k3"][k])} if "kl_ref_k3" in stats else {}),
                "mismatch/kl_k1": float(stats["mismatch_k1"][k]),
                "mismatch/kl_k3": float(stats["mismatch_k3"][k]),
                "mismatch/max_abs_logp_diff": float(stats["mismatch_abs_max"][k]),
                "mismatch/mean_abs_logp_diff": float(stats["mismatch_abs_mean"][k]),
                "mismatch/mean_exp_abs_diff": float(stats["mismatch_exp_abs_mean"][k]),
                "mismatch/routing_flip": rollout.routing_flip_rate(arrays[k]["router_topk"], trainer_topk[k],
                                                                   response_valid[k]),
                "quant/map4_frac": float(sync_map4[k]),
                "time/step_s": time.time() - t_start,
                "time/rollout_s": gen_time,
                "throughput/rollout_tok_s": gen_tokens / max(gen_time, 1e-9) / len(self.seeds),
                "throughput/train_tok_s": float(host["valid"][k].sum()) / max(train_time, 1e-9),
                "update/columns": int(host["tokens"].shape[2]),
                **memory,
            })
            update_records.append(update_stats.lines(step, per_update))
        return {"params": params, "opt_state": opt_state}, records, update_records

    # ------------------------------------------------------------------ the run
    def run(self) -> list[list[dict]]:
        log = RunLog(self.dir, echo=self.progress)
        try:
            return self._run(log)
        except BaseException as err:
            log(f"stopped: {type(err).__name__}: {err}", echo=False)
            raise
        finally:
            log.close()

    def _run(self, log: RunLog) -> list[list[dict]]:
        c = self.config
        start_from = f"checkpoint {c.model.hf}" if c.model.hf else f"warm-up {c.init}"
        log(f"rl {c.arm}: seeds {self.seeds}, {c.steps} steps, {start_from}, run directory {self.dir}; "
            f"{self.layer_map['summary']}")
        if c.eval_every:
            held_out = sum(len(answers) for _, _, answers in self._eval_batches)
            source = f"rows of {c.eval_file}" if c.eval_file else f"problems of stream {c.eval_task_seed}"
            log(f"held-out evaluation every {c.eval_every} steps and at the last: {held_out} {source}")
        state, start = self._restore_or_init(log)
        self._release_initial_weights()
        if start:
            log(f"resuming from step {start} (checkpoint of step {start - 1} in {self.ckpt.directory})")
        writers, update_writers = [], []
        for seed_dir in self._seed_dirs():
            truncate_after(seed_dir / "metrics.jsonl", start - 1)
            truncate_after(seed_dir / UPDATES_FILE, start - 1)
            writers.append(MetricsWriter(seed_dir, purge_step=start or None))
            update_writers.append(MetricsWriter(seed_dir, tensorboard=False, filename=UPDATES_FILE))
        if start == 0:
            write_json_atomic(self.dir / resume.CONFIG_FILE, self._config_record(), indent=2)
        elif self.setting_changes:
            resume.record(self.dir, self.setting_changes, start, self._config_record())
            log(f"settings changed on resume (recorded in {resume.CHANGES_FILE}): {resume.describe(self.setting_changes)}")
        history = [[] for _ in self.seeds]
        # The policy before any update, on the same held-out problems and keys: the baseline of
        # "does RL learn" (logged with step 0 as eval/initial_*).
        initial = self.evaluate(state["params"]) if c.eval_every and start == 0 else [{} for _ in self.seeds]
        bar = tqdm(range(start, c.steps), desc=f"rl {c.arm} x{len(self.seeds)} seeds", disable=not self.progress,
                   initial=start, total=c.steps)
        for step in bar:
            if step == start:
                log(f"step {step}: the first step of this process compiles the programs not compiled ahead "
                    "(seconds on CPU, minutes for a large model)")
            state, records, update_records = self.step(state, step)
            if step == 0:
                for r, e in zip(records, initial):
                    r.update({k.replace("eval/", "eval/initial_"): v for k, v in e.items()})
            if c.eval_every and ((step + 1) % c.eval_every == 0 or step == c.steps - 1):
                for r, e in zip(records, self.evaluate(state["params"])):
                    r.update(e)
            for w, uw, r, u, h in zip(writers, update_writers, records, update_records, history):
                for line in u:
                    uw.write(line)
                w.write(r)
                h.append(r)
            reward, grad_norm = np.mean([r["reward/mean"] for r in records]), np.mean([r["grad_norm/global"] for r in records])
            bar.set_postfix(reward=f"{reward:.3f}", grad_norm=f"{grad_norm:.3g}")
            log(f"step {step}: reward {reward:.3f} grad_norm {grad_norm:.3g} "
                f"({np.mean([r['time/step_s'] for r in records]):.1f}s)", echo=False)
            if any(r["nonfinite"] for r in records) and c.on_nonfinite == "stop":
                raise FloatingPointError(f"non-finite loss, gradient or update at step {step} of arm {c.arm} "
                                         "(set --on_nonfinite=skip to skip such updates instead)")
            self._check_finite(state["params"], f"the weights after step {step}", "lower --optim.lr or look for the cause")
            if (step + 1) % c.checkpoint_every == 0 or step == c.steps - 1:
                meta = {"step": step, "recipe": self.recipe.to_json(), "layer_map": self.layer_map}
                self.ckpt.save(step, state, meta)
                log(f"step {step}: checkpoint saved", echo=False)
        for w in writers + update_writers:
            w.close()
        self.ckpt.close()
        write_json_atomic(self.dir / resume.DONE_FILE, {"steps": c.steps, "seeds": self.seeds})
        log(f"finished: {c.steps} steps")
        return history

    def evaluate(self, params_S) -> list[dict]:
        with self._on_mesh():
            return self._evaluate(params_S)

    def _evaluate(self, params_S) -> list[dict]:
        """Held-out accuracy per seed through the rollout's compiled sync and sampler (temperature
        is a runtime value: nothing recompiles): greedy (`eval/accuracy`, docs/rl.md's final accuracy)
        and sampled at the rollout temperature (`eval/sampled_accuracy`), with the same keys at
        every evaluation; `eval/n` problems each. The wrong responses are split by `fp4rl.rl.failures`
        (`eval/{greedy,sampled}_{miscopied,wrong_chain}`: fractions of all responses)."""
        c = self.config
        qparams, _ = self._sync(params_S)
        n = len(self.seeds)
        texts = {"greedy": [[] for _ in self.seeds], "sampled": [[] for _ in self.seeds]}
        all_answers = []
        for i, (ids, mask, answers) in enumerate(self._eval_batches):
            keys = jnp.stack([jax.random.fold_in(jax.random.key(c.eval_task_seed), 1000 * s + i) for s in self.seeds])
            all_answers += answers
            for mode, temperature in (("greedy", 0.0), ("sampled", c.temperature)):
                tokens = np.asarray(self._generate(qparams, np.stack([ids] * n).astype(np.int32),
                                                   np.stack([mask] * n).astype(bool), self._put(keys),
                                                   jnp.float32(temperature)).tokens)
                for k in range(n):
                    texts[mode][k] += decode_batch(self.codec, tokens[k][: len(answers)])
        records = []
        for k in range(n):
            greedy, sampled = (failures.fractions(texts[mode][k], all_answers) for mode in ("greedy", "sampled"))
            records.append({"eval/accuracy": greedy["right"], "eval/sampled_accuracy": sampled["right"],
                            "eval/n": len(all_answers),
                            **{f"eval/{mode}_{kind}": fractions[kind] for mode, fractions in
                               (("greedy", greedy), ("sampled", sampled)) for kind in failures.KINDS[1:]}})
        return records


def train(config: RLConfig, progress: bool = True, inputs: run_inputs.RunInputs | None = None):
    """Run (or resume) the arm's seeds; inputs: `run_inputs.load(config)` when the caller loaded them."""
    return Trainer(config, progress, inputs=inputs).run()
