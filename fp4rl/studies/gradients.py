"""Fixed-parameter gradient measurements: does a recipe's policy gradient differ from BF16's by
more than the RL noise does?

At the warm-up parameters, `batches` rollout batches are drawn once with the BF16 sampler
(dynamic sampling as in the trainer) and reused for every recipe. Per recipe and batch: the
gradient of the trainer's loss (`policy.make_loss_fn`) on-policy (`on_policy`: the old log-probs
are the gradient program's own forward, so the ratio is exactly 1), drawn under `sr_keys`
stochastic-rounding / Hadamard keys when the recipe has a quantized NVFP4 backward (one key
otherwise: nothing else is random), and compared at the same batch with two references: the BF16
gradient and the straight-through gradient of the recipe's own quantized forward
(`straight_through`: its forward with a BF16 backward). A recipe whose backward is already BF16 (the
paper's baseline: nvfp4, +46, +hp, full-dq, mxfp8) is its own straight-through gradient: its
comparison with it is exactly 0. Per batch the mean over keys is also
projected (`Projection`) so that the cross-batch Gram matrices give the error of the mean
gradient and the batch-to-batch noise of BF16 (the RL noise floor). Also measured: the policy
change KL(old || new) of one AdamW update per learning rate (from a fresh AdamW state, or one warmed
on `adam_warmup_batches` earlier batches of the recipe's own gradients), and the sampler/trainer k3 KL per
forward class, compute dtype and quantizer implementation. `fp4rl.analysis.gradient_report` turns
the raw arrays into statistics with bootstrap CIs over batches, the decision, report and plots.

Programs: one gradient program per distinct gradient source (arms with the same forward share
their straight-through view), one log-prob / sampler / sync program per forward class (and dtype,
impl), and three small programs shared by all (compare, project, optimizer step).
`gradient_programs.Programs` compiles them ahead, on `compile_workers` threads (XLA compiles
without holding the GIL), and times each: on CPU compiling is most of the run.

Longer than ~400 lines because one `Session` holds the rollout batches, programs and raw arrays
that every measurement shares (gradients, policy change, mismatch); the programs are in
`gradient_programs`, the statistics in `fp4rl.analysis.gradient_report`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from fp4rl import operands
from fp4rl.analysis import gradient_report
from fp4rl.model import sync as model_sync
from fp4rl.model.config import ModelConfig
from fp4rl.model.transformer import graphdef_of
from fp4rl.recipe import SITE_KINDS, PrecisionRecipe, draws_keys, is_straight_through, straight_through
from fp4rl.rl import dapo, data, evaluation, policy, rollout, sft
from fp4rl.studies import gradient_store
from fp4rl.studies.gradient_programs import GROUPS, Programs, Projection, group_dots, group_sums, leaf_groups
from fp4rl.rl.task import make_problem

from fp4rl.studies.gradients_config import REFERENCE, GradientsConfig

F32 = jnp.float32


# ---------------------------------------------------------------------------------- recipes
# ---------------------------------------------------------------------------------- measurement
ROLLOUT_STREAM, SR_STREAM, MISMATCH_STREAM, PROMPT_STREAM = 0, 1, 2, 3
KERNEL_IMPLS = ("triton", "mosaic")  # need a GPU


def _has_quantized_site(recipe: PrecisionRecipe) -> bool:
    return any(getattr(recipe, k).quantized for k in SITE_KINDS)


def _key(root, *path):
    for i in path:
        root = jax.random.fold_in(root, i)
    return root


class Session:
    """The warm-up, the recipes (name -> PrecisionRecipe, named or not) and their programs.

    Gradient sources, each computed once per batch: BF16, the straight-through view of each
    forward (named after the first recipe that is its own view, e.g. "nvfp4", else
    "ste:<first recipe>"), then every recipe not already among them. A recipe is compared with
    "bf16" and with its straight-through view ("ste"; itself for a recipe with a BF16 backward,
    an error of exactly 0); a view that is no recipe with "bf16" only.
    Every program is registered (and, with compile workers, starts compiling) at construction.
    `rollouts()`, then `gradients(batches)` and `mismatch(batches)` return the raw arrays that
    `fp4rl.analysis.gradient_report.analyze` reads.
    """

    def __init__(self, config: GradientsConfig, recipes: dict[str, PrecisionRecipe], warmup=None, progress: bool = True):
        self.config, self.recipes, self.progress = config, dict(recipes), progress
        self.graphdef, self.params, meta = sft.load(config.init) if warmup is None else warmup
        self.model_config = ModelConfig.from_dict(meta["model_config"]).resolved()
        self.warmup_sha256 = meta.get("params_sha256") or sft.params_digest(self.params)
        self.impl = operands.resolve_impl(config.impl)
        self.groups = leaf_groups(self.params, self.model_config.num_layers)
        self.projection, self.hashes = Projection.build(self.params, self.groups, config.sketch_dim, config.seed)
        r = config.rollout
        self.rows, self.prompt_len, self.new_tokens = r.prompts_per_step * r.group_size, r.prompt_len, r.max_new_tokens
        self.root = jax.random.key(config.seed)
        bf16 = PrecisionRecipe.from_name(REFERENCE)
        self.sources = {bf16: REFERENCE}
        for name, recipe in self.recipes.items():  # a BF16-backward recipe is its view's source, under its name
            if is_straight_through(recipe):
                self.sources.setdefault(straight_through(recipe), name)
        for name, recipe in self.recipes.items():
            self.sources.setdefault(straight_through(recipe), f"ste:{name}")
        for name, recipe in self.recipes.items():
            if not is_straight_through(recipe):
                self.sources.setdefault(recipe, name)
        missing = [name for name in self.recipes if name not in self.sources.values()]
        if missing:
            raise ValueError(f"recipes {missing} compute the gradient of an earlier recipe: measure each gradient once")
        self.refs_of = {src: {"bf16": REFERENCE} for src in self.sources.values()}
        for name, recipe in self.recipes.items():
            self.refs_of[name] = {"bf16": REFERENCE, "ste": self.sources[straight_through(recipe)]}
        self.reference_sources = {ref for refs in self.refs_of.values() for ref in refs.values()}
        self.classes = {}  # forward class (a `forward_only()` view) -> the names of its recipes
        for name, recipe in [*self.recipes.items(), (REFERENCE, bf16)]:
            names = self.classes.setdefault(recipe.forward_only(), [])
            names += [] if name in names else [name]
        self.programs = Programs(config.compile_workers)
        self._register()

    # ------------------------------------------------------------------ programs
    def _class_name(self, cls) -> str:
        return "|".join(self.classes[cls])

    def _graphdef(self, dtype: str):
        """The model's graphdef computing in `dtype` (same params: only the config differs)."""
        if dtype == self.model_config.dtype:
            return self.graphdef
        return graphdef_of(dataclasses.replace(self.model_config, dtype=dtype))

    def _impl(self, cls, impl: str) -> str:
        return impl if _has_quantized_site(cls) else "reference"  # no quantizer runs: one program

    def logp(self, cls, dtype: str, impl: str):
        """(params, tokens, valid) -> response log-probs under the forward class."""
        key = ("logp", cls, dtype, self._impl(cls, impl))
        fn = policy.response_logprobs_fn(self._graphdef(dtype), cls, self.prompt_len, key[3], self.config.rollout.temperature)
        n, length = self.rows, self.prompt_len + self.new_tokens
        self.programs.add(key, f"logp {self._class_name(cls)} {dtype} {key[3]}", lambda p, t, v: fn(p, t, v)[0],
                          self.params, _spec((n, length), jnp.int32), _spec((n, length), bool))
        return key

    def _sync_fn(self, cls, impl: str):
        return lambda p: model_sync.sync_weights(p, self.model_config, cls, impl)[0]

    def sync(self, cls, impl: str):
        key = ("sync", cls, self._impl(cls, impl))
        self.programs.add(key, f"sync {self._class_name(cls)} {key[2]}", self._sync_fn(cls, key[2]), self.params)
        return key

    def sampler(self, cls, dtype: str, impl: str):
        """(qparams, prompt_ids, prompt_mask, key, temperature) -> SampleOutput."""
        impl = self._impl(cls, impl)
        key = ("sample", cls, dtype, impl)
        scfg = evaluation.sampler_config(self.new_tokens, self.config.rollout.temperature)
        qparams = jax.eval_shape(self._sync_fn(cls, impl), self.params)
        prompts = (_spec((self.rows, self.prompt_len), jnp.int32), _spec((self.rows, self.prompt_len), bool))
        self.programs.add(key, f"sample {self._class_name(cls)} {dtype} {impl}",
                          evaluation.sample_fn(self._graphdef(dtype), cls, scfg, impl), qparams, *prompts, jax.random.key(0),
                          jnp.float32(1))
        return key

    def gradient(self, recipe: PrecisionRecipe):
        """(params, batch, keys_K) -> g0 (the first key's gradient), mean over keys (absent with one
        key: g0 is the mean), SR variance per group (unbiased over keys), max |ratio - 1| (on-policy check)."""
        key, k, r = ("grad", recipe), (self.config.sr_keys if draws_keys(recipe) else 1), self.config.rollout
        loss_fn = policy.make_loss_fn(self.graphdef, recipe, r.loss, self.model_config.aux_loss_coef, self.prompt_len,
                                      self.impl, r.temperature, on_policy=True)
        groups = self.groups

        def one(params, batch, key):
            (_, stats), g = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, key)
            dev = jnp.maximum(jnp.abs(stats["ratio_max"] - 1), jnp.abs(stats["ratio_min"] - 1))
            return g, jnp.where(jnp.any(batch.response_mask_NxTr), dev, 0.0)

        def run(params, batch, keys_K):
            if k == 1:  # one draw is its own mean: one parameter-sized output, not two (`gradients` reads g0)
                g, dev = one(params, batch, keys_K[0])
                return {"g0": g, "ratio_dev": dev, "sr_var": jnp.zeros(len(GROUPS), F32)}
            g_K, dev_K = jax.lax.map(lambda key: one(params, batch, key), keys_K)
            mean = jax.tree.map(lambda x: jnp.mean(x.astype(F32), 0), g_K)
            spread = [jnp.sum(jnp.square(x.astype(F32) - m))  # per leaf: sum over keys of ||g_k - mean||^2
                      for x, m in zip(jax.tree.leaves(g_K), jax.tree.leaves(mean))]
            return {"g0": jax.tree.map(lambda x: x[0], g_K), "mean": mean, "ratio_dev": jnp.max(dev_K),
                    "sr_var": group_sums(spread, groups) / max(k - 1, 1)}

        n, length, t = self.rows, self.prompt_len + self.new_tokens, self.new_tokens
        batch = policy.Batch(_spec((n, length), jnp.int32), _spec((n, length), bool), _spec((n, t), bool), _spec((n, t), F32),
                             _spec((n, t), F32), _spec((n, t), F32), _spec((n,), F32))
        self.programs.add(key, f"grad {self.sources[recipe]}", run, self.params, batch, jax.random.split(jax.random.key(0), k))
        return key

    def _shared(self) -> None:
        """compare (g0, mean, ref) -> per-group squared norms and dots; project; one AdamW step."""
        groups, o = self.groups, self.config.optim

        def compare(g0, mean, ref):
            diff = jax.tree.map(jnp.subtract, mean, ref)
            return {"err_sq": group_dots(diff, diff, groups), "dot0": group_dots(g0, ref, groups),
                    "g0_sq": group_dots(g0, g0, groups), "ref_sq": group_dots(ref, ref, groups)}

        def optimizer(lr):
            return policy.make_optimizer(lr, 1, o.weight_decay, o.b1, o.b2, o.clip_norm)

        def step(params, grads, lr):
            updates, _ = optimizer(lr).update(grads, optimizer(lr).init(params), params)
            return optax.apply_updates(params, updates)

        self.programs.add("compare", "compare", compare, self.params, self.params, self.params)
        self.programs.add("project", "project", self.projection, self.params, self.hashes)
        self.programs.add("step", "adamw step", step, self.params, self.params, jnp.float32(0))
        if self.config.adam_warmup_batches:
            # AdamW's moments do not depend on the learning rate (clipping comes before them, weight
            # decay after), so one warmed state serves every lr of the measurement.
            def warm(params, state, grads):
                return optimizer(1.0).update(grads, state, params)[1]

            def warm_step(params, state, grads, lr):
                return optax.apply_updates(params, optimizer(lr).update(grads, state, params)[0])

            state = jax.eval_shape(optimizer(1.0).init, self.params)
            self.programs.add("adam init", "adamw init", optimizer(1.0).init, self.params)
            self.programs.add("adam warm", "adamw warm", warm, self.params, state, self.params)
            self.programs.add("warm step", "adamw step (warmed)", warm_step, self.params, state, self.params, jnp.float32(0))

    def _register(self) -> None:
        """Every program, in the order first needed (compile-ahead starts with the rollout sampler)."""
        c, dtype = self.config, self.model_config.dtype
        bf16 = PrecisionRecipe.from_name(REFERENCE).forward_only()
        self.sampler(bf16, dtype, self.impl)
        for cls in self.classes:
            self.logp(cls, dtype, self.impl)
        for recipe in self.sources:
            self.gradient(recipe)
        self._shared()
        for cls in self.classes:
            for d in c.dtypes:
                for impl in filter(_impl_available, c.impls):
                    if _has_quantized_site(cls):
                        self.sync(cls, impl)
                    self.sampler(cls, d, impl)
                    self.logp(cls, d, impl)

    # ------------------------------------------------------------------ rollouts
    def _prompts(self, rng):
        r = self.config.rollout
        indices = rng.integers(0, data.DataConfig().num_problems, r.prompts_per_step)
        problems = [make_problem(int(i), r.task_seed, r.task) for i in indices]
        records = [{"prompt": p.prompt, "answer": p.answer, "index": int(i)} for p, i in zip(problems, indices)]
        cols = data.collate_prompts(records, r.prompt_len)
        ids, mask = (np.repeat(cols[k], r.group_size, 0) for k in ("prompt_ids_BxT", "prompt_mask_BxT"))
        return ids.astype(np.int32), mask, cols["answer_B"]

    def rollouts(self) -> tuple[list[dict], dict, str]:
        """(batches, stats, SHA-256 of the batches) from `config.rollouts_file` when it holds this
        warm-up's batches, else drawn (`draw_rollouts`) and stored there."""
        path, key = self.config.rollouts_file, gradient_store.rollout_key(self.config, self.warmup_sha256)
        if path and Path(path).is_file():
            print(f"rollouts: read from {path}")
            return gradient_store.load_rollouts(path, key)
        batches, stats = self.draw_rollouts()
        if path:
            return batches, stats, gradient_store.save_rollouts(path, batches, stats, key)
        return batches, stats, gradient_store.rollouts_digest(batches)

    def draw_rollouts(self) -> tuple[list[dict], dict]:
        """(batches, stats): per batch the `rollout.training_arrays` of one pool filled as the trainer
        fills a step (up to `max_gen_batches` generation batches), plus its first prompts."""
        r, p = self.config.rollout, self.programs
        sample = self.sampler(PrecisionRecipe.from_name(REFERENCE).forward_only(), self.model_config.dtype, self.impl)
        rng = np.random.default_rng([self.config.seed, PROMPT_STREAM])
        batches, stats = [], {"accuracy": [], "gen_batches": [], "kept_group_frac": [], "loss_tokens": []}
        for b in tqdm(range(self.config.batches), desc="rollouts (bf16 sampler)", disable=not self.progress):
            pool, first = rollout.GroupPool(r.prompts_per_step), None
            for i in range(r.max_gen_batches):
                ids, mask, answers = self._prompts(rng)
                key = _key(self.root, ROLLOUT_STREAM, b, i)
                out = jax.device_get(p(sample, self.params, ids, mask, key, jnp.float32(r.temperature)))
                gen = rollout.Generation(ids, mask, out.tokens, out.logprobs, out.lengths, out.router_topk, answers)
                pool.add(gen, *rollout.score(gen, r.group_size, r.max_new_tokens, r.overlong_buffer))
                first = first or (ids, mask)
                if pool.full:
                    break
            arrays = rollout.training_arrays(pool.filled(), r.group_size)
            batches.append({**arrays, "prompt_ids": first[0], "prompt_mask": first[1]})
            stats["accuracy"].append(pool.accuracy)
            stats["gen_batches"].append(i + 1)
            stats["kept_group_frac"].append(float(np.mean(arrays["used"])))
            stats["loss_tokens"].append(int(arrays["response_mask"].sum()))
        return batches, stats

    # ------------------------------------------------------------------ gradients
    def gradients(self, batches: list[dict]) -> dict:
        """Per source and batch: comparisons with its references, SR variance, on-policy check and
        projection; per recipe the KL(old || new) of one AdamW step per learning rate."""
        c, p, dtype = self.config, self.programs, self.model_config.dtype
        names = list(self.sources.values())
        cmp = {src: {ref: [] for ref in self.refs_of[src]} for src in names}
        sr_var, ratio_dev, vectors = ({src: [] for src in names} for _ in range(3))
        kl = {name: [] for name in self.recipes}
        lrs = [jnp.float32(lr) for lr in c.optim.lrs]
        warm_batches = c.adam_warmup_batches
        kl_end = len(batches) if c.kl_batches is None else warm_batches + c.kl_batches
        states = {name: p("adam init", self.params) for name in self.recipes} if warm_batches else {}
        for b, arrays in enumerate(tqdm(batches, desc=f"gradients ({len(names)} per batch)", disable=not self.progress)):
            tokens, valid = jnp.asarray(arrays["tokens"], jnp.int32), jnp.asarray(arrays["valid"], bool)
            rmask = jnp.asarray(arrays["response_mask"], bool)
            logp_old = {cls: p(self.logp(cls, dtype, self.impl), self.params, tokens, valid) for cls in self.classes}
            keys = jax.random.split(_key(self.root, SR_STREAM, b), c.sr_keys)
            means = {}  # the mean gradients this batch's later sources are compared with
            for recipe, src in self.sources.items():
                cls = recipe.forward_only()
                old = logp_old[cls]  # the recipe's forward: the KL's reference (the loss uses its own)
                batch = policy.Batch(tokens, valid, rmask, old, jnp.asarray(arrays["logp_sampler"], F32), old,
                                     jnp.asarray(arrays["advantages"], F32))
                out = p(self.gradient(recipe), self.params, batch, keys if draws_keys(recipe) else keys[:1])
                mean = means[src] = out.get("mean", out["g0"])
                for ref, ref_src in self.refs_of[src].items():
                    cmp[src][ref].append(jax.device_get(p("compare", out["g0"], mean, means[ref_src])))
                if src not in self.reference_sources:  # frees a parameter-sized buffer (GBs at the largest presets)
                    del means[src]
                vectors[src].append([np.asarray(v) for v in p("project", mean, self.hashes)])
                sr_var[src].append(np.asarray(out["sr_var"]))
                ratio_dev[src].append(float(out["ratio_dev"]))
                if src in kl and b < warm_batches:  # the recipe's own gradient into its AdamW moments
                    states[src] = p("adam warm", self.params, states[src], out["g0"])
                elif src in kl and b < kl_end:  # one AdamW step with the first key's gradient, then the same forward
                    row = []
                    for lr in lrs:  # one stepped copy of the parameters at a time
                        new = (p("warm step", self.params, states[src], out["g0"], lr) if warm_batches
                               else p("step", self.params, out["g0"], lr))
                        new_logp = p(self.logp(cls, dtype, self.impl), new, tokens, valid)
                        row.append(float(dapo.masked_mean(dapo.kl_k3(old, new_logp), rmask)))
                    kl[src].append(row)
        atoms = {src: [np.stack([v[a] for v in vectors[src]]) for a in range(len(self.projection.atoms))] for src in names}
        stack = lambda rows: {k: np.stack([r[k] for r in rows]) for k in rows[0]}  # noqa: E731
        return {
            "groups": list(GROUPS), "batches": len(batches), "lrs": list(c.optim.lrs), "reference": REFERENCE,
            "recipes": list(self.recipes), "sources": names, "refs_of": self.refs_of,
            "sr_keys": {src: (c.sr_keys if draws_keys(recipe) else 1) for recipe, src in self.sources.items()},
            "forward_class": {name: self._class_name(recipe.forward_only()) for name, recipe in self.recipes.items()},
            "per_batch": {src: {"cmp": {ref: stack(v) for ref, v in cmp[src].items()}, "sr_var": np.stack(sr_var[src]),
                                "ratio_dev": np.asarray(ratio_dev[src])} for src in names},
            # Gram matrices of m - ref (differences first: no cancellation) and of the references.
            "gram_diff": {src: {ref: self.projection.group_gram([x - y for x, y in zip(atoms[src], atoms[ref_src])])
                                for ref, ref_src in self.refs_of[src].items()} for src in names},
            "gram_ref": {src: self.projection.group_gram(atoms[src])
                         for src in {r for refs in self.refs_of.values() for r in refs.values()}},
            "kl": {name: np.asarray(v) for name, v in kl.items()},
            "kl_batches_range": [warm_batches, kl_end],  # [first, end) of the batches the policy change is measured on
            "sketched_groups": [g for i, g in enumerate(GROUPS)
                                if any(s and i in m for s, m in zip(self.projection.sketched, self.projection.atom_groups))],
        }

    # ------------------------------------------------------------------ sampler / trainer mismatch
    def mismatch(self, batches: list[dict]) -> dict:
        """forward class -> "dtype/impl" -> per batch k3 KL(sampler || trainer) on the response
        tokens (sampler: synced weights and KV cache; trainer: `response_logprobs_fn` on the master
        weights), or why the variant is not available."""
        c, p = self.config, self.programs
        out = {}
        variants = [(cls, d, i) for cls in self.classes for d in c.dtypes for i in c.impls]
        for cls, dtype, impl in tqdm(variants, desc="sampler/trainer mismatch", disable=not self.progress):
            row = out.setdefault(self._class_name(cls), {})
            if not _impl_available(impl):
                row[f"{dtype}/{impl}"] = f"n/a ({impl} needs a GPU; backend {jax.default_backend()})"
                continue
            qparams = p(self.sync(cls, impl), self.params) if _has_quantized_site(cls) else self.params
            k3 = []
            for m in range(c.mismatch_batches):
                ids, mask = batches[m]["prompt_ids"], batches[m]["prompt_mask"]
                s = p(self.sampler(cls, dtype, impl), qparams, ids, mask, _key(self.root, MISMATCH_STREAM, m),
                      jnp.float32(c.rollout.temperature))
                response_valid = jnp.arange(self.new_tokens)[None, :] < s.lengths[:, None]
                trainer = p(self.logp(cls, dtype, impl), self.params, jnp.concatenate([jnp.asarray(ids), s.tokens], 1),
                            jnp.concatenate([jnp.asarray(mask), response_valid], 1))
                k3.append(float(dapo.mismatch_stats(trainer, s.logprobs, response_valid)["mismatch_k3"]))
            row[f"{dtype}/{impl}"] = np.asarray(k3)
        return out


def _spec(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def _impl_available(impl: str) -> bool:
    return impl not in KERNEL_IMPLS or jax.default_backend() == "gpu"


def _settings(config: GradientsConfig) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def _analyze_and_write(config: GradientsConfig, raw: dict, settings: dict, extra: dict) -> dict:
    """Statistics and decision of `raw`; gradients.json, report and plots under `config.out`, and
    the raw arrays unless they are those of merged parts (which keep them)."""
    results = gradient_report.analyze(raw, config.bootstrap, config.seed)
    results["config"] = settings
    results["rollouts_sha256"], results["warmup_sha256"] = raw["rollouts_sha256"], raw["warmup_sha256"]
    results.update(extra)
    if not config.merge:
        gradient_store.save_raw(raw, settings, config.out)
    gradient_report.write(results, config.out)
    return results


def run(config: GradientsConfig, warmup=None, progress: bool = True) -> dict:
    """Measure every recipe of `config` (`warmup`: an already loaded `sft.load(config.init)`), or
    merge the measurements of `config.merge`; write gradients.json, the raw arrays, report.md and
    the plots under `config.out`, print the conclusion; returns the results (gradients.json)."""
    if config.merge:
        return merge(config)
    t0 = time.perf_counter()
    recipes = {name: PrecisionRecipe.from_name(name) for name in config.recipe_names}
    session = Session(config, recipes, warmup, progress)
    timings = {}
    mc = session.model_config
    model = {"config": dataclasses.asdict(mc), "backend": jax.default_backend(), "impl": session.impl,
             "high_precision": {n: r.high_precision_summary(mc.num_layers) for n, r in recipes.items()}}

    def write(raw, timings):  # every number so far, so that a run cut short by a time limit keeps them
        compile_s = session.programs.seconds
        timings = {**timings, "compile_s": dict(sorted(compile_s.items(), key=lambda kv: -kv[1])),
                   "compile_total_s": sum(compile_s.values()), "total_s": time.perf_counter() - t0}
        raw["model"], raw["timings"] = model, timings
        return _analyze_and_write(config, raw, _settings(config), {"model": model, "timings": timings})

    try:
        t = time.perf_counter()
        batches, rollout_stats, digest = session.rollouts()
        timings["rollouts_s"], t = time.perf_counter() - t, time.perf_counter()
        raw = session.gradients(batches)
        timings["gradients_s"], t = time.perf_counter() - t, time.perf_counter()
        raw["rollouts"], raw["mismatch"] = rollout_stats, {}
        raw["rollouts_sha256"], raw["warmup_sha256"] = digest, session.warmup_sha256
        if config.dtypes and config.impls:
            write(raw, timings)
            raw["mismatch"] = session.mismatch(batches)
            timings["mismatch_s"] = time.perf_counter() - t
    finally:
        session.programs.close()
    results = write(raw, timings)
    print(results["decision"]["conclusion"])
    return results


def merge(config: GradientsConfig) -> dict:
    """Analyse the measurements under `config.merge` (same rollouts, disjoint recipes) as one."""
    parts = [gradient_store.load_raw(d) for d in config.merge]
    raw, settings = gradient_store.merge(parts)
    for (part, _), d in zip(parts, config.merge):
        print(f"merge: {d}: {', '.join(part['recipes'])}")
    settings = {**settings, "recipes": list(raw["recipes"]), "merge": list(config.merge), "out": config.out}
    extra = {"model": parts[0][0]["model"], "merged_from": {d: p["recipes"] for (p, _), d in zip(parts, config.merge)},
             "timings": {d: p["timings"] for (p, _), d in zip(parts, config.merge)},
             "reference_drift": raw.get("reference_drift", {"max": 0.0, "median": 0.0})}
    results = _analyze_and_write(config, raw, settings, extra)
    print(results["decision"]["conclusion"])
    return results
