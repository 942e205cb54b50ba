"""Programs and per-batch gradient summaries of the gradient measurements (`fp4rl.studies.gradients`).

- parameter groups: each leaf's membership in GROUPS (`policy.grad_group_masks`, plus "all");
- `Projection`: the linear per-batch summary whose inner products give the group Gram matrices
  (exact, or a CountSketch for large groups);
- `Programs`: jitted programs compiled ahead of their first call, on worker threads, and timed.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fp4rl.rl import policy

GROUPS = ("routed_experts", "shared_expert", "attention", "last_layers", "all")
F32 = jnp.float32


# ---------------------------------------------------------------------------------- parameter groups
def leaf_groups(params, num_layers: int) -> tuple[tuple[int, ...], ...]:
    """Per parameter leaf (tree order), the indices into GROUPS of the groups it belongs to."""
    masks = policy.grad_group_masks(params, num_layers)
    flags = [jax.tree.leaves(masks[g]) if g != "all" else [True] * len(jax.tree.leaves(params)) for g in GROUPS]
    return tuple(tuple(i for i, f in enumerate(flags) if f[leaf]) for leaf in range(len(flags[0])))


def group_sums(per_leaf: list, groups: tuple[tuple[int, ...], ...]) -> jax.Array:
    """[len(GROUPS)] sums of per-leaf scalars over each group's leaves."""
    return jnp.stack([sum((x for x, g in zip(per_leaf, groups) if i in g), F32(0)) for i in range(len(GROUPS))])


def group_dots(a, b, groups) -> jax.Array:
    return group_sums([jnp.vdot(x.astype(F32), y.astype(F32)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))], groups)


@dataclasses.dataclass(frozen=True)
class Projection:
    """A linear per-batch summary of a gradient whose inner products give the group Gram matrices.

    The leaves are partitioned into atoms by group membership (every group is a union of atoms,
    so a group's inner product is the sum of its atoms'). An atom with at most `sketch_dim`
    entries (any size when sketch_dim is 0) is kept exactly; a larger one becomes a CountSketch
    (Charikar et al. 2002): entry i adds sign_i * x_i to bucket h_i, which keeps inner products
    unbiased with a relative error of about 1/sqrt(sketch_dim) (of |x| |y|).
    """

    atoms: tuple[tuple[int, ...], ...]  # leaf indices of each atom
    atom_groups: tuple[tuple[int, ...], ...]  # GROUPS indices each atom belongs to
    sketch_dim: int
    sketched: tuple[bool, ...]

    @staticmethod
    def build(params, groups, sketch_dim: int, seed: int) -> tuple["Projection", list]:
        """(projection, hashes): hashes[a] is (buckets, signs) of a sketched atom, else None."""
        sizes = [x.size for x in jax.tree.leaves(params)]
        signatures = sorted(set(groups))
        atoms = tuple(tuple(i for i, g in enumerate(groups) if g == s) for s in signatures)
        hashes = []
        for a, leaves in enumerate(atoms):
            n = sum(sizes[i] for i in leaves)
            rng = np.random.default_rng([seed, a])
            hashes.append((jnp.asarray(rng.integers(0, sketch_dim, n), jnp.int32),
                           jnp.asarray(rng.choice(np.array([-1.0, 1.0], np.float32), n)))
                          if sketch_dim and n > sketch_dim else None)
        return Projection(atoms, tuple(signatures), sketch_dim, tuple(h is not None for h in hashes)), hashes

    def __call__(self, tree, hashes) -> list[jax.Array]:
        leaves = jax.tree.leaves(tree)
        out = []
        for leaf_ids, h in zip(self.atoms, hashes):
            v = jnp.concatenate([leaves[i].astype(F32).ravel() for i in leaf_ids])
            out.append(v if h is None else jax.ops.segment_sum(v * h[1], h[0], num_segments=self.sketch_dim))
        return out

    def group_gram(self, vectors_A: list[np.ndarray]) -> np.ndarray:
        """[len(GROUPS), B, B] float64 Gram matrices from per-atom [B, dim] arrays."""
        gram = np.zeros((len(GROUPS), vectors_A[0].shape[0], vectors_A[0].shape[0]))
        for v, member in zip(vectors_A, self.atom_groups):
            v = v.astype(np.float64)
            g = v @ v.T
            for i in member:
                gram[i] += g
        return gram


# ---------------------------------------------------------------------------------- programs
class Programs:
    """Jitted programs by key: registered with example arguments, compiled ahead (on worker
    threads when `workers` > 0, in registration order) and timed; a call waits for its compile."""

    def __init__(self, workers: int):
        self._pool = concurrent.futures.ThreadPoolExecutor(workers) if workers else None
        self._specs: dict = {}
        self._ready: dict = {}
        self.seconds: dict[str, float] = {}

    def add(self, key, label: str, fn: Callable, *example) -> None:
        if key in self._specs:
            return
        self._specs[key] = (jax.jit(fn), example, label)
        if self._pool is not None:
            self._ready[key] = self._pool.submit(self._compile, key)

    def _compile(self, key):
        jitted, example, label = self._specs[key]
        t0 = time.perf_counter()
        compiled = jitted.lower(*example).compile()
        self.seconds[label] = time.perf_counter() - t0
        return compiled

    def __call__(self, key, *args):
        if key not in self._ready:
            self._ready[key] = self._compile(key)
        ready = self._ready[key]
        if isinstance(ready, concurrent.futures.Future):
            ready = self._ready[key] = ready.result()
        return ready(*args)

    def close(self) -> None:
        """Stop the workers (programs not started yet are dropped: after an error, nothing waits)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
