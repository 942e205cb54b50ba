"""The settings of one RL arm's run (`RLConfig`, with its optimizer's `OptimConfig` and the source
of the initial policy, `ModelSource`), where its directory lies, what config.json records, and
the check that a resumed run keeps its settings (`fp4rl.rl.resume`).

`fp4rl.rl.trainer` runs a run of these settings; `fp4rl.configs` names its presets.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Literal

from fp4rl import operands
from fp4rl.grouped import AUTO, check_gemm
from fp4rl.model.config import ModelConfig
from fp4rl.parallel.mesh import MeshConfig
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import micro_batch, policy, resume, sft
from fp4rl.run_files import read_json
from fp4rl.rl.run_settings import expert_gemm_of
from fp4rl.rl.task import TaskConfig


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-4
    warmup_steps: int = 2
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.99
    clip_norm: float = 1.0

    def __post_init__(self):
        # A NaN or non-positive LR makes every update non-finite or a no-op: refuse it here, not
        # after a run that trained nothing.
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"optim.lr={self.lr} must be a finite number > 0")
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise ValueError(f"optim.clip_norm={self.clip_norm} must be a finite number > 0")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"optim.weight_decay={self.weight_decay} must be a finite number >= 0")
        if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
            raise ValueError(f"optim.b1={self.b1} and optim.b2={self.b2} must be in [0, 1)")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps={self.warmup_steps} must be >= 0")


MODEL_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """Where the initial policy comes from when it is not a warm-up run.

    hf: a local Hugging Face Qwen3-MoE / Qwen2-MoE folder (config.json, *.safetensors,
      tokenizer.json and a chat template; `fp4rl.model.hf`, `fp4rl.rl.hf_tokenizer`): its weights are
      the initial policy and the KL reference, its tokenizer and chat template build the prompts and
      decode the responses, and its stop tokens end them. "" starts from the warm-up in `init`.
    dtype: the imported model's compute dtype (parameters stay float32, the AdamW master weights).
    """

    hf: str = ""
    dtype: Literal["float32", "bfloat16"] = "float32"

    def __post_init__(self):
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(f"model.dtype={self.dtype!r}; valid options: {', '.join(MODEL_DTYPES)}")


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Every algorithm setting of the RL runs; arms differ only in `arm` (the recipe).

    init: the warm-up run directory (its checkpoint is the start and the KL reference); "" when
      `model.hf` names a Hugging Face checkpoint instead (exactly one of the two is set).
    model: a Hugging Face checkpoint as the initial policy (`ModelSource`).
    data_file: a local DAPO-Math-17k-style file (verl parquet or JSONL, `fp4rl.rl.math_file`) whose
      prompts and integer ground truths replace the procedural task; "" trains on `task`.
      prompt_key / answer_key: its columns (dotted paths; answer_key "" tries
      reward_model.ground_truth, solution, answer).
    prompts_per_step x group_size responses are trained on per step, in `mini_batches`
    updates of whole groups (the kept groups spread evenly over them); `max_gen_batches` bounds
    dynamic sampling. generation_chunks: each generation batch's prompts_per_step x group_size rows
    are sampled in this many calls of equal rows, one after the other, so the KV cache holds only
    one call's rows (1: all at once; with more, call j draws with the batch's keys folded with j).
    prompt_prefill: the sampler's prefill attends over the prompt's slots only and applies the LM
    head to its last position (`SamplerConfig.prompt_prefill`; needed at thousands of new tokens).
    reference_logprobs: score each step's rows under the initial policy too (one more forward pass
      per mini-batch): GRPO's KL term needs them, DAPO (no KL term) only logs `kl_ref_k3` from them.
      False: no such pass and no `kl_ref_k3`; the initial weights leave the devices once the
      state is built (the trainer keeps their shapes).
    trim_padding: the update (and the old and reference log-probs) runs on the columns the step's
      rows use, the prompt's left padding and the responses' right padding cut to power-of-two
      widths (`fp4rl.rl.column_trim`: the same values up to the order of f32 sums; one update
      program per width pair met); False: always prompt_len + max_new_tokens columns.
    overlap: keep the device busy while the host works (`fp4rl.rl.train_step`): generation batch b+1
      goes to the sampler before batch b is scored (discarded unread when the pools are full after
      b: a sampler call of device time spent for nothing), and the next step's weight sync and first
      sampler call before this step's records are built (the next step's synced weights are then
      held during this step's evaluation and checkpoint, and the sampler runs while the previous
      state, parameters and AdamW moments, is still alive: a higher peak). Changes when, not what,
      it computes. Off
      by default: its speed is not measured yet, and on `h200-chain` it may sample batches for nothing.
    prompt_len: max prompt tokens. temperature: the sampling temperature; the
    sampler's and the trainer's log-probs are both those of softmax(logits / temperature).
    eval_every: held-out evaluation every this many steps (and at the last step; 0: never) on
    `eval_prompts` problems of stream `eval_task_seed`: greedy accuracy (`eval/accuracy`, docs/rl.md's
    final accuracy) and sampled accuracy at `temperature` (`eval/sampled_accuracy`), the same
    sampling keys at every evaluation so that differences between steps are not sampling noise;
    the policy before any update is evaluated too (`eval/initial_*`, logged with step 0).
    eval_file: the held-out rows of a data_file run (same formats and columns as data_file; rows
      the verifier cannot judge are dropped as for training): its first `eval_prompts` usable rows
      replace the procedural stream, with the same metrics; "" with data_file: no evaluation.
    resume: "check" refuses to resume a checkpoint under settings other than its config.json's
    (see `fp4rl.rl.resume`, which lists the few that may differ); "force" resumes under the new
    settings and records the change in config_changes.jsonl.
    mesh: data x expert devices (`fp4rl.parallel`, docs/parallel.md); 1 x 1 is the one-device program.
    memory: how the update trades compute for activation memory (`policy.UpdateMemory`: per-layer
      rematerialisation, query-chunked attention, micro-batches of a mini-batch's rows, the LM head
      over chunks of positions).
    expert_gemm: the routed experts' grouped-GEMM backend (`fp4rl.grouped.GEMMS`) for this run's
      programs; "" keeps the warm-up's (`ModelConfig.expert_gemm`, resolved when the warm-up was
      trained); "auto" the fastest on this platform for the warm-up's model, resolved when the run
      starts (`resolve_settings`: config.json records the backend). Changes how, not what, it computes.
    """

    arm: str = "bf16"  # the recipe: a name of PrecisionRecipe.names(), or nvfp4@A / +dq@A for a dose A > 0
    seeds: int = 1
    seed_offset: int = 0
    steps: int = 10
    task: TaskConfig = TaskConfig(min_ops=2, max_ops=3)
    task_seed: int = 0
    prompt_len: int = 48
    group_size: int = 8
    prompts_per_step: int = 4
    max_gen_batches: int = 3
    generation_chunks: int = 1
    prompt_prefill: bool = False
    reference_logprobs: bool = True
    trim_padding: bool = False
    overlap: bool = False  # until the staged GPU A/B decides (benchmarks/README.md, "Host work beside the GPU")
    mini_batches: int = 2
    max_new_tokens: int = 48
    overlong_buffer: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    loss: policy.LossConfig = policy.LossConfig()
    optim: OptimConfig = OptimConfig()
    eval_every: int = 0
    eval_prompts: int = 32
    eval_task_seed: int = 1_000_003
    checkpoint_every: int = 1
    on_nonfinite: Literal["skip", "stop"] = "skip"
    impl: str = "auto"  # quantizer implementation: operands.IMPLS ("auto": Triton on GPU)
    expert_gemm: str = ""
    init: str = "runs/sft"
    model: ModelSource = ModelSource()
    data_file: str = ""
    eval_file: str = ""
    prompt_key: str = "prompt"
    answer_key: str = ""
    out: str = "runs/rl"
    resume: Literal["check", "force"] = "check"
    mesh: MeshConfig = MeshConfig()
    memory: policy.UpdateMemory = policy.UpdateMemory()

    def __post_init__(self):
        PrecisionRecipe.from_name(self.arm)  # names the valid arms on a typo
        if self.expert_gemm:
            check_gemm(self.expert_gemm, auto=True)  # names the valid backends on a typo
        if self.mini_batches < 1 or self.prompts_per_step % self.mini_batches:
            raise ValueError(f"prompts_per_step={self.prompts_per_step} must be a multiple of {self.mini_batches=} "
                             "(each mini-batch takes whole groups, balanced over the mini-batches)")
        if self.group_size < 2:
            raise ValueError(f"{self.group_size=} must be >= 2 (group-normalised advantages)")
        if self.seeds < 1 or self.steps < 1:
            raise ValueError(f"need {self.seeds=} >= 1 and {self.steps=} >= 1")
        operands.check_impl(self.impl)
        # The sampler and the trainer score softmax(logits / temperature): 0 would sample greedily
        # while the trainer scored the raw logits.
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature={self.temperature} must be a finite number > 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.on_nonfinite not in ("skip", "stop"):
            raise ValueError(f"on_nonfinite={self.on_nonfinite!r}; valid options: skip, stop")
        if self.resume not in resume.RESUME_OPTIONS:
            raise ValueError(f"resume={self.resume!r}; valid options: {', '.join(resume.RESUME_OPTIONS)}")
        # Every device takes an equal share of each mini-batch's (and each rollout's) rows, and of
        # each micro-batch's.
        rows = self.prompts_per_step * self.group_size // self.mini_batches
        self.mesh.check_rows(rows, "prompts_per_step * group_size / mini_batches")
        micro_batch.check_micro_batches(self.memory.micro_batches, rows, self.mesh.size)
        self._check_generation_chunks()
        if not self.reference_logprobs and self.loss.kind == "grpo" and self.loss.kl_coef:
            raise ValueError(f"loss.kl_coef={self.loss.kl_coef} needs the reference log-probs: set reference_logprobs "
                             "to true (or loss.kl_coef to 0)")
        if not 1 <= self.overlong_buffer <= self.max_new_tokens:
            raise ValueError(f"overlong_buffer={self.overlong_buffer} must be in [1, max_new_tokens={self.max_new_tokens}] "
                             "(DAPO's overlong shaping starts that many tokens before the limit)")
        self._check_evaluation()

    def _check_generation_chunks(self):
        rows = self.prompts_per_step * self.group_size
        valid = micro_batch.valid_micro_batches(rows, self.mesh.size)  # the same rule: equal chunks, even over devices
        if self.generation_chunks not in valid:
            raise ValueError(f"generation_chunks={self.generation_chunks} must split the {rows} rows of a generation batch "
                             f"(prompts_per_step * group_size) into equal calls whose rows split evenly over "
                             f"{self.mesh.size} device(s); valid options: {', '.join(map(str, valid))}")

    def _check_evaluation(self):
        """A data_file run evaluates on held-out rows of eval_file; every other run on the procedural
        task's held-out stream, which a data_file run does not train on."""
        if self.eval_file and not self.data_file:
            raise ValueError(f"eval_file={self.eval_file!r} holds held-out rows for a data_file run; without data_file the "
                             "evaluation is the procedural task's held-out stream (eval_task_seed): drop eval_file")
        if self.eval_file and not self.eval_every:
            raise ValueError(f"eval_file={self.eval_file!r} is read by the held-out evaluation only: set eval_every > 0 "
                             "(steps between evaluations), or drop eval_file")
        if self.data_file and self.eval_every and not self.eval_file:
            raise ValueError(f"eval_every={self.eval_every} with data_file={self.data_file!r} needs eval_file=FILE, held-out "
                             "rows in data_file's format (the procedural task's stream is not this run's task); or set "
                             "eval_every=0")
        if self.eval_every and self.eval_prompts < 1:
            raise ValueError(f"eval_prompts={self.eval_prompts} must be >= 1 when eval_every={self.eval_every}")


def arm_dir(config: RLConfig) -> Path:
    return Path(config.out) / config.arm


def is_finished(config: RLConfig) -> bool:
    """The arm ran all of `config.steps` (a run extended by a larger --steps is not finished)."""
    done = arm_dir(config) / resume.DONE_FILE
    return done.exists() and read_json(done)["steps"] == config.steps


def has_checkpoint(config: RLConfig) -> bool:
    """The arm's run directory holds a saved step (orbax names step directories by their number)."""
    directory = arm_dir(config) / "checkpoint"
    return directory.is_dir() and any(p.is_dir() and p.name.isdigit() for p in directory.iterdir())


def settings(config: RLConfig) -> dict:
    """The config as config.json records it."""
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def warmup_model_config(init: str | Path) -> ModelConfig:
    """The model config of the warm-up in `init` (its sft_meta.json), naming its backend."""
    return ModelConfig.from_dict(read_json(Path(init) / sft.META_FILE)["model_config"]).resolved()


def resolve_settings(config: RLConfig, model_config: ModelConfig | None = None) -> RLConfig:
    """`config` with expert_gemm "auto" resolved for the warm-up's model on this platform
    (`model_config`, else read from config.init): the settings a run trains under and config.json
    records. Any other value is kept ("": the warm-up's backend)."""
    if config.expert_gemm != AUTO:
        return config
    mc = warmup_model_config(config.init) if model_config is None else model_config
    return dataclasses.replace(config, expert_gemm=dataclasses.replace(mc, expert_gemm=AUTO).resolved().expert_gemm)


def check_settings(config: RLConfig, model_config: ModelConfig | None = None) -> dict:
    """The setting changes of `config` ("auto" resolved: `resolve_settings`) against its run
    directory's config.json (`resume.check`: raises unless they may differ or config.resume is
    "force"). A run asking for "auto" where it resolves to another backend than the run ran on
    raises, naming both, whatever config.resume says: it continues on its backend when named."""
    resolved = resolve_settings(config, model_config)
    path = arm_dir(config) / resume.CONFIG_FILE
    if config.expert_gemm == AUTO and path.is_file():
        record = read_json(path)
        recorded = expert_gemm_of(record) if isinstance(record, dict) and isinstance(record.get("rl_config"), dict) else None
        if recorded is not None and recorded != resolved.expert_gemm:
            raise ValueError(f"{path}: the run ran its expert GEMMs on expert_gemm={recorded!r}, but expert_gemm='auto' "
                             f"resolves to {resolved.expert_gemm!r} here; resume with --expert_gemm={recorded} "
                             "(--rl.expert_gemm in experiments.ablation) to keep its backend, or start a new --out")
    return resume.check(arm_dir(config), settings(resolved), config.resume, defaults=settings(RLConfig()))


def check_source(config: RLConfig) -> None:
    """Exactly one initial policy: a warm-up (`init`) or a Hugging Face checkpoint (`model.hf`)."""
    if bool(config.init) == bool(config.model.hf):
        given = f"init={config.init!r} and model.hf={config.model.hf!r}"
        raise ValueError(f"set exactly one initial policy, a warm-up run directory (--init=DIR) or a Hugging Face "
                         f"checkpoint (--model.hf=DIR, with --init=''; the hf preset does this); got {given}")

