"""The one place the model calls `qlinear.qdot`: site resolution, per-site keys, site records.

Every linear of the model (fused q|k|v, o, dense MLP, routed experts, shared expert and its
gate, router, LM head) goes through `site_dot`, which resolves the layer's `SiteConfig` from the
recipe (so selective high precision is decided here and nowhere else), derives the site's
key for the quantized backward, and calls `qdot`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import jax

from fp4rl import qlinear
from fp4rl.recipe import PrecisionRecipe, SiteConfig

# A fixed slot per linear of a layer, folded into the key: the keys of two sites never collide
# and do not depend on trace order (adding a site elsewhere leaves the others' keys unchanged).
SLOTS = {
    "qkv": 0, "o": 1, "mlp.gate_up": 2, "mlp.down": 3, "router": 4,
    "experts.gate_up": 5, "experts.down": 6, "shared.gate_up": 7, "shared.down": 8,
    "shared_gate": 9, "lm_head": 10,
}

_RECORDERS: list[list] = []


@dataclasses.dataclass(frozen=True)
class SiteRecord:
    """One linear as traced: where it is and the SiteConfig that `qdot` received."""

    kind: str
    layer: int | None
    name: str
    site: SiteConfig
    prequantized: bool


@contextlib.contextmanager
def record_sites():
    """Collect a `SiteRecord` for every linear traced inside the block (trace time only).

    For tests and precision maps: `with record_sites() as log: jax.eval_shape(forward, ...)`.
    """
    log: list[SiteRecord] = []
    _RECORDERS.append(log)
    try:
        yield log
    finally:
        _RECORDERS.remove(log)


@dataclasses.dataclass(frozen=True)
class Ctx:
    """What every layer needs to run its linears (a trace-time object, never a jit argument).

    key: the forward's jax.random key or None; `site_key` folds the layer and slot into it.
    layer_shift: added to a module's static layer index for the key only (int or traced int32).
      A scanned run of identical layers traces the run's first block once; the shift makes each
      iteration fold in its own layer, so keys equal those of the unrolled model.
    scan_layers: run each maximal run of identical layers (`transformer.layer_runs`) as one
      `lax.scan` (compile time independent of depth) instead of unrolling every layer.
    remat: rematerialise each layer in the backward (`transformer.run_blocks`).
    attention_query_chunk: queries per chunk of the cache-free attention (0: all at once;
      `layers.attend_by_query_chunks`).
    """

    recipe: PrecisionRecipe
    num_layers: int
    impl: str
    key: Any = None
    layer_shift: Any = 0
    scan_layers: bool = True
    remat: bool = False
    attention_query_chunk: int = 0

    def site(self, kind: str, layer: int | None) -> SiteConfig:
        return self.recipe.site(kind, layer, self.num_layers)

    def site_key(self, layer: int | None, name: str):
        # Layer -1 is the head (outside the layer stack); +1 keeps every fold-in value >= 0.
        key = jax.random.fold_in(self.key, 0 if layer is None else layer + self.layer_shift + 1)
        return jax.random.fold_in(key, SLOTS[name])


def site_dot(x, w, ctx: Ctx, kind: str, layer: int | None, name: str, *, group_sizes=None, padding_rows: bool = False,
             gemm: str = "xla"):
    """`x @ w` through the recipe's site `kind` of `layer` (None: the LM head).

    `w` is a raw parameter, or a weight pre-quantized by `sync_weights` (forward only).
    A key is needed only when the site quantizes its backward (stochastic rounding + RHT).
    `gemm`: the ragged layout's grouped-GEMM backend (`ModelConfig.expert_gemm`).
    """
    site = ctx.site(kind, layer)
    prequantized = qlinear.is_quantized_weight(w)
    for log in _RECORDERS:
        log.append(SiteRecord(kind, layer, name, site, prequantized))
    key = None
    if site.quantized and site.backward == "quantized" and not prequantized:
        if ctx.key is None:
            raise ValueError(
                f"recipe {ctx.recipe.name!r} runs site {kind!r} (layer {layer}, {name}) with "
                "backward='quantized' (stochastic rounding + random Hadamard), which needs "
                "forward(..., key=jax.random.key(seed))"
            )
        key = ctx.site_key(layer, name)
    try:
        return qlinear.qdot(x, w, site, key=key, group_sizes=group_sizes, impl=ctx.impl, padding_rows=padding_rows,
                           gemm=gemm)
    except ValueError as err:  # name the site: qdot's shape errors do not know where they are
        raise ValueError(f"site {kind!r} (layer {layer}, {name}): {err}") from err
