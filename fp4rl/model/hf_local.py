"""Hugging Face MoE checkpoints and DAPO-Math-style data files made locally, in seconds to minutes.

The paper's path (`experiments.rl --preset hf`) starts from a Hugging Face checkpoint and a
DAPO-Math-17k file; tests and GPU runs without network access use these instead:

`write_checkpoint(dir, model_type, size=...)`: random weights in the real Qwen3-MoE / Qwen2-MoE
formats (config.json, model.safetensors under HF's tensor names), a byte-level BPE tokenizer.json
trained here with `tokenizers` on a few hundred math strings, a ChatML template in
tokenizer_config.json and generation_config.json's stop ids (`<|im_end|>`, `<|endoftext|>`).
`SIZES` names the shapes: `tiny` for the CPU tests, `300m` (~320M parameters, ~95M active, 8k
positions) for a compiled GPU run of the preset.

Random weights never write `\\boxed{N}` by chance, and the DAPO trainer drops every group whose
responses are all wrong, so a random policy would train on nothing. Two added tokens,
`\\boxed{4}` and `\\boxed{5}`, and a head that puts nearly all the probability on them and the
stop ids (through a constant component of every token's embedding, which the final norm keeps)
make about half the responses right for an answer of 4 or 5: groups of mixed reward, so updates
run. `write_rows(path, rows)`: a JSONL or parquet file in verl's DAPO-Math-17k format;
`arithmetic_rows(n)` makes n rows whose answers are 4 or 5.

    python -m experiments.hf_local DIR [--size=300m] [--model_type=qwen3_moe] [--rows=FILE --num_rows=N]
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from fp4rl.model.hf import config_from_hf
from fp4rl.model.hf_export import hf_tensors
from fp4rl.model.transformer import init

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ANSWER_TOKENS = ("\\boxed{4}", "\\boxed{5}")
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
PROMPTS = ("What is {a} + {b}? Put the answer in \\boxed{{}}.", "Compute {a} * {b} - {b}.",
           "Let $x = {a}$. Find $x^2 + {b}$.", "Solve for n: n - {a} = {b}.")

# Model shapes by name: hidden size, layers, attention heads (query, key-value, head width), experts
# (count, width, per token), positions.
SIZES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                 shared_expert_intermediate_size=64, max_position_embeddings=256),
    "300m": dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                 intermediate_size=3072, moe_intermediate_size=384, num_experts=32, num_experts_per_tok=8,
                 shared_expert_intermediate_size=1024, max_position_embeddings=8192),
}


def _corpus() -> list[str]:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(300):
        a, b = (int(v) for v in rng.integers(0, 50, 2))
        lines.append(PROMPTS[i % len(PROMPTS)].format(a=a, b=b) + f" The answer is \\boxed{{{a + b}}}.")
    return lines


def train_tokenizer(vocab_size: int = 320) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_corpus(), trainer)
    tokenizer.add_tokens(list(ANSWER_TOKENS))
    return tokenizer


def _size(size: str) -> dict:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; valid sizes: {', '.join(SIZES)}")
    return SIZES[size]


def hf_config(model_type: str, vocab_size: int, size: str = "tiny") -> dict:
    shape = _size(size)
    common = {"model_type": model_type, "vocab_size": vocab_size, "hidden_act": "silu", "rms_norm_eps": 1e-6,
              "norm_topk_prob": True, "rope_theta": 10000.0, "tie_word_embeddings": False, "decoder_sparse_step": 1,
              "mlp_only_layers": [], "router_aux_loss_coef": 0.001, "dtype": "float32",
              **{k: shape[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                       "intermediate_size", "moe_intermediate_size", "num_experts_per_tok",
                                       "max_position_embeddings")}}
    if model_type == "qwen3_moe":
        return {**common, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": shape["num_experts"],
                "head_dim": shape["head_dim"], "attention_bias": False}
    if model_type == "qwen2_moe":  # head width = hidden / heads, as Qwen2-MoE defines it
        return {**common, "architectures": ["Qwen2MoeForCausalLM"], "num_experts": shape["num_experts"],
                "qkv_bias": True, "shared_expert_intermediate_size": shape["shared_expert_intermediate_size"]}
    raise ValueError(f"unknown model_type {model_type!r}; valid: qwen3_moe, qwen2_moe")


def write_checkpoint(directory: Path, model_type: str = "qwen3_moe", seed: int = 0, template: bool = True,
                     size: str = "tiny") -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    tokenizer.save(str(directory / "tokenizer.json"))
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL + ANSWER_TOKENS}
    vocab = -(-tokenizer.get_vocab_size() // 64) * 64  # HF pads the embedding past the tokenizer, as Qwen does
    config = hf_config(model_type, vocab, size)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "pad_token_id": ids["<|endoftext|>"]}))
    tokenizer_config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
                        **({"chat_template": CHATML} if template else {})}
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))

    graphdef, params = init(config_from_hf(config), seed)
    tensors = hf_tensors(graphdef, params)
    rng = np.random.default_rng(seed)
    tensors = {name: np.array(t) for name, t in tensors.items()}  # writable copies
    tensors["model.embed_tokens.weight"][:, 0] = 8.0  # a constant component: the head below reads it at every position
    # The final norm scales that component to about sqrt(hidden): the head's weights shrink by the
    # same factor, so every size gets the logits of the 64-wide model (factor 1 there).
    scale = 8.0 / np.sqrt(config["hidden_size"])
    head = np.zeros_like(tensors["lm_head.weight"])
    for token in ANSWER_TOKENS + ("<|im_end|>",):
        head[ids[token]] = rng.normal(0, 0.3 * scale, head.shape[1])
        head[ids[token], 0] = (4.0 if token != "<|im_end|>" else 3.6) * scale  # the answers a little likelier than the stop
    tensors["lm_head.weight"] = head
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def dapo_row(prompt: str, answer) -> dict:
    """A row of DAPO-Math-17k as verl stores it."""
    return {"data_source": "math_dapo", "prompt": [{"role": "user", "content": prompt}], "ability": "MATH",
            "reward_model": {"ground_truth": str(answer), "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": prompt[:8]}}


# Six rows: five with answer 4 or 5 (the answers the local policy writes), one not an integer (dropped).
ROWS = [dapo_row("What is 2 + 2? Put the answer in \\boxed{}.", 4), dapo_row("Compute 5 * 1 - 0.", 5),
        dapo_row("Let $x = 2$. Find $x^2$.", 4), dapo_row("Solve for n: n - 1 = 4.", 5),
        dapo_row("What is 9 - 5?", 4), dapo_row("What is half of 1?", "1/2")]


def arithmetic_rows(count: int, seed: int = 0) -> list[dict]:
    """`count` rows "What is a + b?" whose answers are 4 or 5 (so the local policy's groups have mixed rewards)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        answer = int(rng.integers(4, 6))
        a = int(rng.integers(0, answer + 1))
        rows.append(dapo_row(f"What is {a} + {answer - a}? Put the answer in \\boxed{{}}.", answer))
    return rows


def write_rows(path: Path, rows: list[dict] = ROWS) -> Path:
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
