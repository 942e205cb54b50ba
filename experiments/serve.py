"""Serve a checkpoint over an OpenAI-compatible API, quantized at load time:
`python -m experiments.serve --checkpoint DIR [--quantization bf16|mxfp8|nvfp4_online] [--port N]`.

DIR: a warm-up run (`runs/cpu/sft`), an RL arm (`runs/cpu/rl/full`, `--seed_index K`) or a Hugging
Face Qwen-MoE directory. `--quantization` picks the deployment (fp4rl/serving/deployment.py: mxfp8 is
the FP8 deployment; nvfp4_online serves the checkpoint's NVFP4 training recipe, `full` for a BF16
checkpoint; `--recipe NAME` overrides). Batch shapes: `--engine.max_batch`, `--engine.prompt_buckets`,
`--engine.max_new_tokens`; batching window `--max_wait_ms`. Presets: `cpu` (the default values) and
`h200` (larger batches).

    curl -s localhost:8000/v1/completions -H 'content-type: application/json' \\
      -d '{"model": "sft-nvfp4_online", "prompt": "a=3. b=a+4. What is b?\\n", "max_tokens": 48, "temperature": 0}'

or with the `openai` client (streamed, with the sampled tokens' log-probs and a stop string):

    client = openai.OpenAI(base_url="http://localhost:8000/v1", api_key="unused")
    for chunk in client.completions.create(model="sft-nvfp4_online", prompt="a=3. b=a+4. What is b?\\n",
                                           max_tokens=48, stream=True, logprobs=0, stop=["\\n"]):
        print(chunk.choices[0].text, end="")
"""

from __future__ import annotations

import dataclasses

import jax

from fp4rl import configs
from fp4rl.config_cli import cli
from fp4rl.serving.server import ServeConfig, serve


def main(argv=None) -> None:
    config = cli(ServeConfig, configs.SERVE_PRESETS, argv)
    print(f"devices: {jax.devices()}")
    print(f"config: {dataclasses.asdict(config)}")
    serve(config)


if __name__ == "__main__":
    main()
