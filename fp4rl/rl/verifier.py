"""Reward of a response: the last `\\boxed{...}` must hold the right integer (docs/rl.md).

Rules, decided here once and pinned by tests/rl/test_verifier.py:

* The answer is the content of the LAST top-level `\\boxed{...}` (braces matched, so
  `\\boxed{\\frac{1}{2}}` has content `\\frac{1}{2}`). If the last `\\boxed{` is never closed
  (a truncated response) the answer is missing, even when an earlier box was complete:
  the model's final word is what counts.
* The content must be an integer literal after stripping surrounding whitespace:
  `[+-]?[0-9]+`. So `\\boxed{ 42 }`, `\\boxed{-7}`, `\\boxed{+5}` and `\\boxed{007}` are
  integers (Python `int()` agrees on all of them, and `+5` is unambiguous); `4.0`, `4/1`,
  `1,000`, `1 000`, `- 5`, `2^3`, `$4$` and an empty box are not (-1), even where they are
  numerically equal to the answer. This mirrors DAPO-Math-17k, whose ground truths are
  integers, and keeps the check exact and cheap. ASCII digits only (`\\d` would accept
  other scripts' digits).
* Correct: +1. Wrong, missing or malformed: -1 (DAPO's binary reward).

Overlong shaping (DAPO, Yu et al. 2025, "Soft Overlong Punishment") is
`overlong_penalty`; `shaped_reward` adds the two.
"""

from __future__ import annotations

import re

import numpy as np

BOX = "\\boxed{"
_INT = re.compile(r"[+-]?[0-9]+")


def extract_boxed(text: str) -> str | None:
    """Content of the last top-level `\\boxed{...}`, or None if absent or unclosed."""
    content = None
    i = text.find(BOX)
    while i != -1:
        start = i + len(BOX)
        depth, j = 1, start
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth:  # the last box is unclosed: the final answer is malformed
            return None
        content = text[start : j - 1]
        i = text.find(BOX, j)
    return content


def parse_integer(s: str | int) -> int | None:
    """The integer of an integer literal (see the module rules), else None.

    Also used for data-set ground truths, which may arrive as JSON ints (bool is not int
    here: `True` is not a ground truth).
    """
    if isinstance(s, bool):
        return None
    if isinstance(s, (int, np.integer)):
        return int(s)
    if not isinstance(s, str):
        return None
    s = s.strip()
    return int(s) if _INT.fullmatch(s) else None


def reward(text: str, answer: int) -> float:
    """+1.0 if the last box of `text` holds exactly the integer `answer`, else -1.0."""
    boxed = extract_boxed(text)
    value = None if boxed is None else parse_integer(boxed)
    return 1.0 if value is not None and value == answer else -1.0


def overlong_penalty(length, max_len: int, buffer: int):
    """DAPO overlong shaping for a response of `length` tokens; L = max_len, C = buffer.

        0                       if length <= L - C
        ((L - C) - length) / C  if L - C < length <= L   (so exactly -1.0 at length == L)
        -1                      if length > L

    The penalty is continuous and reaches -1 at length == L, so a response cut off at the
    generation limit (length == L, no EOS) gets the full -1. Implemented as
    clip(((L-C) - length)/C, -1, 0), which is the three cases above. Accepts a Python int
    (returns float) or an array (numpy or jax, returns a jnp array; jit-safe).
    """
    if not 1 <= buffer <= max_len:
        raise ValueError(f"need 1 <= {buffer=} <= {max_len=}")
    if isinstance(length, (int, np.integer)):
        return float(min(0.0, max(-1.0, ((max_len - buffer) - int(length)) / buffer)))
    import jax.numpy as jnp  # here: the parsing above stays importable without jax (the analysis notebooks)

    length = jnp.asarray(length, jnp.float32)
    return jnp.clip(((max_len - buffer) - length) / buffer, -1.0, 0.0)


def shaped_reward(text: str, answer: int, length: int, max_len: int, buffer: int) -> float:
    """Correctness reward plus overlong shaping: the per-response reward DAPO trains on."""
    return reward(text, answer) + overlong_penalty(length, max_len, buffer)
