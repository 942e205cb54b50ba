"""Orbax checkpoints of a run: array state (params, optimizer, keys) plus JSON metadata, verified.

The array state is stored as a flat dict of leaves (`leaf00000`, ...) and rebuilt with the
caller's treedef, so any pytree (nnx.State, optax states, typed PRNG keys as raw key data)
round-trips without orbax having to understand its node types. Metadata (step, data-iterator
states, the recipe, the configs) is JSON, readable without JAX.

Verification: damaged checkpoint files (a disk error, a copy cut short, files swapped by hand)
can restore without any error, with other values. So every step has `<step>.sha256.json`
beside its directory: SHA-256 digests of the leaves' bytes (with their names, dtypes and shapes)
and of the metadata, written before orbax commits the step, so that every committed step has
one. `restore` compares the restored values with them; `restore_latest` skips a bad or
unreadable step with a warning naming it and returns the newest good one (an error if none is).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp

from fp4rl.rl.run_dir import read_json, write_json_atomic

CHECKSUM_SUFFIX = ".sha256.json"


class CheckpointError(ValueError):
    """A saved step that cannot be trusted: unreadable, unverifiable, or not the bytes that were saved."""


class CheckpointWarning(UserWarning):
    """A bad checkpoint step was skipped in favour of an older one."""


class Restored(NamedTuple):
    step: int
    state: Any
    meta: dict
    skipped: tuple[str, ...]  # why each newer step was skipped


def _to_leaves(tree) -> tuple[dict[str, np.ndarray], jax.tree_util.PyTreeDef]:
    leaves, treedef = jax.tree.flatten(tree)
    return {f"leaf{i:05d}": leaf for i, leaf in enumerate(leaves)}, treedef


def _host(leaf) -> np.ndarray:
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    return np.asarray(leaf)


def _target_sharding(leaf):
    """Where a restored leaf goes: the layout of the caller's array (one device or a mesh), else
    None (a NumPy `like`: the saved layout)."""
    return leaf.sharding if isinstance(leaf, jax.Array) else None


def state_digest(leaves: dict[str, Any]) -> str:
    """SHA-256 over the leaves in name order: each one's name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for name in sorted(leaves):
        array = np.ascontiguousarray(_host(leaves[name]))
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def meta_digest(meta: dict) -> str:
    """SHA-256 of the metadata as it reads back from JSON (key order normalised)."""
    return hashlib.sha256(json.dumps(json.loads(json.dumps(meta)), sort_keys=True).encode()).hexdigest()


class Checkpointer:
    """Save/restore (state pytree, metadata dict) at integer steps under `directory`."""

    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 2):
        self.directory = Path(directory).absolute()
        self._manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
        )

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def _checksum_path(self, step: int) -> Path:
        return self.directory / f"{step}{CHECKSUM_SUFFIX}"

    def save(self, step: int, state, meta: dict) -> None:
        if step in self._manager.all_steps():
            raise CheckpointError(f"{self.directory / str(step)} exists already; a checkpoint step is never "
                                  "overwritten: delete it or write to another directory")
        leaves, _ = _to_leaves(state)
        write_json_atomic(self._checksum_path(step), {"step": step, "state_sha256": state_digest(leaves),
                                                      "meta_sha256": meta_digest(meta)})
        saved = self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(leaves),
                                                                 meta=ocp.args.JsonSave(meta)))
        if not saved:
            raise CheckpointError(f"orbax did not save step {step} under {self.directory} (save() returned False)")
        self._manager.wait_until_finished()  # a kill after save() returns never loses this step
        kept = {str(s) for s in self._manager.all_steps()}
        for path in self.directory.glob(f"*{CHECKSUM_SUFFIX}"):  # those of steps orbax has deleted
            if path.name.removesuffix(CHECKSUM_SUFFIX) not in kept:
                path.unlink()

    def restore(self, step: int, like):
        """(state with the structure of `like`, meta) saved at `step`, verified against its
        checksums; raises CheckpointError naming the step's path when it cannot be trusted."""
        path = self.directory / str(step)
        checksum_path = self._checksum_path(step)
        if not checksum_path.is_file():
            raise CheckpointError(f"{path} has no {checksum_path.name} (a save cut short, or written before "
                                  "checkpoints were verified): it cannot be verified")
        try:
            expected = read_json(checksum_path)
        except ValueError as err:
            raise CheckpointError(str(err)) from None
        leaves, treedef = _to_leaves(like)
        # `like` gives the target layout: a checkpoint saved on any mesh shape (or on one device)
        # restores straight onto this one (orbax reads each shard's slice).
        abstract = {k: jax.ShapeDtypeStruct(np.shape(v), v.dtype, sharding=_target_sharding(v)) for k, v in leaves.items()}
        try:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
            )
        except json.JSONDecodeError as err:
            raise CheckpointError(f"{path / 'meta'}: unreadable JSON ({err.msg} at line {err.lineno} column "
                                  f"{err.colno}): the checkpoint is damaged") from None
        except Exception as err:  # orbax/tensorstore raise many types for damaged files
            first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise CheckpointError(f"{path}: unreadable ({type(err).__name__}: {first_line})") from err
        values = {k: restored.state[k] for k in leaves}
        if state_digest(values) != expected["state_sha256"] or meta_digest(restored.meta) != expected["meta_sha256"]:
            raise CheckpointError(f"{path}: the restored values differ from the SHA-256 recorded in "
                                  f"{checksum_path.name} at save time: the checkpoint is damaged")
        return jax.tree.unflatten(treedef, [values[k] for k in sorted(leaves)]), restored.meta

    def restore_latest(self, like) -> Restored | None:
        """The newest step that restores and verifies (None when no step was saved). Each newer
        bad step is skipped with a `CheckpointWarning` naming it; no good step raises CheckpointError."""
        skipped = []
        for step in reversed(self.steps()):
            try:
                state, meta = self.restore(step, like)
            except CheckpointError as err:
                skipped.append(str(err))
                warnings.warn(f"skipping checkpoint step {step}: {err}; trying the previous step",
                              CheckpointWarning, stacklevel=2)
                continue
            return Restored(step, state, meta, tuple(skipped))
        if skipped:
            raise CheckpointError(f"{self.directory}: no good checkpoint step: " + " | ".join(skipped))
        return None

    def close(self) -> None:
        self._manager.close()
