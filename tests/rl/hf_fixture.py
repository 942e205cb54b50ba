"""The RL and serving tests' Hugging Face fixtures: `fp4rl.model.hf_local` at its `tiny` size."""

from fp4rl.model.hf_local import ANSWER_TOKENS, ROWS, dapo_row, write_checkpoint, write_rows

__all__ = ["ANSWER_TOKENS", "ROWS", "dapo_row", "write_checkpoint", "write_rows"]
