"""Where a run's arrays live on a (data, expert) mesh: batches split by rows, state replicated
except the routed-expert stacks, which are split along E over "expert".

Data parallelism is jit's: the trainer's and the sampler's programs are the single-device ones,
called under `jax.set_mesh(mesh)` with arguments placed here. XLA (GSPMD) propagates the row
split through everything but the routed experts, which run in a shard_map
(`fp4rl.model.expert_parallel`); the gradient of a weight used by every row is the all-reduce over
devices that XLA inserts. Placement never changes a value: `device_put` moves bytes.
"""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from fp4rl.parallel.mesh import DATA, EXPERT

ROWS = (DATA, EXPERT)  # the batch rows are split over every device
EXPERT_STACKS = ("gate_up", "down")  # the MoE's [E, K, N] weights (a dense/shared MLP's are 2-D)


def row_sharding(mesh, ndim: int, row_axis: int) -> NamedSharding:
    """Rows (axis `row_axis`) split over data x expert; a leaf without that axis is replicated."""
    if ndim <= row_axis:
        return NamedSharding(mesh, P())
    return NamedSharding(mesh, P(*([None] * row_axis), ROWS))


def place_rows(tree, mesh, row_axis: int):
    """Every leaf of `tree` with its axis `row_axis` split over the mesh's devices (e.g. row_axis=1
    for the trainer's [seeds, rows, ...] arrays)."""
    return jax.device_put(tree, jax.tree.map(lambda x: row_sharding(mesh, jax.numpy.ndim(x), row_axis), tree))


def is_expert_stack(path, ndim: int, lead: int) -> bool:
    """A routed-expert weight (or its optimizer moment): named gate_up/down with 3 axes after
    `lead` leading axes (the seed axis)."""
    names = [str(getattr(entry, "key", getattr(entry, "name", getattr(entry, "idx", "")))) for entry in path]
    return ndim == lead + 3 and any(n in EXPERT_STACKS for n in names) and "mlp" in names and "shared" not in names


def state_shardings(tree, mesh, lead: int = 0):
    """Replicated leaves, except expert stacks (params, Adam moments) split along E over "expert"."""
    def sharding(path, x):
        if is_expert_stack(path, jax.numpy.ndim(x), lead):
            return NamedSharding(mesh, P(*([None] * lead), EXPERT))
        return NamedSharding(mesh, P())

    return jax.tree_util.tree_map_with_path(sharding, tree)


def place_state(tree, mesh, lead: int = 0):
    return jax.device_put(tree, state_shardings(tree, mesh, lead))
