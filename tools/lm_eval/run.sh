#!/usr/bin/env bash
# lm-evaluation-harness (`local-completions`) against `experiments.serve`, offline: the tasks of this
# folder (questions in arith.jsonl, read by the `json` loader; nothing is downloaded) on a Hugging
# Face Qwen3-MoE folder served as nvfp4_online, its log-likelihoods from echo + logprobs requests.
#
#   tools/lm_eval/run.sh [CHECKPOINT] [OUT]    (from the repository root, the project's venv active)
#
# CHECKPOINT: a Hugging Face folder with a tokenizer.json (default /tmp/qwen3, written by
# `python -m experiments.hf_local` when missing: random weights, so its scores are chance).
# OUT: lm_eval's --output_path (default results/lm_eval). LM_EVAL: the lm_eval executable, installed
# apart from the project (`python -m venv /tmp/lmeval-venv && /tmp/lmeval-venv/bin/pip install
# "lm-eval[api]" transformers`; default /tmp/lmeval-venv/bin/lm_eval). PORT: default 8765.
set -euo pipefail
CHECKPOINT=${1:-/tmp/qwen3}
OUT=${2:-results/lm_eval}
LM_EVAL=${LM_EVAL:-/tmp/lmeval-venv/bin/lm_eval}
PORT=${PORT:-8765}
MODEL=fp4rl-qwen3-nvfp4

[ -f "$CHECKPOINT/config.json" ] || python -m experiments.hf_local "$CHECKPOINT"
# Prompts of these tasks are under 64 tokens; generation asks for at most 8 (the tasks' max_gen_toks).
python -m experiments.serve --checkpoint "$CHECKPOINT" --quantization nvfp4_online --model_name "$MODEL" \
  --engine.prompt_buckets=64 --engine.max_new_tokens=8 --port "$PORT" --log_level=warning &
SERVER=$!
trap 'kill "$SERVER"; wait "$SERVER" || true' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do
  kill -0 "$SERVER" 2> /dev/null || { echo "the server exited" >&2; exit 1; }
  sleep 1
done
HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 "$LM_EVAL" --model local-completions \
  --model_args "model=$MODEL,base_url=http://127.0.0.1:$PORT/v1/completions,tokenizer_backend=huggingface,tokenizer=$CHECKPOINT,max_length=64,num_concurrent=4" \
  --tasks fp4rl_arith_mc,fp4rl_arith_gen --include_path tools/lm_eval --output_path "$OUT" --log_samples
