"""Digests of the programs an RL arm runs: is a later session's arm the same computation?

    JAX_PLATFORMS=cpu python tools/program_digest.py h200-chain bf16,full 4

A matrix spans sessions and commits. Per arm, this lowers the trainer's weight sync, sampler and
update programs (`fp4rl.rl.trainer.Trainer.lowerings`: the preset's shapes, N seeds, randomly
initialised parameters, no warm-up needed) and prints the SHA-256 of each lowered program's text (StableHLO,
without source locations). Equal digests at two commits: the arm's JAX program did not change
between them (a refactor that moves code but not the computation keeps them). The digests are of
this platform's lowering: on CPU the grouped GEMMs lower as `expert_gemm=xla`, so a change inside
a GPU kernel (pallas_kernels/) is not seen here; git shows those.
"""

import dataclasses
import hashlib
import sys
import tempfile
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fp4rl import configs  # noqa: E402
from fp4rl.model import init  # noqa: E402
from fp4rl.rl import sft, trainer  # noqa: E402


def digests(preset: str, arm: str, seeds: int, warmup) -> dict[str, str]:
    """{program: digest} of `arm` under `preset` with `seeds` vmapped seeds (`Trainer.lowerings`)."""
    config = dataclasses.replace(configs.RL_PRESETS[preset], arm=arm, seeds=seeds, out=tempfile.mkdtemp())
    run = trainer.Trainer(config, progress=False, warmup=warmup)
    return {name: hashlib.sha256(lower().as_text().encode()).hexdigest()[:16] for name, _, lower in run.lowerings()}


def main(preset: str = "h200-chain", arms: str = "bf16", seeds: str = "4") -> None:
    model_config = sft.model_config(configs.SFT_PRESETS[preset])
    graphdef, params = init(model_config, 0)
    warmup = (graphdef, params, {"model_config": dataclasses.asdict(model_config)})
    print(f"{preset}, {seeds} seeds, lowered on {jax.default_backend()}:")
    print("| arm | sync | sample | update |\n|---|---|---|---|")
    for arm in arms.split(","):
        d = digests(preset, arm, int(seeds), warmup)
        print(f"| {arm} | {d['sync']} | {d['sample']} | {d['update']} |", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
