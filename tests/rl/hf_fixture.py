"""Local Hugging Face checkpoints and DAPO-Math-style data files for the RL tests, made in seconds.

`write_checkpoint(dir, model_type)`: random weights in the real Qwen3-MoE / Qwen2-MoE formats
(config.json, model.safetensors under HF's tensor names), a byte-level BPE tokenizer.json trained
here with `tokenizers` on a few hundred math strings, a ChatML template in tokenizer_config.json
and generation_config.json's stop ids (`<|im_end|>`, `<|endoftext|>`).

Random weights never write `\\boxed{N}` by chance, and the DAPO trainer drops every group whose
responses are all wrong, so a random policy would train on nothing. Two added tokens,
`\\boxed{4}` and `\\boxed{5}`, and a head that puts nearly all the probability on them and the
stop ids (through a constant component of every token's embedding, which the final norm keeps)
make about half the responses right for an answer of 4 or 5: groups of mixed reward, so updates
run. `write_rows(path, rows)`: a JSONL or parquet file in verl's DAPO-Math-17k format.
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
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_corpus(), trainer)
    tokenizer.add_tokens(list(ANSWER_TOKENS))
    return tokenizer


def hf_config(model_type: str, vocab_size: int, num_layers: int = 2) -> dict:
    common = {"model_type": model_type, "vocab_size": vocab_size, "hidden_size": 64, "num_hidden_layers": num_layers,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "moe_intermediate_size": 32,
              "num_experts_per_tok": 2, "norm_topk_prob": True, "hidden_act": "silu", "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": False,
              "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": 0.001, "dtype": "float32"}
    if model_type == "qwen3_moe":
        return {**common, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8, "head_dim": 16,
                "attention_bias": False}
    return {**common, "architectures": ["Qwen2MoeForCausalLM"], "num_experts": 8, "qkv_bias": True,
            "shared_expert_intermediate_size": 64}


def write_checkpoint(directory: Path, model_type: str = "qwen3_moe", seed: int = 0, template: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    tokenizer.save(str(directory / "tokenizer.json"))
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL + ANSWER_TOKENS}
    vocab = -(-tokenizer.get_vocab_size() // 64) * 64  # HF pads the embedding past the tokenizer, as Qwen does
    config = hf_config(model_type, vocab)
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
    head = np.zeros_like(tensors["lm_head.weight"])
    for token in ANSWER_TOKENS + ("<|im_end|>",):
        head[ids[token]] = rng.normal(0, 0.3, head.shape[1])
        head[ids[token], 0] = 4.0 if token != "<|im_end|>" else 3.6  # the answers a little likelier than the stop
    tensors["lm_head.weight"] = head
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def dapo_row(prompt: str, answer) -> dict:
    """A row of DAPO-Math-17k as verl stores it."""
    return {"data_source": "math_dapo", "prompt": [{"role": "user", "content": prompt}], "ability": "MATH",
            "reward_model": {"ground_truth": str(answer), "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": prompt[:8]}}


# Six rows: five with answer 4 or 5 (the answers the fixture's policy writes), one not an integer (dropped).
ROWS = [dapo_row("What is 2 + 2? Put the answer in \\boxed{}.", 4), dapo_row("Compute 5 * 1 - 0.", 5),
        dapo_row("Let $x = 2$. Find $x^2$.", 4), dapo_row("Solve for n: n - 1 = 4.", 5),
        dapo_row("What is 9 - 5?", 4), dapo_row("What is half of 1?", "1/2")]


def write_rows(path: Path, rows: list[dict] = ROWS) -> Path:
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
