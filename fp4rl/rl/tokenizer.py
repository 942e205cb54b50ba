"""Character-level tokenizer with a fixed vocabulary (docs/rl.md: "the model sees digits").

One token per character, so every digit of every number is its own token: the arithmetic
task is then about arithmetic, not about a BPE merge table. The vocabulary is fixed (not
learned from data) so that checkpoints, the sampler and the verifier agree forever:

    0 PAD, 1 BOS, 2 EOS, 3 "\\n", 4..98 printable ASCII (" " .. "~")

Printable ASCII (rather than only the generator's characters) covers the question
templates and LaTeX in real DAPO-Math-17k prompts (`\\frac`, `$`, `^`, uppercase). Any other
character (tab, non-ASCII) raises a ValueError naming it: silently mapping it to an UNK
token would let a prompt change meaning without anyone noticing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PAD = 0
BOS = 1
EOS = 2
_NUM_SPECIAL = 3
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
_CHAR_TO_ID = {ch: i + _NUM_SPECIAL for i, ch in enumerate(CHARS)}
vocab_size = _NUM_SPECIAL + len(CHARS)  # 99


def encode(text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
    """Token ids of `text`, optionally framed by BOS/EOS. Unknown characters raise."""
    ids = [BOS] if bos else []
    for pos, ch in enumerate(text):
        tok = _CHAR_TO_ID.get(ch)
        if tok is None:
            raise ValueError(
                f"character {ch!r} (U+{ord(ch):04X}) at position {pos} is not in the vocabulary"
            )
        ids.append(tok)
    if eos:
        ids.append(EOS)
    return ids


def is_encodable(text: str) -> bool:
    return all(ch in _CHAR_TO_ID for ch in text)


def decode(ids: Sequence[int] | np.ndarray) -> str:
    """Text of `ids`: stops at the first EOS, skips PAD and BOS; an id >= vocab_size raises."""
    out = []
    for tok in np.asarray(ids).reshape(-1).tolist():
        if tok == EOS:
            break
        if tok in (PAD, BOS):
            continue
        if not _NUM_SPECIAL <= tok < vocab_size:
            raise ValueError(f"token id {tok} is outside the vocabulary [0, {vocab_size})")
        out.append(CHARS[tok - _NUM_SPECIAL])
    return "".join(out)


def pad_batch(
    seqs: Sequence[Sequence[int]], length: int, *, side: str, pad_id: int = PAD
) -> tuple[np.ndarray, np.ndarray]:
    """Stack `seqs` into `(ids_BxT int32, mask_BxT bool)` with T = `length`.

    side="left" for prompts (every prompt ends at the same position, so generation starts
    in one column for the whole batch); side="right" for training sequences. A sequence
    longer than `length` raises: truncating a prompt would silently change the problem.
    """
    if side not in ("left", "right"):
        raise ValueError(f"{side=} must be 'left' or 'right'")
    ids_BxT = np.full((len(seqs), length), pad_id, dtype=np.int32)
    mask_BxT = np.zeros((len(seqs), length), dtype=bool)
    for b, seq in enumerate(seqs):
        n = len(seq)
        if n > length:
            raise ValueError(f"sequence {b} has {n} tokens > {length=}")
        sl = slice(length - n, length) if side == "left" else slice(0, n)
        ids_BxT[b, sl] = seq
        mask_BxT[b, sl] = True
    return ids_BxT, mask_BxT


def decode_batch(ids_BxT: np.ndarray) -> list[str]:
    return [decode(row) for row in np.asarray(ids_BxT)]
