"""What an RL run reads before anything compiles: the initial policy (a warm-up run, or a Hugging
Face Qwen-MoE checkpoint), the text codec (the character tokenizer, or the checkpoint's own
tokenizer and chat template) and the prompt records (the procedural task, or a DAPO-Math-17k-style
file through grain). Read once, up front, so that a bad input stops the run with one line naming
it (`InputError`) before minutes of compilation.

    inputs = load(config)            # config: fp4rl.rl.rl_config.RLConfig
    Trainer(config, inputs=inputs)
"""

from __future__ import annotations

import dataclasses

import grain

from fp4rl.model import hf
from fp4rl.model.config import ModelConfig
from fp4rl.rl import data, sft
from fp4rl.rl.codec import CHAR, TextCodec
from fp4rl.rl.hf_tokenizer import HFCodec
from fp4rl.rl.math_file import MathRows, load_math_rows
from fp4rl.rl.rl_config import RLConfig, check_source


class InputError(ValueError):
    """A run input (checkpoint, tokenizer files, data file) that cannot be used; one line."""


@dataclasses.dataclass(frozen=True)
class RunInputs:
    """graphdef / params: the initial policy (also the KL reference). meta: the warm-up's
    sft_meta.json, or for a checkpoint {"model_config", "hf"}; `meta["model_config"]` is the model's
    config as a dict either way. rows: the data file's rows (None: the procedural task). eval_rows: the
    eval file's usable rows, all of them (None: no eval_file; the trainer evaluates the first
    `eval_prompts`)."""

    graphdef: object
    params: object
    meta: dict
    codec: TextCodec
    records: grain.MapDataset
    rows: MathRows | None
    eval_rows: MathRows | None = None

    @property
    def model_config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.meta["model_config"]).resolved()


def _hf_policy(config: RLConfig):
    directory = config.model.hf
    try:
        model = hf.from_pretrained(directory, dtype=config.model.dtype)
        codec = HFCodec.from_dir(directory)
    except (ValueError, FileNotFoundError) as err:
        raise InputError(str(err)) from None
    if codec.vocab_size > model.config.vocab_size:
        raise InputError(f"{directory}: the tokenizer has {codec.vocab_size} tokens but the model's embedding only "
                         f"{model.config.vocab_size} (vocab_size in config.json)")
    length = config.prompt_len + config.max_new_tokens
    if length > model.config.max_seq_len:
        # RoPE positions past the checkpoint's context were never trained.
        raise InputError(f"prompt_len + max_new_tokens = {config.prompt_len} + {config.max_new_tokens} = {length} "
                         f"exceeds the checkpoint's context, max_position_embeddings={model.config.max_seq_len} "
                         f"({directory}/config.json)")
    meta = {"model_config": dataclasses.asdict(model.config), "hf": directory}
    return model.graphdef, model.params, meta, codec


def dropped_summary(rows: MathRows) -> str:
    """"not_integer 1, too_long 2" (or "none"): why rows of a file were not used."""
    return ", ".join(f"{k} {v}" for k, v in rows.dropped.items() if v) or "none"


def _math_rows(config: RLConfig, path: str, codec: TextCodec) -> MathRows:
    """A data or eval file's usable rows (prompts that fit prompt_len, integer ground truths)."""
    try:
        return load_math_rows(path, prompt_key=config.prompt_key, answer_key=config.answer_key or None,
                              codec=codec, max_prompt_tokens=config.prompt_len)
    except KeyError as err:  # a row without the columns: its message names the file and the row
        raise InputError(err.args[0]) from None
    except OSError as err:  # a missing or unreadable file: strerror and the path, one line
        raise InputError(f"{path}: cannot read the file ({err.strerror or err})") from None
    except (ValueError, ImportError) as err:
        raise InputError(str(err)) from None


def _records(config: RLConfig, codec: TextCodec) -> tuple[grain.MapDataset, MathRows | None]:
    if not config.data_file:
        return data.problem_records(config.task, config.task_seed, data.DataConfig().num_problems), None
    rows = _math_rows(config, config.data_file, codec)
    if len(rows.prompts) < config.prompts_per_step:
        raise InputError(f"{config.data_file}: {len(rows.prompts)} usable rows of {rows.num_read} "
                         f"(dropped: {dropped_summary(rows)}), fewer than prompts_per_step={config.prompts_per_step}")
    return data.file_records(rows), rows


def _eval_rows(config: RLConfig, codec: TextCodec) -> MathRows | None:
    if not config.eval_file:
        return None
    rows = _math_rows(config, config.eval_file, codec)
    if not rows.prompts:
        raise InputError(f"eval_file {config.eval_file}: no usable row of {rows.num_read} (dropped: "
                         f"{dropped_summary(rows)}); the held-out evaluation needs rows with integer ground truths "
                         f"whose prompts fit prompt_len={config.prompt_len} tokens")
    return rows


def load(config: RLConfig, warmup=None) -> RunInputs:
    """The run's inputs. warmup: the `sft.load(config.init)` triple when the caller holds it already."""
    try:
        check_source(config)
    except ValueError as err:
        raise InputError(str(err)) from None
    if config.model.hf:
        graphdef, params, meta, codec = _hf_policy(config)
    else:
        graphdef, params, meta = sft.load(config.init) if warmup is None else warmup
        codec = CHAR
    records, rows = _records(config, codec)
    return RunInputs(graphdef, params, meta, codec, records, rows, _eval_rows(config, codec))
