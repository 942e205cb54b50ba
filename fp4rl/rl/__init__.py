"""RL on verifiable integer arithmetic (docs/rl.md): task generator, character tokenizer,
verifier, DAPO/GRPO objectives, grain pipelines (model-independent parts), sampler and
trainer.

Submodules are imported explicitly (`from fp4rl.rl import dapo`); nothing is imported
here, so that modules without a grain dependency stay importable where grain is not
installed (the GPU image, docs/design.md "Versions"): only `data` imports grain.
"""
