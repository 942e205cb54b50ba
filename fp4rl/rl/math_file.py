"""Load a local DAPO-Math-17k-style file: prompts with integer ground truths (docs/rl.md).

So the pipeline can run on the real data set where a user has it. Two schemas:

* DAPO-Math-17k (verl format): `prompt` is a chat list `[{"role": "user", "content": ...}]`
  and the ground truth is `reward_model.ground_truth`, a string such as "34";
* flat: `prompt` is a string and the ground truth is a `solution` or `answer` column.

Column names are configurable (`prompt_key`, `answer_key`, dotted paths reach into nested
dicts). Ground truths go through `verifier.parse_integer`, the same rule the reward uses,
so a row whose ground truth is not an integer literal ("1/2", "7.5", "\\frac{1}{2}") is
dropped and counted: the reward could never be +1 on it. This module needs no grain;
`data.file_records` wraps the rows.

Policy: a malformed row fails the load with an error naming the file and the line (the row,
for parquet): a line that is not JSON, a row that is not a JSON object, a row without the
prompt or an answer column. Skipping it would train on a silently smaller data set. Rows that
are well formed but unusable (the reasons of `load_math_rows`) are dropped and counted.
"""

from __future__ import annotations

import dataclasses
import json
import os

from fp4rl.rl.codec import CHAR, TextCodec
from fp4rl.rl.verifier import parse_integer

# Tried in order when `answer_key` is None; the first one present in a row is used.
DEFAULT_ANSWER_KEYS = ("reward_model.ground_truth", "solution", "answer")
_INT64_MAX = 2**63 - 1  # answers travel in int64 arrays


@dataclasses.dataclass(frozen=True)
class MathRows:
    prompts: tuple[str, ...]
    answers: tuple[int, ...]
    num_read: int  # rows in the file
    dropped: dict[str, int]  # reason -> count; num_read == len(prompts) + sum(dropped)


def _lookup(row: dict, dotted: str):
    """row["a"]["b"] for "a.b"; raises KeyError if any part is missing."""
    value = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(dotted)
        value = value[part]
    return value


def _has(row: dict, dotted: str) -> bool:
    try:
        _lookup(row, dotted)
        return True
    except KeyError:
        return False


def _prompt_text(value) -> str | None:
    """A string prompt as is; a chat list -> content of its last user message."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        users = [m["content"] for m in value if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    return None


def read_rows(path: str | os.PathLike) -> list[dict]:
    """Rows of a .jsonl/.json-lines file or (with pyarrow) a .parquet file."""
    return [row for _, row in _located_rows(path)]


def _located_rows(path: str | os.PathLike) -> list[tuple[str, dict]]:
    """("<file>:<line>" or "<file> row <n>", row) of every row; a malformed one raises ValueError."""
    path = os.fspath(path)
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ImportError(
                f"reading {path!r} needs pyarrow (`pip install pyarrow`), which is not "
                "installed; or convert the file to JSONL"
            ) from e
        rows = [(f"{path} row {n}", row) for n, row in enumerate(pq.read_table(path).to_pylist())]
    elif path.endswith((".jsonl", ".json")):
        rows = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append((f"{path}:{lineno}", json.loads(line)))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{lineno}: malformed row, not JSON ({err.msg}); fix or delete the line") from None
    else:
        raise ValueError(f"{path=} must end in .jsonl, .json (JSON lines) or .parquet")
    for where, row in rows:
        if not isinstance(row, dict):
            raise ValueError(f"{where}: malformed row, a JSON {type(row).__name__} instead of an object")
    return rows


def load_math_rows(
    path: str | os.PathLike,
    *,
    prompt_key: str = "prompt",
    answer_key: str | None = None,
    max_prompt_chars: int | None = None,
    codec: TextCodec = CHAR,
    max_prompt_tokens: int | None = None,
) -> MathRows:
    """Prompts and integer ground truths of a local file.

    answer_key: a dotted column path; None tries DEFAULT_ANSWER_KEYS in order per row.
    max_prompt_chars / max_prompt_tokens: rows with longer prompts (in characters / in the
        tokens `codec.encode_prompt` gives the sampler) are dropped (counted as "too_long"),
        since the prompt pipeline refuses to truncate.
    codec: the tokenizer the prompts are for (the character tokenizer by default).
    Dropped (counted) rows: "not_integer" ground truth, "answer_out_of_int64", "bad_prompt"
    (neither a string nor a chat list with a user message), "unencodable" (text the codec
    cannot encode, e.g. non-ASCII for the character tokenizer), "too_long".
    """
    rows = _located_rows(path)
    prompts, answers = [], []
    dropped = dict.fromkeys(
        ("not_integer", "answer_out_of_int64", "bad_prompt", "unencodable", "too_long"), 0
    )
    for where, row in rows:
        keys = (answer_key,) if answer_key is not None else DEFAULT_ANSWER_KEYS
        key = next((k for k in keys if _has(row, k)), None)
        if key is None or not _has(row, prompt_key):
            raise KeyError(
                f"{where}: malformed row, it lacks {prompt_key=} or an answer column "
                f"among {keys}; its keys are {sorted(row)}"
            )
        answer = parse_integer(_lookup(row, key))
        prompt = _prompt_text(_lookup(row, prompt_key))
        if answer is None:
            reason = "not_integer"
        elif abs(answer) > _INT64_MAX:
            reason = "answer_out_of_int64"
        elif prompt is None:
            reason = "bad_prompt"
        elif not codec.is_encodable(prompt):
            reason = "unencodable"
        elif max_prompt_chars is not None and len(prompt) > max_prompt_chars:
            reason = "too_long"
        elif max_prompt_tokens is not None and len(codec.encode_prompt(prompt)) > max_prompt_tokens:
            reason = "too_long"
        else:
            prompts.append(prompt)
            answers.append(answer)
            continue
        dropped[reason] += 1
    return MathRows(tuple(prompts), tuple(answers), num_read=len(rows), dropped=dropped)
