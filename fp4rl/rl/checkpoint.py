"""Orbax checkpoints of a run: array state (params, optimizer, keys) plus JSON metadata.

The array state is stored as a flat dict of leaves (`leaf00000`, ...) and rebuilt with the
caller's treedef, so any pytree (nnx.State, optax states, typed PRNG keys as raw key data)
round-trips without orbax having to understand its node types. Metadata (step, data-iterator
states, the recipe, the configs) is JSON, readable without JAX.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp


def _to_leaves(tree) -> tuple[dict[str, np.ndarray], jax.tree_util.PyTreeDef]:
    leaves, treedef = jax.tree.flatten(tree)
    return {f"leaf{i:05d}": leaf for i, leaf in enumerate(leaves)}, treedef


class Checkpointer:
    """Save/restore (state pytree, metadata dict) at integer steps under `directory`."""

    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 2):
        self.directory = Path(directory).absolute()
        self._manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state, meta: dict) -> None:
        leaves, _ = _to_leaves(state)
        self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(leaves), meta=ocp.args.JsonSave(meta)))
        self._manager.wait_until_finished()  # a kill after save() returns never loses this step

    def restore(self, step: int, like):
        """(state with the structure of `like`, meta) saved at `step`."""
        leaves, treedef = _to_leaves(like)
        abstract = {k: jax.ShapeDtypeStruct(np.shape(v), v.dtype) for k, v in leaves.items()}
        restored = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
        )
        values = [restored.state[k] for k in sorted(leaves)]
        return jax.tree.unflatten(treedef, values), restored.meta

    def close(self) -> None:
        self._manager.close()
