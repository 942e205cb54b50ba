"""Text <-> token ids for the RL path: the character tokenizer of the arithmetic task, or a Hugging
Face checkpoint's own tokenizer and chat template (`fp4rl.rl.hf_tokenizer`).

Everything between the data and the sampler goes through a `TextCodec`: the prompt layout the
sampler is given (`encode_prompt`), the ids that stop a row (`stop_ids`; the first is the one the
sampler calls EOS) and fill it after the stop (`pad_id`), and the text the verifier reads
(`decode`: the response up to its first stop id). The trainer never looks at a vocabulary.

    codec = CHAR                                   # BOS prompt "\\n"  ...  EOS
    codec = hf_tokenizer.HFCodec.from_dir(dir)     # the chat template's user turn + generation prompt
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from fp4rl.rl import tokenizer

PROMPT_SEPARATOR = "\n"  # the character layout: BOS prompt "\n" solution EOS


class TextCodec(Protocol):
    name: str  # what config.json records: "char", or "hf:<directory>"
    pad_id: int
    stop_ids: tuple[int, ...]  # non-empty; stop_ids[0] is the sampler's eos_id
    vocab_size: int

    def encode_prompt(self, prompt: str) -> list[int]: ...

    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...

    def is_encodable(self, text: str) -> bool: ...


class CharCodec:
    """The character tokenizer's layout (`fp4rl.rl.tokenizer`): `BOS prompt "\\n"`, stop at EOS."""

    name = "char"
    pad_id = tokenizer.PAD
    stop_ids = (tokenizer.EOS,)
    vocab_size = tokenizer.vocab_size

    def encode_prompt(self, prompt: str) -> list[int]:
        return tokenizer.encode(prompt + PROMPT_SEPARATOR, bos=True)

    def decode(self, ids) -> str:
        return tokenizer.decode(ids)

    def is_encodable(self, text: str) -> bool:
        return tokenizer.is_encodable(text)


CHAR = CharCodec()


def decode_batch(codec: TextCodec, ids_BxT) -> list[str]:
    return [codec.decode(row) for row in np.asarray(ids_BxT)]


def until_stop(ids, stop_ids: Sequence[int]) -> list[int]:
    """`ids` up to (without) the first stop id."""
    out = []
    for tok in np.asarray(ids).reshape(-1).tolist():
        if tok in stop_ids:
            break
        out.append(tok)
    return out
