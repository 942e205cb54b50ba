"""BF16 warm-up: supervised training on worked solutions, then accuracy by difficulty.

RL.md: every RL arm starts from one warm-up checkpoint (also the KL reference), trained until
the RL difficulty band has a sampled (temperature 1) accuracy of about 20-60%. The checkpoint
holds the parameters plus the model config, the recipe and this config, so an RL run needs
nothing but its path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
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
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import data, evaluation, tokenizer
from fp4rl.rl.checkpoint import Checkpointer
from fp4rl.rl.task import TaskConfig

SFT_RECIPE = "bf16"


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """model: a ModelConfig preset (vocab is set to the tokenizer's); task: the training mix.

    eval_task: the RL difficulty band whose sampled accuracy the warm-up is calibrated on;
    eval_problems: problems per difficulty level in the accuracy table.
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

    def __post_init__(self):
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"need 0 <= {self.warmup_steps=} < {self.steps=}")
        if not 0.0 <= self.answer_noise < 1.0:
            raise ValueError(f"answer_noise={self.answer_noise} must be in [0, 1)")


def model_config(config: SFTConfig) -> ModelConfig:
    base = ModelConfig.from_name(config.model)
    return dataclasses.replace(base, vocab_size=tokenizer.vocab_size, max_seq_len=max(base.max_seq_len, config.max_len + config.max_new_tokens))


def _lm_loss(graphdef, params, batch):
    recipe = PrecisionRecipe.from_name(SFT_RECIPE)
    logits, aux = transformer.forward(graphdef, params, batch["ids_BxT"], recipe, valid=batch["mask_BxT"])
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, batch["ids_BxT"][:, 1:, None], axis=-1)[..., 0]
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


def load(out: str | Path):
    """(graphdef, params, meta) of a finished warm-up run directory."""
    directory = checkpoint_dir(out)
    meta = json.loads((Path(out) / "sft_meta.json").read_text())
    mc = ModelConfig(**meta["model_config"])
    graphdef, like = transformer.init(mc, 0)
    ckpt = Checkpointer(directory)
    params, _ = ckpt.restore(ckpt.latest_step(), like)
    ckpt.close()
    return graphdef, params, meta


def is_finished(out: str | Path) -> bool:
    return (Path(out) / "sft_meta.json").exists()


def train(config: SFTConfig, progress: bool = True) -> dict:
    """Run the warm-up into `config.out`; returns the metadata written beside the checkpoint."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    mc = model_config(config)
    graphdef, params = transformer.init(mc, config.seed)
    optimizer = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(optax.warmup_cosine_decay_schedule(0.0, config.lr, config.warmup_steps, config.steps, config.lr * 0.1),
                    weight_decay=config.weight_decay),
    )
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        (loss, aux), grads = jax.value_and_grad(lambda p: _lm_loss(graphdef, p, batch), has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, optax.tree.norm(grads)

    dcfg = data.DataConfig(batch_size=config.batch_size, max_len=config.max_len, shuffle_seed=config.seed, task_seed=config.task_seed)
    records = data.problem_records(config.task, config.task_seed, dcfg.num_problems, config.answer_noise)
    batches = data.iterate(data.sft_batches(records, dcfg), dcfg)
    losses, start = [], time.time()
    bar = tqdm(range(config.steps), desc="sft", disable=not progress)
    for i in bar:
        batch = {k: jnp.asarray(v) for k, v in next(batches).items() if k != "index_B"}
        params, opt_state, loss, gnorm = step(params, opt_state, batch)
        if i % 10 == 0 or i == config.steps - 1:
            losses.append((i, float(loss)))
            bar.set_postfix(loss=f"{float(loss):.3f}", grad_norm=f"{float(gnorm):.2f}")
    train_s = time.time() - start

    table = evaluation.accuracy_by_difficulty(graphdef, params, SFT_RECIPE, config.eval_task, config.eval_task_seed,
                                              config.eval_problems, config.max_new_tokens, seed=config.seed)
    ckpt = Checkpointer(checkpoint_dir(out))
    ckpt.save(config.steps, params, {"kind": "sft"})
    ckpt.close()
    meta = {
        "model_config": dataclasses.asdict(mc),
        "recipe": PrecisionRecipe.from_name(SFT_RECIPE).to_json(),
        "sft_config": json.loads(json.dumps(dataclasses.asdict(config), default=str)),
        "param_count": mc.param_count()._asdict(),
        "loss_curve": losses,
        "train_seconds": train_s,
        "accuracy": table,
        "params_sha256": params_digest(params),
        "backend": jax.default_backend(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    (out / "sft_meta.json").write_text(json.dumps(meta, indent=2))
    (out / "accuracy.md").write_text(evaluation.accuracy_table_markdown(table))
    return meta
