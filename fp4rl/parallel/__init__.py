"""Multi-device execution on jax.sharding: a (data, expert) mesh, data-parallel placement of the
trainer's and sampler's arrays, and expert parallelism of the MoE layer (docs/parallel.md)."""
