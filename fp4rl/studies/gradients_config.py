"""The settings of the fixed-parameter gradient measurements (`fp4rl.studies.gradients`): the rollouts
and loss (as in the RL runs), the AdamW of the one-update policy change, and what is measured."""

from __future__ import annotations

import dataclasses

from fp4rl import operands
from fp4rl.model.config import DTYPES
from fp4rl.recipe import ABLATION_ARMS, BASELINE_ARMS, PrecisionRecipe
from fp4rl.rl import policy
from fp4rl.rl.rl_config import OptimConfig, RLConfig
from fp4rl.rl.task import TaskConfig

REFERENCE = "bf16"
DEFAULT_RECIPES = ABLATION_ARMS + BASELINE_ARMS


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """The rollout and loss settings, as in the RL runs (defaults: `RLConfig`'s)."""

    task: TaskConfig = RLConfig.task
    task_seed: int = RLConfig.task_seed
    prompt_len: int = RLConfig.prompt_len
    group_size: int = RLConfig.group_size
    prompts_per_step: int = RLConfig.prompts_per_step
    max_gen_batches: int = RLConfig.max_gen_batches
    max_new_tokens: int = RLConfig.max_new_tokens
    overlong_buffer: int = RLConfig.overlong_buffer
    temperature: float = RLConfig.temperature
    loss: policy.LossConfig = RLConfig.loss

    def __post_init__(self):
        if self.group_size < 2 or self.prompts_per_step < 1 or self.max_gen_batches < 1:
            raise ValueError(f"need {self.group_size=} >= 2, {self.prompts_per_step=} >= 1, {self.max_gen_batches=} >= 1")
        if self.temperature <= 0:
            raise ValueError(f"{self.temperature=} must be > 0 (rollouts are sampled)")


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
    """The trainer's AdamW (`policy.make_optimizer`, warm-up 1) at each learning rate of `lrs`."""

    lrs: tuple[float, ...] = (1e-5, 3e-5, 1e-4)
    weight_decay: float = OptimConfig.weight_decay
    b1: float = OptimConfig.b1
    b2: float = OptimConfig.b2
    clip_norm: float = OptimConfig.clip_norm


@dataclasses.dataclass(frozen=True)
class GradientsConfig:
    """batches: B rollout batches (prompts_per_step x group_size rows each), shared by every recipe.
    sr_keys: keys per batch for recipes with a quantized NVFP4 backward (the others are deterministic).
    recipes: `PrecisionRecipe` names; "bf16" (the reference) is always measured.
    impl: quantizer implementation of the gradient programs (operands.IMPLS).
    mismatch_batches / impls / dtypes: the sampler/trainer KL per forward class on the first
      `mismatch_batches` prompt batches, per quantizer implementation (Triton and Mosaic on GPU
      only) and compute dtype (the graphdef re-built with that `ModelConfig.dtype`, same params);
      no dtypes or impls: not measured.
    sketch_dim: per-batch projections keep a group of parameters exactly when it has at most this
      many (0: always), else a CountSketch of this many buckets (`Projection`).
    bootstrap: resamples of the batches per confidence interval (95%, percentile).
    compile_workers: threads compiling the programs ahead (0: each compiles on first use).
    kl_batches: the one-update policy change is measured on the first this many batches after the
      AdamW warm-up batches (None: all of them); three optimizer steps and forwards per recipe and
      batch make it the costliest measurement.
    adam_warmup_batches: W > 0: before the policy change is measured, each recipe's AdamW state is
      warmed on its own gradients of the first W batches (moments only: the parameters stay the
      warm-up's), and the update is measured on the batches after them. A fresh AdamW's first update
      is about -lr * sign(g) per parameter whatever the gradient's error, so with W = 0 (a fresh state)
      equal KL across recipes is built in. Keeps one AdamW state (2x the parameters in f32) per recipe
      on the device.
    rollouts_file: an .npz of the rollout batches (`gradient_store`): read when it exists (it must
      match this warm-up and these rollout settings), else drawn and written there ("": not stored).
    merge: --out directories of earlier measurements on the same rollouts file: their raw arrays
      are combined and analysed as one measurement under `out`; nothing is measured.
    init: the warm-up run directory; out: where gradients.json, report.md and the plots go.
    """

    rollout: RolloutConfig = RolloutConfig()
    batches: int = 8
    sr_keys: int = 4
    optim: UpdateConfig = UpdateConfig()
    recipes: tuple[str, ...] = DEFAULT_RECIPES
    impl: str = "auto"
    mismatch_batches: int = 2
    impls: tuple[str, ...] = ("reference", "triton")
    dtypes: tuple[str, ...] = ("bfloat16", "float32")
    sketch_dim: int = 0
    bootstrap: int = 1000
    compile_workers: int = 0
    kl_batches: int | None = None
    adam_warmup_batches: int = 0
    rollouts_file: str = ""
    merge: tuple[str, ...] = ()
    init: str = "runs/sft"
    out: str = "runs/gradients"
    seed: int = 0

    def __post_init__(self):
        for name in self.recipes:
            PrecisionRecipe.from_name(name)  # a typo names the valid recipes
        if self.batches < 2 or self.sr_keys < 2:
            raise ValueError(f"need {self.batches=} >= 2 (noise floor) and {self.sr_keys=} >= 2 (SR variance)")
        if not 0 <= self.adam_warmup_batches <= self.batches - 2:
            raise ValueError(f"need 0 <= {self.adam_warmup_batches=} <= batches - 2 = {self.batches - 2} "
                             "(the policy change needs 2 batches after the AdamW warm-up)")
        after = self.batches - self.adam_warmup_batches
        if self.kl_batches is not None and not 2 <= self.kl_batches <= after:
            raise ValueError(f"need 2 <= {self.kl_batches=} <= batches - adam_warmup_batches = {after} "
                             "(or None: every batch after the AdamW warm-up)")
        if not 1 <= self.mismatch_batches <= self.batches:
            raise ValueError(f"need 1 <= {self.mismatch_batches=} <= {self.batches=}")
        for impl in (self.impl, *self.impls):
            operands.check_impl(impl)
        if not set(self.dtypes) <= set(DTYPES):
            raise ValueError(f"dtypes={self.dtypes}; valid options: {DTYPES}")
        if self.sketch_dim < 0 or self.bootstrap < 1 or self.compile_workers < 0:
            raise ValueError(f"need {self.sketch_dim=} >= 0, {self.bootstrap=} >= 1, {self.compile_workers=} >= 0")

    @property
    def recipe_names(self) -> tuple[str, ...]:
        return (REFERENCE, *[r for r in self.recipes if r != REFERENCE])


def from_rl_config(rl: RLConfig, **overrides) -> GradientsConfig:
    """The measurement of an RL configuration: its rollout, loss, optimizer, impl and warm-up."""
    names = [f.name for f in dataclasses.fields(RolloutConfig)]
    rollout = RolloutConfig(**{n: getattr(rl, n) for n in names})
    optim = UpdateConfig(weight_decay=rl.optim.weight_decay, b1=rl.optim.b1, b2=rl.optim.b2, clip_norm=rl.optim.clip_norm)
    return dataclasses.replace(GradientsConfig(rollout=rollout, optim=optim, impl=rl.impl, init=rl.init), **overrides)
