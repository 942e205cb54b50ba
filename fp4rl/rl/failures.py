"""Why a response to a procedural problem is wrong: the chain's arithmetic, or the copy into the box.

A worked solution (`fp4rl.rl.task`) is scratchpad lines `x=...=N`, then `Answer: \\boxed{N}`. The
noisy teacher of the warm-ups (`task.noisy_solution`) corrupts only the boxed copy, so a warm-up
fit to it gets a response wrong in two separable ways, and the held-out evaluations count both
(`eval/*_miscopied`, `eval/*_wrong_chain`), so that a run's report can say which one RL changes:

- "right": the verifier's reward (the last box holds the answer);
- "miscopied": the scratchpad's last line computed the answer and the box holds something else or
  is missing (the deficit the noisy teacher planted);
- "wrong_chain": everything else: the scratchpad's last value is wrong, missing, or unparsable.
"""

from __future__ import annotations

import re

from fp4rl.rl import verifier

KINDS = ("right", "miscopied", "wrong_chain")
# A scratchpad line's value: its text after the last '=' (an optional sign, then digits).
_LINE_VALUE = re.compile(r"=\s*([+-]?\d+)\s*$")


def chain_value(text: str) -> int | None:
    """The value the scratchpad's last line computed (the line before the one that holds the last
    box), or None if there is no such line."""
    head = text[: text.rfind(verifier.BOX)] if verifier.BOX in text else text
    lines = [line for line in head.split("\n") if line.strip()]
    for line in reversed(lines):
        match = _LINE_VALUE.search(line)
        if match:
            return int(match.group(1))
    return None


def classify(text: str, answer: int) -> str:
    """One of KINDS for a response to a problem whose answer is `answer`."""
    if verifier.reward(text, answer) > 0:
        return "right"
    return "miscopied" if chain_value(text) == answer else "wrong_chain"


def fractions(texts, answers) -> dict[str, float]:
    """{kind: fraction of the responses} over KINDS (each response to its answer)."""
    kinds = [classify(t, a) for t, a in zip(texts, answers, strict=True)]
    return {k: kinds.count(k) / max(len(kinds), 1) for k in KINDS}
