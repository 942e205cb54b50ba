"""A step's training arrays cut to the columns its rows use (`RLConfig.trim_padding`).

The rollout lays every row out as prompt_len left-padded prompt columns then max_new_tokens
response columns. At the paper's lengths (1k + 7k) the update, the old and the reference
log-probs then run over 8k columns per row whatever the step sampled, although no real token
attends to a padding column or is scored there: a step whose longest prompt and longest response
are a few hundred tokens spends nearly all of its update on padding. Cutting the padding columns
on the left of the prompts and on the right of the responses leaves every real token's value the
same up to the order of f32 sums (attention's masked keys, which carry exact zeros; per-token
activation scales; a load-balancing loss and a token-mean loss over valid tokens only). The
widths are rounded up to powers of two, so a run compiles one update program per width pair it
meets (a handful), not one per step.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

SMALLEST = 64  # narrower windows are rounded up to this: a few programs, little padding


class Window(NamedTuple):
    """Columns kept: the last `prompt` of the prompt's, the first `response` of the response's."""

    prompt: int
    response: int


def bucket(n: int, limit: int, smallest: int = SMALLEST) -> int:
    """The power of two >= max(n, smallest), capped at `limit`."""
    if n > limit:
        raise ValueError(f"{n} columns do not fit the layout's {limit}")
    return min(limit, 1 << (max(n, smallest, 1) - 1).bit_length())


def used_window(arrays: list[dict], prompt_len: int, max_new_tokens: int) -> Window:
    """The window holding every real token of every seed's rows (`rollout.training_arrays`
    output, one dict per seed), its widths bucketed."""
    prompt = max(int(a["valid"][:, :prompt_len].sum(1).max()) for a in arrays)
    response = max(int(a["valid"][:, prompt_len:].sum(1).max()) for a in arrays)
    return Window(bucket(prompt, prompt_len, SMALLEST), bucket(response, max_new_tokens, SMALLEST))


def trim(arrays: dict, prompt_len: int, window: Window) -> dict:
    """One seed's arrays cut to `window`: prompts are left-padded and responses start at column
    prompt_len, so the kept columns are [prompt_len - window.prompt, prompt_len + window.response)."""
    out = dict(arrays)
    columns = slice(prompt_len - window.prompt, prompt_len + window.response)
    for name in ("tokens", "valid"):
        out[name] = arrays[name][:, columns]
    for name in ("response_mask", "logp_sampler"):
        out[name] = arrays[name][:, : window.response]
    out["router_topk"] = arrays["router_topk"][:, :, : window.response]
    dropped = np.concatenate([arrays["valid"][:, : columns.start], arrays["valid"][:, columns.stop :]], axis=1)
    if dropped.any():  # the window must hold every real token: a bug, never silently lost tokens
        raise AssertionError(f"window {window} drops real tokens")
    return out
