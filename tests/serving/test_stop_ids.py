"""A Hugging Face chat checkpoint ends a turn (`<|im_end|>`) and a text (`<|endoftext|>`) on different
tokens: the server reads every stop id the folder names, as the RL codec does, and a row stops on
any of them (finish_reason "stop", the stop token not in the completion)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from fp4rl.model import hf
from fp4rl.rl.hf_tokenizer import HFCodec
from fp4rl.serving import checkpoints, deployment
from fp4rl.serving.engine import Engine, EngineConfig, RowRequest, RowResult
from fp4rl.model.hf_local import ANSWER_TOKENS, write_checkpoint

TURN_END, TEXT_END = "<|im_end|>", "<|endoftext|>"  # generation_config.json's eos ids, in that order


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    """fp4rl/model/hf_local.py's Qwen3-MoE folder, its head rewired so that greedy decoding emits
    `<|im_end|>` after a prompt ending in `\\boxed{4}` and `<|endoftext|>` after one ending in
    `\\boxed{5}`."""
    directory = write_checkpoint(tmp_path_factory.mktemp("chat") / "qwen3")
    vocab = Tokenizer.from_file(str(directory / "tokenizer.json"))
    turn_end, text_end = vocab.token_to_id(TURN_END), vocab.token_to_id(TEXT_END)
    four, five = (vocab.token_to_id(t) for t in ANSWER_TOKENS)
    tensors = load_file(str(directory / "model.safetensors"))
    embed, head = tensors["model.embed_tokens.weight"], tensors["lm_head.weight"]
    # Component 0 is the fixture's constant one: weighted above the answers' 4.0, both stops lead.
    # Component 1 of the last prompt token reaches the final position through the residual stream,
    # so its sign picks which of the two stops wins.
    embed[four, 1], embed[five, 1] = 8.0, -8.0
    head[[turn_end, text_end]] = 0.0
    head[[turn_end, text_end], 0] = 4.5
    head[turn_end, 1], head[text_end, 1] = 4.0, -4.0
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def _ids(directory, *tokens):
    vocab = Tokenizer.from_file(str(directory / "tokenizer.json"))
    return tuple(vocab.token_to_id(t) for t in tokens)


def test_stop_ids_are_every_eos_id_the_folder_names(chat_dir, tmp_path):
    stops = _ids(chat_dir, TURN_END, TEXT_END)
    served = checkpoints.load(chat_dir)
    assert served.text and served.stop_ids == HFCodec.from_dir(chat_dir).stop_ids == stops
    # Without tokenizer.json (served on token ids): the same ids, from generation_config.json.
    ids_only = tmp_path / "ids_only"
    ids_only.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(chat_dir / name, ids_only / name)
    served = checkpoints.load(ids_only)
    assert not served.text and served.stop_ids == stops
    # Without generation_config.json: config.json's eos_token_id.
    (ids_only / "generation_config.json").unlink()
    config = json.loads((ids_only / "config.json").read_text())
    (ids_only / "config.json").write_text(json.dumps({**config, "eos_token_id": stops[1]}))
    assert checkpoints.load(ids_only).stop_ids == (stops[1],)


def test_a_row_stops_on_either_stop_id(chat_dir):
    turn_end, text_end, four, five = _ids(chat_dir, TURN_END, TEXT_END, *ANSWER_TOKENS)
    served = checkpoints.load(chat_dir)
    prompt = tuple(served.encode("What is 2 + 2?"))
    ends_turn, ends_text = prompt + (four,), prompt + (five,)
    # The greedy first tokens, from the model's plain forward: one row emits each stop id.
    logits = np.asarray(hf.from_pretrained(str(chat_dir))(np.asarray([ends_turn, ends_text])))
    assert tuple(np.argmax(logits[:, -1], axis=-1)) == (turn_end, text_end)
    engine = Engine(deployment.quantize(served, "bf16", impl="reference"),
                    EngineConfig(max_batch=2, prompt_buckets=(8,), max_new_tokens=3))
    engine.compile()
    results = engine.run_batch([RowRequest(ends_turn, max_tokens=3), RowRequest(ends_text, max_tokens=3)])
    assert results == [RowResult((), (), 1, "stop")] * 2
