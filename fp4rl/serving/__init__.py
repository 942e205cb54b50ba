"""Online serving of trained checkpoints and the deployment-correlation evaluation.

checkpoints (load a warm-up, an RL arm or a Hugging Face directory) -> deployment (quantize at load
time with the trainer's weight sync) -> decode (the sampler's loop, per-row request parameters, cut
into chunks; the prompt's own log-probs) -> engine (fixed batch shapes compiled ahead) -> batcher
(concurrent requests into batches) -> protocol, chat, streaming and server (the OpenAI completions
and chat APIs, streamed as tokens are decoded or not, on the standard library's HTTP server).
ttft: time to first token of a streamed answer. deployment_eval and correlation: the same prompts
through several deployments, and how their scores agree.
Submodules are imported explicitly (`from fp4rl.serving import engine`).
"""
