"""Online serving of trained checkpoints and the deployment-correlation evaluation.

checkpoints (load a warm-up, an RL arm or a Hugging Face directory) -> deployment (quantize at load
time with the trainer's weight sync) -> decode (the sampler's loop, per-row request parameters) ->
engine (fixed batch shapes compiled ahead) -> batcher (concurrent requests into batches) -> protocol
and server (the OpenAI completions API, streamed or not, on the standard library's HTTP server).
deployment_eval and correlation: the same prompts through several deployments, and how their
scores agree.
Submodules are imported explicitly (`from fp4rl.serving import engine`).
"""
