"""The compiled programs of an RL step, where their arguments live, and their ahead-of-time lowering.

Three programs, each jitted and vmapped over a leading seed axis: `sync` (the master weights
quantized once under the recipe; the sampler uses those bytes), `sample` (the KV-cache sampler)
and `update` (one AdamW update of the DAPO loss; with apply=False the forward only, which gives
the old and reference log-probs). Only the recipe differs across arms. Every argument goes
through one placement (`StepPrograms.put*`): committed to the one device, or on a mesh with the
rows split and the state's expert stacks split, so a program sees the same argument shardings on
every call and `lowerings` lowers each for exactly the arguments a step passes.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fp4rl.model import sync as model_sync
from fp4rl.model.config import ModelConfig
from fp4rl.model.sampler import SampleOutput
from fp4rl.parallel import placement
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import evaluation, policy
from fp4rl.rl.codec import TextCodec
from fp4rl.rl.rl_config import RLConfig

SEED_AXIS = "seed"  # the name of the vmapped seed axis (the sampler's decode loop stops on all seeds at once)


@jax.jit
def finite_per_seed(params_S):
    """[S] bool: every parameter of seed s is finite."""
    return functools.reduce(jnp.logical_and, [jnp.all(jnp.isfinite(x.reshape(x.shape[0], -1)), axis=1)
                                              for x in jax.tree.leaves(params_S)])


def stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def committed(tree):
    """The tree committed to the default device, as every jit output is. Every argument of the
    programs goes through here, so a program sees the same argument shardings on every call
    (uncommitted initial arrays would make the update lower and compile a second time: ~15 s per
    quantized-backward arm on CPU), and `StepPrograms.lowerings` lowers for exactly these."""
    return jax.device_put(tree, jax.devices()[0])


def abstract(tree):
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
    """The update program's `apply` argument, committed like every other argument (`committed`)."""
    return committed(jnp.asarray(apply))


@functools.lru_cache(maxsize=16)
def forward_programs(graphdef, model_config: ModelConfig, recipe: PrecisionRecipe, sampler, impl: str):
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


class StepPrograms:
    """One arm's programs for `seeds` seeds and their placement (`mesh`: None is one device).
    `sync`, `sample` and `update` (the configured prompt width's) are attributes, read at each
    call, so a caller may wrap one."""

    def __init__(self, config: RLConfig, graphdef, model_config: ModelConfig, recipe: PrecisionRecipe,
                 codec: TextCodec, initial_params, mesh=None):
        self.config, self.graphdef, self.model_config, self.recipe, self.mesh = config, graphdef, model_config, recipe, mesh
        self.seeds = tuple(config.seed_offset + k for k in range(config.seeds))
        o = config.optim
        self.optimizer = policy.make_optimizer(o.lr, o.warmup_steps, o.weight_decay, o.b1, o.b2, o.clip_norm)
        self._grad_masks = policy.grad_group_masks(initial_params, model_config.num_layers)
        self._update_programs = {}
        self.update = self.update_program(config.prompt_len)
        scfg = evaluation.sampler_config(config.max_new_tokens, config.temperature, config.top_p, codec,
                                         config.prompt_prefill)
        self.sync, self.sample = forward_programs(graphdef, model_config, recipe.forward_only(), scfg, config.impl)

    # ------------------------------------------------------------------ placement
    def put(self, tree):
        """Replicated (one device: committed to it, `committed`)."""
        return committed(tree) if self.mesh is None else jax.device_put(tree, jax.sharding.NamedSharding(
            self.mesh, jax.sharding.PartitionSpec()))

    def put_rows(self, tree):
        """[seeds, rows, ...] arrays with their rows split over the mesh."""
        return committed(tree) if self.mesh is None else placement.place_rows(tree, self.mesh, row_axis=1)

    def put_state(self, tree):
        """Params / optimizer state per seed: expert stacks split over "expert", the rest replicated."""
        return committed(tree) if self.mesh is None else placement.place_state(tree, self.mesh, lead=1)

    def on_mesh(self):
        return contextlib.nullcontext() if self.mesh is None else jax.set_mesh(self.mesh)

    def apply_flag(self, apply: bool):
        """The update program's `apply` argument (False: the forward only)."""
        return _apply_flag(apply) if self.mesh is None else self.put(jnp.asarray(apply))

    def step_keys(self, step: int, stream: int):
        """One key per seed for (step, stream): a pure function of them, so a resumed run
        draws exactly what an uninterrupted one would."""
        return self.put(_seed_keys(self.seeds, step, stream))

    def fresh_state(self, initial):
        """Every seed's params (the initial ones) and optimizer state, not yet placed."""
        params = stack([initial] * len(self.seeds))
        return {"params": params, "opt_state": jax.vmap(self.optimizer.init)(params)}

    # ------------------------------------------------------------------ programs
    def update_program(self, prompt_len: int):
        """The update program (jitted, vmapped over seeds) for rows whose responses start at column
        `prompt_len`: the configured width, or a trimmed step's (`RLConfig.trim_padding`); built
        once per width and kept by these programs (not by a class-level cache, which would keep
        every trainer of an ablation, and its device arrays, alive)."""
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

    def generate(self, qparams, ids_SxRxP, mask_SxRxP, keys, temperature) -> SampleOutput:
        """The sampler on a generation batch's rows (host arrays [seeds, rows, P]), in
        `generation_chunks` calls of equal rows (the KV cache holds one call's); call j draws with
        `keys` folded with j, one call with `keys` as they are. Returns device arrays (dispatched,
        not waited for): the caller fetches what it reads."""
        k = self.config.generation_chunks
        if k == 1:
            return self.sample(qparams, *self.put_rows((ids_SxRxP, mask_SxRxP)), keys, self.put(temperature))
        calls = []
        for j, (ids, mask) in enumerate(zip(np.split(ids_SxRxP, k, axis=1), np.split(mask_SxRxP, k, axis=1))):
            keys_j = self.put(jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, j))
            calls.append(self.sample(qparams, *self.put_rows((ids, mask)), keys_j, self.put(temperature)))
        # rows are axis 1 of [seeds, rows, ...], axis 2 of router_topk [seeds, moe layers, rows, ...]
        return SampleOutput(*(jnp.concatenate(parts, axis=2 if name == "router_topk" else 1)
                              for name, parts in zip(SampleOutput._fields, zip(*calls))))

    # ------------------------------------------------------------------ compiling ahead
    def lowerings(self, initial_params) -> list[tuple[str, tuple, Callable[[], Any]]]:
        """(name, key, lower) of "sync", "sample" and "update": `lower()` lowers the program for the
        abstract arguments (shapes, dtypes, weak types, shardings) a step passes it (also what
        tools/program_digest.py hashes); equal keys are the same program (arms sharing a forward).
        None on a mesh: they lower for one device's argument shardings."""
        if self.mesh is not None:
            return []
        c = self.config
        S, R, P, T = len(self.seeds), c.prompts_per_step * c.group_size, c.prompt_len, c.max_new_tokens
        n, rows_per_call = R // c.mini_batches, R // c.generation_chunks
        i32, f32 = jnp.int32, jnp.float32
        spec = lambda shape, dtype: abstract(jax.ShapeDtypeStruct(shape, dtype))  # noqa: E731
        state = lambda: abstract(jax.eval_shape(self.fresh_state, initial_params))  # noqa: E731
        keys = lambda: abstract(jax.eval_shape(lambda: self.step_keys(0, 0)))  # noqa: E731

        def sync():
            return self.sync.lower(state()["params"])

        def sample():
            qparams = abstract(jax.eval_shape(self.sync, state()["params"])[0])
            return self.sample.lower(qparams, spec((S, rows_per_call, P), i32), spec((S, rows_per_call, P), bool), keys(),
                                     spec((), f32))

        def update():
            s = state()
            batch = policy.Batch(spec((S, n, P + T), i32), spec((S, n, P + T), bool), spec((S, n, T), bool),
                                 spec((S, n, T), f32), spec((S, n, T), f32), spec((S, n, T), f32), spec((S, n), f32))
            return self.update.lower(s["params"], s["opt_state"], batch, keys(), spec((), bool))

        shapes = (S, R, P, T)
        return [("sync", (self.sync, shapes), sync), ("sample", (self.sample, shapes, rows_per_call), sample),
                ("update", (self.update, shapes, n), update)]
