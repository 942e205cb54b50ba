"""Multi-device execution on jax.sharding: a (data, expert) mesh and the data-parallel placement of
the trainer's and sampler's arrays (docs/parallel.md). The floor below the model: the MoE's expert
parallelism, which runs the model's own layers inside a `shard_map`, is `fp4rl.model.expert_parallel`."""
