"""The serving process's configuration, apart from the HTTP server.

`fp4rl.configs` imports it for `experiments.serve`'s defaults; keeping it out of `server` means
the training entry points (which import `fp4rl.configs`) never load the HTTP server.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from fp4rl.serving.engine import EngineConfig


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """checkpoint: a warm-up run, an RL arm directory or a Hugging Face directory (`checkpoints`).
    quantization / recipe: the deployment (`deployment`: recipe None takes the documented default).
    seed_index: which seed of an RL arm. model_name: the id clients send (None: the checkpoint
    directory's name and the quantization, e.g. `sft-nvfp4_online`). engine: batch shapes.
    max_wait_ms: how long the batcher holds a request for companions; max_queue: rows waiting
    before requests are refused with 503. impl: the quantizer implementation (`auto`: Triton
    kernels on a GPU, the jnp reference elsewhere). expert_gemm: the routed experts' grouped-GEMM
    backend ("": the checkpoint's, e.g. "packed_wgmma"; `checkpoints.with_expert_gemm`). log_level:
    `info` or `debug` logs every request, `warning` only failures."""

    checkpoint: str = "runs/cpu/sft"
    quantization: Literal["bf16", "mxfp8", "nvfp4_online"] = "nvfp4_online"
    recipe: str | None = None
    seed_index: int = 0
    model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    engine: EngineConfig = EngineConfig()
    max_wait_ms: float = 5.0
    max_queue: int = 1024
    impl: str = "auto"
    expert_gemm: str = ""
    log_level: str = "info"
