"""Load a BF16 (unquantized) checkpoint for serving: this project's warm-up and RL runs, or a local
Hugging Face Qwen-MoE directory.

Three layouts, recognised by their files:
- a warm-up run directory (`sft_meta.json` + `checkpoint/`, `fp4rl.rl.sft.load`);
- an RL arm directory (`<out>/<arm>/config.json` + `checkpoint/`, written by `fp4rl.rl.trainer`):
  its state holds every seed's master weights stacked on a leading axis plus the optimizer state;
  `seed_index` picks one seed's weights (the latest step);
- a Hugging Face directory (`config.json` with a `model_type`, `*.safetensors`, `fp4rl.model.hf`).

Project checkpoints use the character tokenizer (`fp4rl.rl.tokenizer`), so the server accepts
text prompts. A Hugging Face checkpoint with a tokenizer.json is served on text too, through that
tokenizer (`tokenizers`; a completion prompt is encoded as is, without the chat template and
without added special tokens); without one it is served on token ids only (prompts as lists of
ids, completions as `token_ids`). Its stop tokens are every end-of-sequence id the folder names,
read as the RL path reads them (`fp4rl.rl.hf_tokenizer.stop_ids`: generation_config.json's, then
tokenizer_config.json's `eos_token`, then config.json's), so a chat model stops at the end of its
turn and at the end of text alike; a folder naming none is served without a stop token (rows run
to their token budget). The chat route (`fp4rl.serving.chat`) renders conversations with the folder's
chat template (`fp4rl.rl.hf_tokenizer.HFCodec`, as the RL prompts are rendered); a folder without
one, and the character tokenizer's checkpoints, have no chat.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import tokenizers

from fp4rl import grouped
from fp4rl.model import hf, transformer
from fp4rl.model.config import ModelConfig
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import policy, sft, tokenizer
from fp4rl.rl.checkpoint import Checkpointer
from fp4rl.rl.hf_tokenizer import HFCodec
from fp4rl.rl.hf_tokenizer import stop_ids as hf_stop_ids


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """What a checkpoint gives the server.

    kind: "sft" | "rl" | "hf". trained_recipe: the recipe the weights were trained under ("bf16"
    for a warm-up or an imported model). text: whether text prompts are accepted (the character
    tokenizer, or `hf_tokenizer`); otherwise prompts are token ids. stop_ids: the ids that end a
    row, any of them (empty: rows run to their token budget). pad_id: the padding id.
    hf_tokenizer: a Hugging Face checkpoint's tokenizer.json, when it has one.
    chat: the folder's tokenizer and chat template, when it has both; otherwise None and
    `no_chat` says why (the chat route's error).
    """

    path: str
    kind: str
    graphdef: object
    params: object
    config: ModelConfig
    trained_recipe: str
    text: bool
    stop_ids: tuple[int, ...]
    pad_id: int
    bos_id: int | None
    hf_tokenizer: tokenizers.Tokenizer | None = None
    chat: HFCodec | None = None
    no_chat: str = "the character tokenizer's checkpoints have no chat template (their prompts are task text)"

    def encode(self, prompt: str) -> list[int]:
        """Token ids of a text prompt: with the character tokenizer BOS, then one token per
        character (ValueError naming an unknown character); with a Hugging Face tokenizer its
        encoding of the text. Only for checkpoints with `text`."""
        if not self.text:
            raise ValueError(f"{self.path} has no text tokenizer: send the prompt as a list of token ids")
        if self.hf_tokenizer is not None:
            return self.hf_tokenizer.encode(prompt, add_special_tokens=False).ids
        return tokenizer.encode(prompt, bos=True)

    def decode(self, ids) -> str:
        if not self.text:
            return ""
        if self.hf_tokenizer is not None:
            return self.hf_tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)
        return tokenizer.decode(ids)


def _recipe_name(recipe_json: str) -> str:
    return PrecisionRecipe.from_json(recipe_json).name


def _load_sft(path: Path) -> ServedModel:
    graphdef, params, meta = sft.load(path)
    return ServedModel(str(path), "sft", graphdef, params, ModelConfig.from_dict(meta["model_config"]),
                       _recipe_name(meta["recipe"]), True, (tokenizer.EOS,), tokenizer.PAD, tokenizer.BOS)


def _load_rl(path: Path, seed_index: int) -> ServedModel:
    run = json.loads((path / "config.json").read_text())
    config = ModelConfig.from_dict(run["model_config"])
    seeds = run["rl_config"]["seeds"]
    if not 0 <= seed_index < seeds:
        raise ValueError(f"seed_index={seed_index} out of range: {path} holds {seeds} seed(s)")
    graphdef, params = transformer.init(config, 0)
    # The trainer's state: {"params", "opt_state"} stacked over seeds; only shapes are needed to restore.
    stacked = jax.eval_shape(lambda p: jax.tree.map(lambda x: jax.numpy.stack([x] * seeds), p), params)
    optimizer = policy.make_optimizer(**run["rl_config"]["optim"])
    like = {"params": stacked, "opt_state": jax.eval_shape(jax.vmap(optimizer.init), stacked)}
    ckpt = Checkpointer(path / "checkpoint")
    step = ckpt.latest_step()
    if step is None:
        ckpt.close()
        raise FileNotFoundError(f"{path / 'checkpoint'} holds no saved step")
    state, meta = ckpt.restore(step, like)
    ckpt.close()
    params = jax.tree.map(lambda x: x[seed_index], state["params"])
    return ServedModel(f"{path}@step{step}/seed{seed_index}", "rl", graphdef, params, config,
                       _recipe_name(meta["recipe"]), True, (tokenizer.EOS,), tokenizer.PAD, tokenizer.BOS)


def _load_hf(path: Path) -> ServedModel:
    model = hf.from_pretrained(str(path))
    hf_config = json.loads((path / "config.json").read_text())
    pad = hf_config.get("pad_token_id")
    bos = hf_config.get("bos_token_id")
    text_tokenizer = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json")) if (path / "tokenizer.json").is_file() else None
    chat, no_chat = _chat_codec(path)
    return ServedModel(str(path), "hf", model.graphdef, model.params, model.config, "bf16", text_tokenizer is not None,
                       hf_stop_ids(path, text_tokenizer), 0 if pad is None else int(pad),
                       None if bos is None else int(bos), text_tokenizer, chat, no_chat)


def _chat_codec(path: Path) -> tuple[HFCodec | None, str]:
    """The folder's chat codec, or None and why not (it serves completions all the same)."""
    try:
        return HFCodec.from_dir(path), ""
    except ValueError as err:
        return None, str(err)


def load(path: str | Path, seed_index: int = 0, expert_gemm: str = "") -> ServedModel:
    """The checkpoint at `path` (see the module docstring for the layouts); `expert_gemm` (a
    `fp4rl.grouped` backend or "auto"; "" keeps the checkpoint's) computes its routed experts on
    another grouped-GEMM backend: `with_expert_gemm`."""
    return with_expert_gemm(_load(Path(path), seed_index), expert_gemm)


def with_expert_gemm(model: ServedModel, expert_gemm: str) -> ServedModel:
    """`model` with its routed experts on the grouped-GEMM backend `expert_gemm` (resolved where
    "auto"; "" keeps the checkpoint's): the same parameters under another graphdef. The backends
    differ only in the f32 accumulation order (docs/design.md, "Grouped-GEMM backends")."""
    if not expert_gemm:
        return model
    grouped.check_gemm(expert_gemm, auto=True)
    config = dataclasses.replace(model.config, expert_gemm=expert_gemm).resolved()
    return dataclasses.replace(model, graphdef=transformer.graphdef_of(config), config=config)


def _load(path: Path, seed_index: int) -> ServedModel:
    if (path / "sft_meta.json").exists():
        return _load_sft(path)
    if (path / "config.json").exists():
        run = json.loads((path / "config.json").read_text())
        if "rl_config" in run:
            return _load_rl(path, seed_index)
        if "model_type" in run:
            return _load_hf(path)
        raise ValueError(f"{path / 'config.json'} is neither an RL run's config nor a Hugging Face config")
    raise FileNotFoundError(f"no checkpoint at {path}: expected a warm-up run (sft_meta.json), an RL arm "
                            "directory (config.json + checkpoint/) or a Hugging Face directory (config.json + "
                            "*.safetensors); train a warm-up with `python -m experiments.sft --preset cpu`")
