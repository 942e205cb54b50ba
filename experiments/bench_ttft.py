"""Time to first token against total time of a long streamed answer:
`python -m experiments.bench_ttft [--preset {smoke,h200}] [--serve.checkpoint DIR] [--max_tokens N]`.

Starts the server of `--serve.*` (the options of `experiments.serve`) in this process, then, as an
HTTP client on loopback, times greedy answers to `--prompt` streamed (first token, total) and not
(total) (fp4rl/serving/ttft.py). Default preset: `smoke`, whose warm-up is trained first when
missing; its numbers are CPU numbers, a functional check, not performance.
"""

from __future__ import annotations

import dataclasses
import sys

import jax

from fp4rl import configs
from fp4rl.config_cli import cli
from fp4rl.rl import sft
from fp4rl.serving import ttft
from fp4rl.serving.server import BackgroundServer, load_service


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not any(a == "--preset" or a.startswith("--preset=") for a in argv):
        argv = ["--preset", "smoke", *argv]
    config = cli(ttft.TTFTConfig, configs.SERVE_TTFT_PRESETS, argv)
    print(f"devices: {jax.devices()}")
    preset = next((name for name, p in configs.SERVE_TTFT_PRESETS.items()
                   if p.serve.checkpoint == config.serve.checkpoint), None)
    if preset is not None:
        sft.ensure_warmup(configs.warmup_config(preset, config.serve.checkpoint), preset)
    print(f"config: {dataclasses.asdict(config)}")
    service = load_service(config.serve)
    server = BackgroundServer(service).start()
    try:
        result = ttft.measure(server.url, service.name, config.prompt,
                              config.max_tokens or config.serve.engine.max_new_tokens, config.repeats)
    finally:
        server.stop()
        service.close()
    print(ttft.report(result, jax.default_backend(), config.serve.engine.decode_chunk))


if __name__ == "__main__":
    main()
