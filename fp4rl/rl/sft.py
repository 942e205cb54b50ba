"""BF16 warm-up: supervised training on worked solutions, then accuracy by difficulty.

docs/rl.md: every RL arm starts from one warm-up checkpoint (also the KL reference), trained until
the RL difficulty band has a sampled (temperature 1) accuracy of about 20-60%. The checkpoint
holds the parameters plus the model config, the recipe and this config, so an RL run needs
nothing but its path. A finished warm-up is never overwritten: training into its directory again
with the same settings returns it, with other settings is an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from fp4rl.model import transformer
from fp4rl.model.config import ModelConfig
from fp4rl.parallel import placement
from fp4rl.parallel.mesh import MeshConfig, make_mesh
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import data, evaluation, resume, tokenizer
from fp4rl.rl.checkpoint import Checkpointer
from fp4rl.rl.run_dir import prepare_out
from fp4rl.run_files import read_json, write_json_atomic
from fp4rl.rl.task import TaskConfig
from fp4rl.rl.token_logprobs import pick_last_axis

SFT_RECIPE = "bf16"


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """model: a ModelConfig preset (vocab is set to the tokenizer's); task: the training mix.

    eval_task: the RL difficulty band whose sampled accuracy the warm-up is calibrated on;
    eval_problems: problems per difficulty level in the accuracy table (0: no table).
    answer_noise: probability that a training solution's final boxed answer is wrong (the
      noisy-teacher warm-up, `task.noisy_solution`; 0 trains on clean solutions).
    """

    model: str = "tiny"
    task: TaskConfig = TaskConfig(min_ops=1, max_ops=3)
    eval_task: TaskConfig = TaskConfig(min_ops=2, max_ops=3)
    steps: int = 300
    batch_size: int = 32
    max_len: int = 96
    lr: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01
    seed: int = 0
    task_seed: int = 0
    eval_task_seed: int = 1_000_003
    eval_problems: int = 32
    max_new_tokens: int = 64
    answer_noise: float = 0.0
    out: str = "runs/sft"
    mesh: MeshConfig = MeshConfig()  # data x expert devices (docs/parallel.md); 1 x 1: one device

    def __post_init__(self):
        self.mesh.check_rows(self.batch_size, "batch_size")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"need 0 <= {self.warmup_steps=} < {self.steps=}")
        if not 0.0 <= self.answer_noise < 1.0:
            raise ValueError(f"answer_noise={self.answer_noise} must be in [0, 1)")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr={self.lr} must be a finite number > 0")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay={self.weight_decay} must be a finite number >= 0")


def model_config(config: SFTConfig) -> ModelConfig:
    """The warm-up's model: the preset with the tokenizer's vocabulary, long enough for a prompt and
    its answer, and expert_gemm resolved on this platform (sft_meta.json records the backend, which
    every RL run from the warm-up keeps unless it names another)."""
    base = ModelConfig.from_name(config.model)
    return dataclasses.replace(base, vocab_size=tokenizer.vocab_size,
                               max_seq_len=max(base.max_seq_len, config.max_len + config.max_new_tokens)).resolved()


def _lm_loss(graphdef, params, batch):
    recipe = PrecisionRecipe.from_name(SFT_RECIPE)
    logits, aux = transformer.forward(graphdef, params, batch["ids_BxT"], recipe, valid=batch["mask_BxT"])
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    nll = -pick_last_axis(logp, batch["ids_BxT"][:, 1:])
    mask = batch["loss_mask_BxT"][:, 1:]
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1), aux["aux_loss"]


def params_digest(params) -> str:
    """SHA-256 of every parameter's bytes in tree order: two warm-ups are the same checkpoint iff
    their digests match (a GPU warm-up is reproducible only with deterministic XLA ops)."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        digest.update(np.asarray(leaf).tobytes())
    return digest.hexdigest()


def checkpoint_dir(out: str | Path) -> Path:
    return Path(out) / "checkpoint"


META_FILE = "sft_meta.json"


def load(out: str | Path):
    """(graphdef, params, meta) of a finished warm-up run directory."""
    directory = checkpoint_dir(out)
    meta = read_json(Path(out) / META_FILE)
    mc = ModelConfig.from_dict(meta["model_config"])
    graphdef, like = transformer.init(mc, 0)
    ckpt = Checkpointer(directory)
    restored = ckpt.restore_latest(like)
    ckpt.close()
    if restored is None:
        raise FileNotFoundError(f"{directory} holds no checkpoint, though {Path(out) / META_FILE} says the warm-up finished")
    return graphdef, restored.state, meta


def is_finished(out: str | Path) -> bool:
    return (Path(out) / META_FILE).exists()


def ensure_warmup(config: SFTConfig, preset: str | None) -> None:
    """Train `config` into `config.out` unless a warm-up is already there (then it is used as
    given). `preset`: the SFT preset `config` came from (`fp4rl.configs.warmup_config`), for the log."""
    if is_finished(config.out):
        print(f"reusing warm-up checkpoint {config.out}")
        return
    print(f"no warm-up at {config.out}: running experiments.sft {'--preset ' + preset if preset else '(defaults)'} "
          f"--out={config.out}")
    train(config)


def settings(config: SFTConfig) -> dict:
    """The config as sft_meta.json records it."""
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def _finished_or_empty(config: SFTConfig) -> dict | None:
    """The metadata of the warm-up already in `config.out` under the same settings (None: the
    directory holds none). A warm-up of other settings, or a checkpoint without metadata (a run
    killed while saving), raises: training over them would keep the old weights under new metadata."""
    out = Path(config.out)
    if is_finished(out):
        meta = read_json(out / META_FILE)
        # a moved directory, or an accuracy table of another size: neither changes the parameters
        changes = resume.differences(meta["sft_config"], settings(config), ignore=("out", "eval_problems"))
        if changes:
            raise ValueError(f"{out} holds a finished warm-up of other settings ({resume.describe(changes)}); "
                             "delete it or choose another --out")
        return meta
    ckpt = checkpoint_dir(out)
    if ckpt.exists() and any(ckpt.iterdir()):
        raise ValueError(f"{ckpt} exists but {out / META_FILE} does not (a warm-up cut short while saving?); "
                         "delete it or choose another --out")
    return None


def build(config: SFTConfig, expert_gemm: str | None = None):
    """The warm-up's pieces: (model config, graphdef, params, optimizer state, jitted step, batch
    iterator, mesh or None); `step(params, opt_state, batch) -> (params, opt_state, loss, grad norm)`.
    expert_gemm: another backend than the platform's default (the step-time benchmark compares them)."""
    mc = model_config(config)
    if expert_gemm is not None:
        mc = dataclasses.replace(mc, expert_gemm=expert_gemm).resolved()
    graphdef, params = transformer.init(mc, config.seed)
    optimizer = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(optax.warmup_cosine_decay_schedule(0.0, config.lr, config.warmup_steps, config.steps, config.lr * 0.1),
                    weight_decay=config.weight_decay),
    )
    opt_state = optimizer.init(params)
    # On a mesh: the same program under jax.set_mesh, sequences split over the devices, the
    # state replicated but for the expert stacks (fp4rl.parallel.placement).
    mesh = None if config.mesh.trivial else make_mesh(config.mesh)
    if mesh is not None:
        config.mesh.check_experts(mc.num_experts)
        params, opt_state = placement.place_state((params, opt_state), mesh)

    @jax.jit
    def step(params, opt_state, batch):
        (loss, aux), grads = jax.value_and_grad(lambda p: _lm_loss(graphdef, p, batch), has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, optax.tree.norm(grads)

    dcfg = data.DataConfig(batch_size=config.batch_size, max_len=config.max_len, shuffle_seed=config.seed, task_seed=config.task_seed)
    records = data.problem_records(config.task, config.task_seed, dcfg.num_problems, config.answer_noise)
    batches = data.iterate(data.sft_batches(records, dcfg), dcfg)
    return mc, graphdef, params, opt_state, step, batches, mesh


def device_batch(batch: dict, mesh):
    """A host batch on the device(s), without the index column."""
    batch = {k: jnp.asarray(v) for k, v in batch.items() if k != "index_B"}
    return batch if mesh is None else placement.place_rows(batch, mesh, row_axis=0)


def train(config: SFTConfig, progress: bool = True) -> dict:
    """Run the warm-up into `config.out`; returns the metadata written beside the checkpoint. A
    finished warm-up of the same settings there is returned as it is (see `_finished_or_empty`)."""
    out = prepare_out(config.out)
    finished = _finished_or_empty(config)
    if finished is not None:
        print(f"warm-up {out} finished earlier with these settings: reusing it")
        return finished
    mc, graphdef, params, opt_state, step, batches, mesh = build(config)
    on_mesh = (lambda: jax.set_mesh(mesh)) if mesh is not None else contextlib.nullcontext  # noqa: E731
    losses, start = [], time.time()
    bar = tqdm(range(config.steps), desc="sft", disable=not progress)
    for i in bar:
        with on_mesh():
            params, opt_state, loss, gnorm = step(params, opt_state, device_batch(next(batches), mesh))
        if i % 10 == 0 or i == config.steps - 1:
            losses.append((i, float(loss)))
            bar.set_postfix(loss=f"{float(loss):.3f}", grad_norm=f"{float(gnorm):.2f}")
            if not (math.isfinite(float(loss)) and math.isfinite(float(gnorm))):
                raise FloatingPointError(f"warm-up step {i}: non-finite loss {float(loss)} or gradient norm "
                                         f"{float(gnorm)} (lr={config.lr}); nothing was saved to {out}")
        if i == 0:
            first_step_s = time.time() - start  # compiling, mostly (the loss above was read, so the step ran)
    train_s = time.time() - start
    if not all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params)):
        raise FloatingPointError(f"warm-up: non-finite parameters after {config.steps} steps (lr={config.lr}); "
                                 f"nothing was saved to {out}")

    # eval_problems=0: no table (a matrix call that only needs the warm-up's parameters skips its ~30 s)
    table = evaluation.accuracy_by_difficulty(graphdef, params, SFT_RECIPE, config.eval_task, config.eval_task_seed,
                                              config.eval_problems, config.max_new_tokens,
                                              seed=config.seed) if config.eval_problems else []
    ckpt = Checkpointer(checkpoint_dir(out))
    ckpt.save(config.steps, params, {"kind": "sft"})
    ckpt.close()
    meta = {
        "model_config": dataclasses.asdict(mc),
        "recipe": PrecisionRecipe.from_name(SFT_RECIPE).to_json(),
        "sft_config": settings(config),
        "param_count": mc.param_count()._asdict(),
        "loss_curve": losses,
        "train_seconds": train_s,
        "first_step_seconds": first_step_s,
        "seconds_per_step": (train_s - first_step_s) / max(config.steps - 1, 1),  # after the first
        "accuracy": table,
        "params_sha256": params_digest(params),
        "backend": jax.default_backend(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    (out / "accuracy.md").write_text(evaluation.accuracy_table_markdown(table))
    write_json_atomic(out / META_FILE, meta, indent=2)  # last: its presence marks the warm-up finished
    return meta
