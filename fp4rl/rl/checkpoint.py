"""Orbax checkpoints of a run: array state (params, optimizer, keys) plus JSON metadata, verified.

The array state is stored as a flat dict of leaves (`leaf00000`, ...) and rebuilt with the
caller's treedef, so any pytree (nnx.State, optax states, typed PRNG keys as raw key data)
round-trips without orbax having to understand its node types. Metadata (the step, the recipe,
what the caller adds) is JSON, readable without JAX.

Verification: damaged checkpoint files (a disk error, a copy cut short, files swapped by hand)
can restore without any error, with other values. So every step has `<step>.sha256.json`
beside its directory: SHA-256 digests of the leaves' bytes (with their names, dtypes and shapes)
and of the metadata, written before orbax commits the step, so that every committed step has
one. `restore` compares the restored values with them; `restore_latest` skips a bad or
unreadable step with a warning naming it and returns the newest good one (an error if none is).

Recovery: a step is never overwritten, so a run that resumes from an older step first clears the
bad newer ones out of its way. A writer (the trainer, which saves those steps again) asks
`restore_latest(..., set_aside=True)` to move each bad step it skipped, and `set_aside_uncommitted`
to move each save orbax never committed (a kill mid-write leaves `<step>.orbax-checkpoint-tmp-*`),
with their checksums, to `damaged/<step>-<n>`: kept for inspection, never listed as a step (orbax
lists only directories named by a number), each move warned about and returned. A bad step moves
only once an older step has restored and verified: with no good step nothing moves and the run
stops, rather than a rerun starting over. Readers (the warm-up loader, serving) move nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp

from fp4rl.run_files import read_json, write_json_atomic

CHECKSUM_SUFFIX = ".sha256.json"
DAMAGED_DIR = "damaged"  # set-aside steps; not a number, so never taken for a step
# A step orbax has not committed: on a local disk a temporary name renamed to the number at commit;
# where a commit file marks it (cloud storage) the number itself, which orbax then does not list.
_STEP_DIR = re.compile(r"(0|[1-9][0-9]*)(" + re.escape(ocp.path.step.TMP_DIR_SUFFIX) + r".*)?")


class CheckpointError(ValueError):
    """A saved step that cannot be trusted: unreadable, unverifiable, or not the bytes that were saved."""


class CheckpointWarning(UserWarning):
    """A bad checkpoint step was skipped in favour of an older one, or moved aside."""


class SetAside(NamedTuple):
    """A bad or uncommitted step moved out of the step listing (kept, never read again)."""
    step: int
    moved: Path  # where it was
    to: Path  # where it is kept
    reason: str


class Restored(NamedTuple):
    step: int
    state: Any
    meta: dict
    skipped: tuple[str, ...]  # why each newer step was skipped
    set_aside: tuple[SetAside, ...] = ()  # with set_aside=True: what was moved to DAMAGED_DIR


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

    def restore_latest(self, like, set_aside: bool = False) -> Restored | None:
        """The newest step that restores and verifies (None when no step was saved). Each newer
        bad step is skipped with a `CheckpointWarning` naming it; no good step raises CheckpointError
        and moves nothing. `set_aside`: for a caller that saves the steps after the one returned
        again, the skipped steps are moved to DAMAGED_DIR (`set_aside`)."""
        skipped = []
        for step in reversed(self.steps()):
            try:
                state, meta = self.restore(step, like)
            except CheckpointError as err:
                skipped.append((step, str(err)))
                warnings.warn(f"skipping checkpoint step {step}: {err}; trying the previous step",
                              CheckpointWarning, stacklevel=2)
                continue
            moved = tuple(self.set_aside(s, why) for s, why in skipped) if set_aside else ()
            return Restored(step, state, meta, tuple(why for _, why in skipped), moved)
        if skipped:
            raise CheckpointError(f"{self.directory}: no good checkpoint step: " + " | ".join(why for _, why in skipped)
                                  + "; nothing was moved: put a good step back (from a copy) or delete the "
                                  "checkpoint directory to start over")
        return None

    def uncommitted(self) -> list[Path]:
        """The directories of saves orbax did not commit (it never lists them as steps)."""
        committed = {str(s) for s in self.steps()}
        return sorted(p for p in self.directory.iterdir()
                      if p.is_dir() and _STEP_DIR.fullmatch(p.name) and p.name not in committed)

    def set_aside_uncommitted(self) -> tuple[SetAside, ...]:
        """Move every uncommitted save to DAMAGED_DIR (`set_aside`): orbax would never read it, and
        the step it was saving is saved again."""
        return tuple(self.set_aside(int(_STEP_DIR.fullmatch(p.name).group(1)),
                                    "a save orbax never committed (cut short by a kill or a full disk)", p)
                     for p in self.uncommitted())

    def set_aside(self, step: int, reason: str, path: Path | None = None) -> SetAside:
        """Move step `step`'s directory (or `path`, an uncommitted save of it) with its checksums to
        `DAMAGED_DIR/<step>-<n>` (n: the first free number), so that the step can be saved again;
        warns naming both paths. The checksums stay where a committed step `step` still uses them."""
        path = self.directory / str(step) if path is None else Path(path)
        owns_checksums = path.name == str(step) or not (self.directory / str(step)).exists()
        damaged = self.directory / DAMAGED_DIR
        damaged.mkdir(exist_ok=True)
        n = 1
        while (damaged / f"{step}-{n}").exists() or (damaged / f"{step}-{n}{CHECKSUM_SUFFIX}").exists():
            n += 1
        to = damaged / f"{step}-{n}"
        os.rename(path, to)  # within one directory tree: atomic, nothing copied
        if owns_checksums and self._checksum_path(step).is_file():
            os.rename(self._checksum_path(step), damaged / f"{to.name}{CHECKSUM_SUFFIX}")
        self._manager.reload()
        warnings.warn(f"checkpoint step {step} moved aside and kept: {path} -> {to} ({reason})", CheckpointWarning,
                      stacklevel=2)
        return SetAside(step, path, to, reason)

    def close(self) -> None:
        self._manager.close()
